"""Running an experiment: cells in order, resumable (a finished cell is never recomputed),
per-sample JSONL, a summary table, machine info, W&B (offline by default).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from adaptive_decoding.experiments.cells import (
    compute_cell_metrics,
    evaluate_cell,
    load_any_model,
    resolve_device,
)
from adaptive_decoding.experiments.options import ExperimentOptions
from adaptive_decoding.experiments.parse import load_experiment
from adaptive_decoding.experiments.spec import Cell, Experiment, TaskSpec, model_label
from adaptive_decoding.experiments.tables import figure, markdown_table
from adaptive_decoding.framework.core.options import RunLogging


# ====================================================================== the run folder
def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, torch / Python versions and GPUs, for the report."""
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu or "unknown", "cores": os.cpu_count(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "platform": platform.platform(), "cuda": torch.cuda.is_available(),
    }
    try:
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def read_samples(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


SUMMARY_COLUMNS = ("task", "strategy", "kind", "seed", "n", "quality_metric", "quality", "accuracy", "nfe",
                   "tpf", "ms_per_token", "peak_mem_mb", "lookahead", "cell")


def summary_markdown(rows: list[dict]) -> str:
    """The run's cells as a markdown table: one row per (task, strategy, seed)."""
    metric_names = sorted({m for r in rows for m in (r.get("metrics") or {})})
    head = ["task", "strategy", "kind", "seed", "n", "accuracy", *metric_names, "NFE", "tok/fwd", "ms/tok",
            "peak MB"]
    body = [[r["task"], r["strategy"], r["kind"], r["seed"], r["n"], figure(r["accuracy"]),
             *(figure((r.get("metrics") or {}).get(m)) for m in metric_names),
             figure(r["nfe"], 2), figure(r["tpf"], 2), figure(r["ms_per_token"], 3), figure(r["peak_mem_mb"], 1)]
            for r in rows]
    return "\n".join(markdown_table(head, body)) + "\n"


@dataclass
class RunResult:
    """What :func:`run_experiment` did: the folder, the summary rows, the cells evaluated and skipped."""

    run_dir: Path
    rows: list[dict]
    evaluated: list[str]
    reused: list[str]
    interrupted: bool = False


def _init_wandb(log: RunLogging, exp: Experiment, run_dir: Path, n_cells: int) -> Any:
    """The experiment's W&B run in ``log.wandb_mode`` (``None`` when disabled or when W&B fails), its
    config the experiment, its source, the cell count and ``log.run_config``."""
    if log.wandb_mode == "disabled":
        return None
    try:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        run_id = "exp-" + hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
        return wandb.init(project="adaptive-decoding", name=exp.name, id=run_id, resume="allow",
                          mode=log.wandb_mode, dir=str(run_dir), job_type="experiment",
                          config={"experiment": exp.raw, "source": exp.source, "cells": n_cells,
                                  **(log.run_config or {})})
    except Exception as exc:  # noqa: BLE001 - tracking must never lose results
        print(f"adec run: W&B logging disabled ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def run_experiment(exp: "Experiment | str | os.PathLike", out_dir: "str | os.PathLike" = "runs",
                   options: Optional[ExperimentOptions] = None, *, dist: Any = None) -> RunResult:
    """Run every unfinished cell of ``exp`` into ``<out_dir>/<name>/`` (see the module docstring).

    Args:
        options: :class:`~adaptive_decoding.experiments.options.ExperimentOptions` (default every default): ``cells``
            (``resume``: require an existing run folder, fail if there is none; ``overwrite``:
            recompute every cell, finished cells are moved to ``cells.old-<time>/``; ``max_cells``:
            stop after evaluating this many cells, a deliberate partial run; ``command``: the
            command line, recorded for the report) and ``logging`` (``wandb_mode``, ``progress``,
            ``run_config`` merged into the W&B run's config).
        dist: a :class:`adaptive_decoding.experiments.distributed.DistContext`; rank 0 writes, every rank decodes its shard.
    """
    from adaptive_decoding.experiments.distributed import DistContext

    opts = (options if options is not None else ExperimentOptions()).validate()
    run, log = opts.cells, opts.logging
    if not isinstance(exp, Experiment):
        exp = load_experiment(exp)
    dist = dist or DistContext()
    run_dir = Path(out_dir) / exp.name
    cells_dir = run_dir / "cells"
    if run.resume and not run_dir.is_dir():
        raise FileNotFoundError(f"--resume: no run folder {str(run_dir)!r} to resume")
    if dist.is_main:
        _prepare_run_dir(exp, run_dir, run.overwrite, dist.world_size, run.command)
    dist.barrier()

    cells = exp.cells()
    done, todo = _finished_cells(cells, cells_dir, run_dir, dist)
    wb = _init_wandb(log, exp, run_dir, len(cells)) if dist.is_main else None
    bar = _progress_bar(exp.name, len(cells), len(done)) if dist.is_main and log.progress else None
    interrupted = False
    device = resolve_device(exp.device, dist.local_rank)
    loop = _CellLoop(exp, dist, cells_dir, device, run.max_cells, bar, wb)
    try:
        # finished cells: add metrics requested since and take curve and kind, from the stored samples
        if dist.is_main:
            for cell in cells:
                if cell.id in done:
                    _refresh_finished(cell, cells_dir / cell.id, loop.tasks, device)
        interrupted = _run_cells(todo, loop)
    finally:
        if bar is not None:
            bar.close()
        rows = _write_summary(exp, cells, cells_dir, run_dir) if dist.is_main else []
        if wb is not None:
            _finish_wandb(wb, rows)
    return RunResult(run_dir=run_dir, rows=rows, evaluated=loop.evaluated,
                     reused=[c for c in done if c in {x.id for x in cells}] + loop.late, interrupted=interrupted)


def _progress_bar(name: str, total: int, done: int) -> Any:
    """A tqdm bar over the experiment's cells, starting at the finished ones."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=name, unit="cell", dynamic_ncols=True)


def _prepare_run_dir(exp: Experiment, run_dir: Path, overwrite: bool, world_size: int,
                     command: Optional[str]) -> None:
    """Rank 0: make ``cells/`` (moving the finished ones aside when ``overwrite``) and record the
    experiment, the machine, the skipped strategies and this invocation."""
    cells_dir = run_dir / "cells"
    if overwrite and cells_dir.is_dir():
        os.replace(cells_dir, run_dir / f"cells.old-{time.strftime('%Y%m%d-%H%M%S')}")
    cells_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(run_dir / "experiment.yaml", yaml.safe_dump(exp.raw, sort_keys=False, allow_unicode=True))
    env = machine_info()
    env["world_size"] = world_size
    _write_atomic(run_dir / "environment.json", json.dumps(env, indent=2) + "\n")
    labels = {st.path: st.label for st in exp.strategies}
    _write_atomic(run_dir / "skipped.json", json.dumps(
        [{"strategy": labels.get(p, p), "path": p, "task": t, "reason": m, "prepare": c}
         for p, t, m, c in exp.skipped], indent=2) + "\n")
    with open(run_dir / "invocations.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command or "",
                             "source": exp.source, "world_size": world_size}) + "\n")


def _finished_cells(cells: list[Cell], cells_dir: Path, run_dir: Path, dist: Any) -> tuple[list[str],
                                                                                           list[Cell]]:
    """The ids of the cells already finished (rank 0's view, broadcast) and the cells still to run;
    rank 0 says so and warns of finished cells whose input files changed since."""
    done = [c.id for c in cells if (cells_dir / c.id / "summary.json").is_file()]
    done = dist.broadcast(done)
    todo = [c for c in cells if c.id not in set(done)]
    if dist.is_main and done:
        print(f"adec run: {run_dir}: {len(done)} of {len(cells)} cells already finished; running "
              f"the other {len(todo)} (use --overwrite to recompute)", file=sys.stderr)
        for c in cells:
            for path in (stale_inputs(c.params, cells_dir / c.id / "summary.json") if c.id in done else []):
                print(f"adec run: warning: cell {c.id} finished before {path} changed: its figures are from "
                      f"the earlier file (delete {cells_dir / c.id} or use --overwrite to recompute)",
                      file=sys.stderr)
    return done, todo


@dataclass
class _CellLoop:
    """What evaluating the unfinished cells needs: the experiment, the process group, where cells are
    written, the device, the cell limit, the progress bar and the W&B run; it collects the tasks
    loaded so far, the ids this process evaluated (``evaluated``) and the ids another process
    finished first (``late``)."""

    exp: Experiment
    dist: Any
    cells_dir: Path
    device: Any
    max_cells: Optional[int]
    bar: Any
    wb: Any
    tasks: dict[str, Any] = field(default_factory=dict)
    evaluated: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)


def _finished_meanwhile(cell: Cell, loop: _CellLoop) -> bool:
    """Whether another ``adec run`` on the same run folder finished ``cell`` after this one listed the
    unfinished cells (rank 0 looks; every rank gets its answer). Such a cell is reused, not
    recomputed, so several processes can share one run folder."""
    finished = (loop.cells_dir / cell.id / "summary.json").is_file() if loop.dist.is_main else False
    if not loop.dist.broadcast(finished):
        return False
    if loop.dist.is_main:
        _refresh_finished(cell, loop.cells_dir / cell.id, loop.tasks, loop.device)
        print(f"adec run: cell {cell.id} was finished by another process meanwhile; reusing it",
              file=sys.stderr)
    loop.late.append(cell.id)
    if loop.bar is not None:
        loop.bar.update(1)
    return True


def _run_cells(todo: list[Cell], loop: _CellLoop) -> bool:
    """Evaluate the unfinished cells in order (rank 0 writes each, logs it to W&B), appending each id
    to ``loop.evaluated`` and skipping one another process finished meanwhile; returns whether
    ``max_cells`` stopped the run early."""
    dist = loop.dist
    for cell in todo:
        if loop.max_cells is not None and len(loop.evaluated) >= loop.max_cells:
            return True
        if _finished_meanwhile(cell, loop):
            continue
        if loop.bar is not None:
            loop.bar.set_postfix_str(cell.describe()[:60])
        task = _task_for(loop.tasks, cell.task)
        loaded = load_any_model(cell.model, device=loop.device)
        if cell.strategy.tune:
            from adaptive_decoding.experiments.tuned import tuned_cell

            cell = tuned_cell(cell, loaded, task, loop.cells_dir.parent / "tuned", loop.exp.batch_size, dist)
        t0 = time.perf_counter()
        result = evaluate_cell(cell, loaded, task, loop.exp, dist)
        seconds = time.perf_counter() - t0
        if dist.is_main:
            row = _write_cell(cell, loop.cells_dir / cell.id, result, task, loop.device, seconds,
                              dist.world_size, loaded)
            _log_wandb(loop.wb, cell, row)
        loop.evaluated.append(cell.id)
        if loop.bar is not None:
            loop.bar.update(1)
        dist.barrier()
    return False


def stale_inputs(params: Any, summary: Path) -> list[str]:
    """Files named in ``params`` (a policy file, nested ones included) modified after ``summary`` was
    written: a resumed run reuses a finished cell by its parameters, not by the files they name."""
    if isinstance(params, dict):
        return [p for v in params.values() for p in stale_inputs(v, summary)]
    if isinstance(params, (list, tuple)):
        return [p for v in params for p in stale_inputs(v, summary)]
    if isinstance(params, str) and params and os.path.isfile(params) and summary.is_file():
        return [params] if os.path.getmtime(params) > summary.stat().st_mtime else []
    return []


def _write_cell(cell: Cell, folder: Path, result: Any, task: Any, device: str, seconds: float,
                world_size: int, loaded: Any) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    samples = [asdict(s) for s in result.samples]
    metrics = compute_cell_metrics(cell, task, samples, device)
    for name, m in metrics.items():
        if m.per_sample is not None:
            for s, v in zip(samples, m.per_sample):
                s.setdefault("metrics", {})[name] = v
    buf = io.StringIO()
    for s in samples:
        buf.write(json.dumps(_clean(s), default=_json_default, ensure_ascii=False) + "\n")
    _write_atomic(folder / "samples.jsonl", buf.getvalue())
    row = result.row()
    row.update({
        "cell": cell.id, "key": cell.key, "task": cell.task.key, "task_name": cell.task.name,
        "task_params": cell.task.params, "strategy": cell.strategy.label, "kind": cell.kind,
        "curve": cell.strategy.curve or cell.strategy.label, "sweep": cell.strategy.sweep,
        "controller": cell.controller, "params": cell.params, "decode": cell.decode,
        "lookahead": cell.lookahead, "seed": cell.seed, "model": model_label(cell.model),
        "metrics": {k: v.value for k, v in metrics.items()}, "seconds": round(seconds, 3),
        "world_size": world_size, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "higher_is_better": _higher_is_better(cell.task.quality),
    })
    _set_quality(row, cell.task.quality)
    _write_atomic(folder / "summary.json", json.dumps(_clean(row), indent=2, default=_json_default) + "\n")
    return row


def _higher_is_better(metric: str) -> bool:
    if metric == "accuracy":
        return True
    from adaptive_decoding.experiments.metrics import METRICS

    return bool(getattr(METRICS.get(metric), "higher_is_better", True))


def _set_quality(row: dict, quality: str) -> None:
    row["quality_metric"] = quality
    row["quality"] = row["accuracy"] if quality == "accuracy" else (row.get("metrics") or {}).get(quality)


def _refresh_finished(cell: Cell, folder: Path, tasks: dict, device: str) -> None:
    """A finished cell: compute the metrics requested since, and take the file's current curve and
    kind (how the report draws the cell, not what was measured)."""
    summary = json.loads((folder / "summary.json").read_text())
    have = set(summary.get("metrics") or {})
    missing = [n for n, _ in cell.metrics if n not in have]
    shown = {"curve": cell.strategy.curve or cell.strategy.label, "kind": cell.kind}
    if any(summary.get(k) != v for k, v in shown.items()):
        summary.update(shown)
        _write_atomic(folder / "summary.json", json.dumps(summary, indent=2, default=_json_default) + "\n")
    if not missing and summary.get("quality_metric") == cell.task.quality:
        return
    task = _task_for(tasks, cell.task)
    samples = read_samples(folder / "samples.jsonl")
    metrics = compute_cell_metrics(cell, task, samples, device, only=missing)
    if metrics:
        for name, m in metrics.items():
            if m.per_sample is not None:
                for s, v in zip(samples, m.per_sample):
                    s.setdefault("metrics", {})[name] = v
        lines = (json.dumps(_clean(s), default=_json_default, ensure_ascii=False) + "\n" for s in samples)
        _write_atomic(folder / "samples.jsonl", "".join(lines))
        summary.setdefault("metrics", {}).update({k: _clean(v.value) for k, v in metrics.items()})
    summary["higher_is_better"] = _higher_is_better(cell.task.quality)
    _set_quality(summary, cell.task.quality)
    _write_atomic(folder / "summary.json", json.dumps(summary, indent=2, default=_json_default) + "\n")


def _task_for(cache: dict, spec: TaskSpec) -> Any:
    if spec.key not in cache:
        cache[spec.key] = spec.build()
    return cache[spec.key]


def _write_summary(exp: Experiment, cells: list[Cell], cells_dir: Path, run_dir: Path) -> list[dict]:
    rows = []
    for c in cells:
        f = cells_dir / c.id / "summary.json"
        if f.is_file():
            rows.append(json.loads(f.read_text()))
    _write_atomic(run_dir / "summary.json", json.dumps(rows, indent=2) + "\n")
    _write_atomic(run_dir / "summary.md",
                  f"# {exp.name}: {len(rows)} of {len(cells)} cells\n\n" + summary_markdown(rows))
    buf = io.StringIO()
    w = csv.writer(buf)
    metric_names = sorted({m for r in rows for m in (r.get("metrics") or {})})
    w.writerow([*SUMMARY_COLUMNS, *metric_names])
    for r in rows:
        w.writerow([r.get(k) if k != "lookahead" else bool(r.get(k)) for k in SUMMARY_COLUMNS]
                   + [(r.get("metrics") or {}).get(m) for m in metric_names])
    _write_atomic(run_dir / "summary.csv", buf.getvalue())
    return rows


def _log_wandb(wb: Any, cell: Cell, row: dict) -> None:
    if wb is None:
        return
    try:
        prefix = f"{cell.task.key}/{cell.strategy.label}/s{cell.seed}"
        data = {f"{prefix}/{k}": row[k] for k in ("accuracy", "nfe", "tpf", "ms_per_token", "peak_mem_mb")
                if isinstance(row.get(k), (int, float))}
        data.update({f"{prefix}/{k}": v for k, v in (row.get("metrics") or {}).items()
                     if isinstance(v, (int, float))})
        data["cells_done"] = cell.index + 1
        wb.log(data)
    except Exception as exc:  # noqa: BLE001
        print(f"adec run: W&B log failed ({exc}); results are in the run folder", file=sys.stderr)


def _finish_wandb(wb: Any, rows: list[dict]) -> None:
    try:
        import wandb

        cols = ["task", "strategy", "kind", "seed", "n", "accuracy", "quality", "nfe", "tpf", "ms_per_token",
                "peak_mem_mb"]
        wb.log({"summary": wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])})
        wb.finish()
    except Exception as exc:  # noqa: BLE001
        print(f"adec run: W&B finish failed ({exc})", file=sys.stderr)
