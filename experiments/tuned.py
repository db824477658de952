"""Strategies tuned inside an experiment: a strategy with ``tune:`` has its controller's parameters
searched by Optuna on each task's validation split (f₁ accuracy ↑, f₂ mean NFE ↓, the point with the
fewest NFE within ``max_drop`` of one-token-per-step decoding; :mod:`adaptive_decoding.framework.tuning.study`) before
its cells run, on the experiment's own model, so a tuned row needs no separate ``adec tune`` run.

```yaml
- label: margin_topk (tuned)
  controller: margin_topk
  params: {k_max: 8}                     # held fixed
  tune: {n_trials: 20, n_val: 64, space: {eta: "0.9:0.999", k_base: [1, 4]}}
```

``space`` replaces the declared range of each named parameter (dotted names reach nested
controllers), checked against the parameter's own bounds when the file is read. The study and the
exported point live in the run folder's ``tuned/`` (SQLite), one per (strategy, task): an interrupted
run resumes the study, a finished one reuses the point, and every seed's cell uses the same point.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from adaptive_decoding.experiments.spec import TUNE_DEFAULTS, TUNE_KEYS, Cell


def normalise_space(space: Any) -> dict[str, str]:
    """``{name: "LOW:HIGH" | [LOW, HIGH]}`` as ``{name: "LOW:HIGH"}``; anything else raises ValueError."""
    if not isinstance(space, dict):
        raise ValueError(f"{space!r} is not allowed; allowed: a mapping {{name: 'LOW:HIGH' or [LOW, HIGH]}}")
    out = {}
    for name, rng in space.items():
        if isinstance(rng, (list, tuple)) and len(rng) == 2:
            rng = f"{rng[0]}:{rng[1]}"
        if not isinstance(rng, str) or ":" not in rng:
            raise ValueError(f"{name}: {rng!r} is not allowed; allowed: 'LOW:HIGH' or [LOW, HIGH]")
        out[str(name)] = rng
    return out


def check_tune(raw: Any, cls: Optional[type], fixed: dict) -> tuple[Optional[dict], list[tuple[str, str]]]:
    """A strategy's ``tune:`` mapping with defaults filled, and its problems as ``(key, message)``;
    ``cls`` is the controller's class (``None`` when unknown, then only the keys are checked)."""
    from adaptive_decoding.framework.core.params import ParameterError
    from adaptive_decoding.framework.tuning.options import TuneEvaluation, TuneSearch
    from adaptive_decoding.framework.tuning.space import tuned_space

    if not isinstance(raw, dict):
        return None, [("", f"{raw!r} is not allowed; allowed: a mapping with keys {', '.join(TUNE_KEYS)}")]
    problems = [(k, f"unknown key; allowed: {', '.join(TUNE_KEYS)}") for k in raw if k not in TUNE_KEYS]
    tune = {**TUNE_DEFAULTS, **{k: v for k, v in raw.items() if k in TUNE_KEYS}}
    for key in ("n_trials", "n_val"):
        if not isinstance(tune[key], int) or isinstance(tune[key], bool) or tune[key] < 1:
            problems.append((key, f"{tune[key]!r} is not allowed; allowed: an integer ≥ 1"))
    declared = {**TuneSearch.params, **TuneEvaluation.params}  # the values the study's options declare
    for key in ("max_drop", "prune_margin", "seed"):
        try:
            tune[key] = declared[key].check("tune", key, tune[key])
        except ParameterError as exc:
            problems.append((key, str(exc)))
    try:
        tune["space"] = normalise_space(tune["space"])
        if cls is not None:
            tuned_space(cls, dict(fixed), tune["space"])
    except (ValueError, ParameterError) as exc:
        problems.append(("space", str(exc)))
    return tune, problems


def study_name(cell: Cell) -> str:
    """One study per (strategy, task): a file-safe name from the strategy's label and the task's key."""
    from adaptive_decoding.framework.tuning.study import safe_study_name

    return safe_study_name(f"{cell.strategy.label}-{cell.task.key}")[:96]


def tuned_cell(cell: Cell, loaded: Any, task: Any, folder: Path, batch_size: int, dist: Any = None) -> Cell:
    """``cell`` with its parameters replaced by the point tuned for its task, running the study first
    when the point is not in ``folder`` yet (rank 0 only; the other ranks wait)."""
    tune = cell.strategy.tune or {}
    name = study_name(cell)
    path = Path(folder) / f"{name}.yaml"
    if not path.is_file() and (dist is None or dist.is_main):
        from adaptive_decoding.framework.tuning.study import tune_controller

        tune_controller(cell.controller, task.name, tune_options(tune, cell, folder, name, batch_size),
                        task_params=task.get_params(), loaded=loaded)
    if dist is not None:
        dist.barrier()
    return replace(cell, params=tuned_params(path))


def tune_options(tune: dict, cell: Cell, folder: Path, name: str, batch_size: int) -> Any:
    """The study's :class:`~adaptive_decoding.framework.tuning.options.TuneOptions`, built from the strategy's ``tune:``
    mapping (validated, with its defaults) and the cell: its fixed parameters and decoding options."""
    from adaptive_decoding.framework.tuning.options import TuneOptions

    return TuneOptions.from_dict({
        "search": {"n_trials": tune["n_trials"], "seed": tune["seed"], "fixed": dict(cell.params),
                   "ranges": dict(tune["space"]), "prune_margin": tune["prune_margin"]},
        "evaluation": {"n_val": tune["n_val"], "n_test": 0, "batch_size": batch_size, "max_drop": tune["max_drop"],
                       "decode": dict(cell.decode)},
        "study": {"study_name": name},
        "output": {"out_dir": str(folder), "plot": True},
    })


def tuned_params(path: Path) -> dict:
    """The controller parameters of an exported point (``adec tune``'s YAML file)."""
    import yaml

    return dict((yaml.safe_load(Path(path).read_text()) or {}).get("params") or {})
