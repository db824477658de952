"""Installed from its wheel, the framework imports as ``adaptive_decoding.*`` and leaves the names of a
user's own packages alone.

A research project commonly has its own ``experiments/`` or ``framework/`` package. The test builds
the wheel (not the editable install the checkout uses), installs it into a folder, and runs, from a
temporary project with its own ``experiments`` and ``framework`` packages, what a notebook would: it
imports the user's packages and the framework's side by side and runs an experiment through the
Python API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("framework", "controllers", "scorers", "experiments")

NOTEBOOK = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import experiments, framework                      # the user's own packages
    assert experiments.OWNER == framework.OWNER == "user", "the user's packages were shadowed"

    import adaptive_decoding.framework as adf
    from adaptive_decoding.experiments import ExperimentOptions, parse_experiment, run_experiment

    assert Path(adf.__file__).is_relative_to(sys.argv[1]), adf.__file__
    exp = parse_experiment({
        "name": "nb", "device": "cpu", "n": 4, "batch_size": 4, "seeds": [0], "metrics": ["exact_match"],
        "model": {"factory": "adaptive_decoding.experiments.cells:toy_model", "kwargs": {"task": "{task}"}},
        "tasks": ["addition"],
        "strategies": [{"label": "seq", "controller": "sequential"},
                       {"label": "fd", "controller": "fast_dllm", "params": {"threshold": 0.9}}],
    })
    result = run_experiment(exp, "runs", ExperimentOptions.from_flat({"wandb_mode": "disabled", "progress": False}))
    print(json.dumps({"cells": len(result.evaluated), "labels": sorted(r["strategy"] for r in result.rows),
                      "user": experiments.__file__}))
""")


def _build_wheel(tmp: Path) -> Path:
    """Build the wheel from a copy of the sources, so the checkout gets no build/ or egg-info."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "studies"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, text=True)
    (wheel,) = (tmp / "dist").glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(tmp)
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True)
    return site


def test_a_notebook_in_a_project_with_its_own_experiments_and_framework_runs_an_experiment(installed, tmp_path):
    project = tmp_path / "project"
    for own in ("experiments", "framework"):
        (project / own).mkdir(parents=True)
        (project / own / "__init__.py").write_text('OWNER = "user"\n')
    (project / "notebook.py").write_text(NOTEBOOK)
    env = {**os.environ, "PYTHONPATH": str(installed), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "notebook.py", str(installed)], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"cells": 2, "labels": ["fd", "seq"], "user": str(project / "experiments" / "__init__.py")}
    assert (project / "runs" / "nb" / "summary.json").is_file()


def test_the_wheel_installs_only_under_the_namespace(installed):
    tops = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
    assert tops - {"bin"} == {"adaptive_decoding"}
    pkg = installed / "adaptive_decoding"
    assert sorted(p.name for p in pkg.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(FOLDERS)
    assert (pkg / "framework" / "models" / "weights" / "tiny-sudoku9" / "model.pt").is_file()
    assert (pkg / "framework" / "learning" / "policies" / "sudoku9-set-peer.pt").is_file()
    assert (pkg / "experiments" / "configs" / "benchmark.yaml").is_file()
    assert not (pkg / "experiments" / "studies").exists()
