"""``adec run experiments/configs/NAME.yaml``: run a declarative experiment (resumable, tracked)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run a declarative experiment (YAML): tasks x strategies x seeds",
        description=(
            "Validate the whole experiment file, then evaluate every cell (task x strategy x seed) that "
            "is not finished yet in <out>/<name>/: per-sample JSONL and summary.json per cell, "
            "summary.md/.csv/.json for the run, W&B logging (offline by default) with the config "
            "attached. Re-running the same command resumes: finished cells are never recomputed.\n\n"
            "Examples:\n"
            "  adec run experiments/configs/smoke.yaml --wandb disabled\n"
            "  adec run experiments/configs/benchmark.yaml --out runs/ --resume\n"
            "  adec run experiments/configs/smoke.yaml --procs 2            # 2 CPU processes (gloo)\n"
            "  torchrun --nproc_per_node 8 -m adaptive_decoding.framework.cli run experiments/configs/llada_multigpu.yaml"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("experiment", help="experiment YAML file (see docs/experiments.md)")
    p.add_argument("--out", default="runs", help="parent of the run folder (default: runs/)")
    p.add_argument("--wandb", default=os.environ.get("WANDB_MODE", "offline") if os.environ.get("WANDB_MODE")
                   in ("offline", "online", "disabled") else "offline", choices=("offline", "online", "disabled"),
                   help="W&B mode (default: offline; online needs a key)")
    p.add_argument("--resume", action="store_true", help="require an existing run folder and continue it")
    p.add_argument("--overwrite", action="store_true",
                   help="recompute every cell (the old cells are moved to cells.old-<time>/, nothing is deleted)")
    p.add_argument("--max-cells", type=int, default=None, help="stop after evaluating this many cells")
    p.add_argument("--procs", type=int, default=1,
                   help="local processes sharing each cell's prompts (gloo on CPU; default: 1). Under torchrun "
                        "the process group comes from the environment instead")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a top-level key of the file, e.g. --set n=20 --set seeds=[0,1]")
    p.add_argument("--prepare", action="store_true",
                   help="first run the 'prepare' command of every strategy whose file (tuned YAML, policy) is missing")
    p.add_argument("--check", action="store_true", help="validate the file and list its cells, run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--report", metavar="DIR", default=None, help="also write the report into DIR (e.g. docs/)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.experiments.distributed import init_from_env, spawn
    from adaptive_decoding.experiments.options import ExperimentOptions
    from adaptive_decoding.experiments.parse import load_experiment
    from adaptive_decoding.experiments.runner import run_experiment
    from adaptive_decoding.experiments.spec import ExperimentError
    from adaptive_decoding.experiments.workers import run_experiment_worker
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.core.params import parse_assignments

    if args.resume and args.overwrite:
        raise CLIError("--resume and --overwrite exclude each other")
    if args.procs < 1:
        raise CLIError(f"--procs={args.procs} must be ≥ 1")
    overrides = parse_assignments(args.sets) if args.sets else None
    command = "adec " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["run"] else \
        f"adec run {args.experiment}"
    if args.prepare:
        _prepare(args.experiment, overrides)
    try:
        exp = load_experiment(args.experiment, overrides=overrides)
    except ExperimentError as exc:
        print(f"adec run: error: {exc}", file=sys.stderr)
        return 2
    cells = exp.cells()
    if args.check:
        print(f"{exp.source}: valid; {len(cells)} cells ({len(exp.tasks)} tasks x {len(exp.strategies)} strategies "
              f"x {len(exp.seeds)} seeds)")
        for c in cells:
            print(f"  {c.id}  [{c.kind}] {c.describe()}")
        return 0
    dist = init_from_env()
    if dist.world_size > 1 and args.procs > 1:
        raise CLIError("--procs is for local runs; under torchrun the number of processes is --nproc_per_node")
    options = ExperimentOptions.from_flat({
        "resume": args.resume, "overwrite": args.overwrite, "max_cells": args.max_cells, "command": command,
        "wandb_mode": args.wandb if dist.is_main else "disabled", "progress": not args.no_progress})
    if args.procs > 1:
        res = spawn(run_experiment_worker, args.procs, args.experiment, args.out, options, overrides)
    else:
        res = run_experiment(exp, args.out, options, dist=dist)
    if not dist.is_main:
        return 0
    print(f"adec run: {res.run_dir}: {len(res.evaluated)} cells evaluated, {len(res.reused)} reused, "
          f"{len(res.rows)} of {len(cells)} finished" + (" (stopped at --max-cells)" if res.interrupted else ""),
          file=sys.stderr)
    print((res.run_dir / "summary.md").read_text())
    if args.report:
        from adaptive_decoding.experiments.report import write_report

        out = write_report([res.run_dir], args.report, command=f"adec report --runs {res.run_dir} --out {args.report}")
        print(f"adec run: report written to {out['markdown']}", file=sys.stderr)
    return 0


def _prepare(path: str, overrides: "dict | None") -> None:
    """Run each missing file's ``prepare`` command once (``adec ...`` runs with this interpreter)."""
    import subprocess

    from adaptive_decoding.experiments.parse import load_experiment
    from adaptive_decoding.framework.cli.errors import CLIError

    probe = load_experiment(path, overrides={**(overrides or {}), "on_missing": "skip"})
    commands = list(dict.fromkeys(prep for *_, prep in probe.skipped if prep))
    missing = [(p, t) for p, t, _, prep in probe.skipped if not prep]
    if missing:
        print(f"adec run --prepare: no prepare command for {', '.join(f'{p} (task {t})' for p, t in missing)}",
              file=sys.stderr)
    for i, cmd in enumerate(commands, 1):
        argv = shlex.split(cmd)
        if argv and argv[0] == "adec":
            argv = [sys.executable, "-m", "adaptive_decoding.framework.cli", *argv[1:]]
        print(f"adec run --prepare [{i}/{len(commands)}]: {cmd}", file=sys.stderr, flush=True)
        if subprocess.call(argv) != 0:
            raise CLIError(f"prepare command failed: {cmd}")
