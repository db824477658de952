"""The benchmark report: ``docs/benchmark.md`` (plots first, then tables), PNG plots, ``docs/benchmark.json``.

Input: run folders written by :func:`adaptive_decoding.experiments.runner.run_experiment` (``summary.json``,
``environment.json``, ``invocations.jsonl``). Rows of the same experiment, task and strategy are
averaged over seeds (peak memory: the maximum). Per task the report shows

* a plot of quality against tokens per forward (:mod:`adaptive_decoding.experiments.plots`): one line per curve (the
  strategies of one sweep), single strategies as markers coloured by kind, the one-token-per-step
  reference and the oracle marked;
* AUP, accuracy under parallelism (:mod:`adaptive_decoding.experiments.aup`), per curve, with ``y_max`` the best
  accuracy on the task; a strategy that is no sweep is a curve of one point;
* a table ``strategy | AUP | kind | lookahead | quality | NFE | tokens per forward | ms per token |
  peak memory``, sorted by AUP (the rows of a curve together, by tokens per forward);
* the matched-accuracy table (:func:`adaptive_decoding.experiments.compare.matched_points`): each curve's most parallel
  point no more than 1 point below the reference, and its ratios (baseline spread, oracle room, ...)
  judged against the experiment file's ``targets:`` (:mod:`adaptive_decoding.experiments.targets`; without them, shown
  for scale); the headline counts the tasks that meet both;
* lookahead and revocable decoding against the same controller without them
  (:func:`adaptive_decoding.experiments.compare.against_base`): accuracy at equal NFE, tokens per forward at equal
  accuracy, and the lookahead targets of the file (a gain, never more than a point below at equal NFE);
* every learned and lookahead point against the best non-learned curve
  (:func:`adaptive_decoding.experiments.compare.against_best`), at equal NFE and at equal accuracy.

All three are uses of one matcher (:func:`adaptive_decoding.experiments.compare.match`) on typed points
(:class:`adaptive_decoding.experiments.compare.Point`); the targets are read from each run folder's ``experiment.yaml``.

``docs/benchmark.json`` is ``{"rows": [...], "tasks": {...}}``: ``rows`` are objects with at least
``task``, ``strategy``, ``curve``, ``kind``, ``accuracy`` (in [0, 1]), ``nfe``, ``tpf``,
``ms_per_token``, ``peak_mem_mb``, ``aup`` (its curve's); ``tasks`` maps each task's name (``exp /
task`` when several experiments are reported) to ``{"experiment", "task", "quality_metric",
"y_max" (percent), "aup": {curve: AUP}, "curves": {curve: [strategy, ...]}, "note", "matched",
"against_base", "against_best"}``
(``matched``: :func:`adaptive_decoding.experiments.compare.matched_points`; ``against_base``:
:func:`adaptive_decoding.experiments.compare.against_base`; ``against_best``: :func:`adaptive_decoding.experiments.compare.against_best`,
every learned and lookahead point against the best non-learned curve); ``matched`` counts the tasks meeting the targets
(:func:`adaptive_decoding.experiments.compare.matched_summary`); ``targets`` maps each experiment to the targets it
declares (``null`` where a target is not declared); ``published`` lists
the experiment files' ``published`` tables (:mod:`adaptive_decoding.experiments.published`), shown in the markdown after
the headline: ``{"experiment", "title", "source", "note", "columns": {title: task}, "rows": [{"label",
"strategy", "cells": {column: {"ours", "unit", "nfe", "tpf", "n", "seeds", "paper"}}}]}`` (``ours`` in
percent when ``unit`` is ``"percent"``; ``None`` where the strategy has not run or no figure is given).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from adaptive_decoding.experiments.aup import task_aup
from adaptive_decoding.experiments.compare import (
    against_base,
    against_base_markdown,
    against_base_summary,
    against_best,
    against_best_markdown,
    as_points,
    match,
    matched_markdown,
    matched_points,
    matched_summary,
    summary_line,
)
from adaptive_decoding.experiments.plots import (
    KIND_COLOURS,
    KIND_ORDER,
    curves_of,
    pareto_front,
    plot_task,
    quality_label,
)
from adaptive_decoding.experiments.published import published_tables
from adaptive_decoding.experiments.tables import figure, markdown_table
from adaptive_decoding.experiments.targets import Targets, check_targets

__all__ = ["KIND_COLOURS", "KIND_ORDER", "ReportError", "aggregate", "find_runs", "headline", "pareto_front",
           "plot_task", "task_aup_scores", "write_report"]


class ReportError(ValueError):
    """No run folder, or a folder without results; the message names it."""


@dataclass
class RunInfo:
    path: Path
    name: str
    rows: list[dict]
    environment: dict
    invocations: list[dict]
    experiment: dict
    targets: Targets = field(default_factory=Targets)


def find_runs(paths: Sequence["str | Path"]) -> list[RunInfo]:
    """Run folders at or directly under ``paths`` (a folder with ``summary.json``)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / "summary.json").is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(q for q in p.iterdir() if (q / "summary.json").is_file())
        else:
            raise ReportError(f"{str(p)!r} is not a folder")
    if not found:
        raise ReportError(f"no run folder (with summary.json) at or under {', '.join(map(str, paths))}; "
                          f"run 'adec run experiments/configs/NAME.yaml' first")
    runs = []
    for f in found:
        rows = json.loads((f / "summary.json").read_text())
        env = json.loads((f / "environment.json").read_text()) if (f / "environment.json").is_file() else {}
        inv = []
        if (f / "invocations.jsonl").is_file():
            inv = [json.loads(x) for x in (f / "invocations.jsonl").read_text().splitlines() if x.strip()]
        import yaml

        exp = yaml.safe_load((f / "experiment.yaml").read_text()) if (f / "experiment.yaml").is_file() else {}
        runs.append(RunInfo(path=f, name=f.name, rows=rows, environment=env, invocations=inv,
                            experiment=exp or {}, targets=_targets(f, exp or {})))
    return runs


def _targets(folder: Path, experiment: dict) -> Targets:
    """The run's ``targets:`` (none when its ``experiment.yaml`` declares none); a malformed entry
    raises :class:`ReportError` naming the file and the key."""
    targets, problems = check_targets(experiment.get("targets"))
    if problems:
        raise ReportError(f"{folder / 'experiment.yaml'}: " + "; ".join(f"{p}: {m}" for p, m in problems))
    return targets


def _mean(xs: Sequence[Any]) -> Optional[float]:
    vals = [float(x) for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x)]
    return sum(vals) / len(vals) if vals else None


def aggregate(runs: Sequence[RunInfo]) -> list[dict]:
    """Benchmark rows: one per (experiment, task, strategy), averaged over seeds."""
    groups: "OrderedDict[tuple, list[dict]]" = OrderedDict()
    for run in runs:
        for r in run.rows:
            groups.setdefault((run.name, r["task"], r["strategy"]), []).append(r)
    out = []
    for (exp, task, strategy), rows in groups.items():
        first = rows[0]
        metrics = sorted({m for r in rows for m in (r.get("metrics") or {})})
        acc = _mean([r["accuracy"] for r in rows])
        row = {
            "experiment": exp, "task": task, "task_name": first.get("task_name", task), "strategy": strategy,
            "curve": first.get("curve") or strategy, "sweep": first.get("sweep"),
            "kind": first.get("kind", "heuristic"), "lookahead": bool(first.get("lookahead")),
            "controller": first.get("controller"), "params": first.get("params") or {},
            "accuracy": min(1.0, max(0.0, acc)) if acc is not None else 0.0,
            "quality_metric": first.get("quality_metric", "accuracy"),
            "quality": _mean([r.get("quality", r["accuracy"]) for r in rows]),
            "higher_is_better": bool(first.get("higher_is_better", True)),
            "nfe": _mean([r["nfe"] for r in rows]), "tpf": _mean([r["tpf"] for r in rows]),
            "tpf_mean": _mean([r.get("tpf_mean") for r in rows]),
            "ms_per_token": _mean([r["ms_per_token"] for r in rows]),
            "peak_mem_mb": max((r["peak_mem_mb"] for r in rows if r.get("peak_mem_mb") is not None),
                               default=None),
            "lookahead_nfe": _mean([r.get("lookahead_nfe") for r in rows]),
            "n": first.get("n"), "seeds": sorted({r["seed"] for r in rows}),
            "metrics": {m: _mean([(r.get("metrics") or {}).get(m) for r in rows]) for m in metrics},
            "model": first.get("model"),
        }
        if len(rows) > 1:
            accs = [r["accuracy"] for r in rows]
            row["accuracy_std"] = statistics.pstdev(accs)
        out.append(row)
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "task"


def _sort_key(r: dict) -> tuple:
    kind = KIND_ORDER.index(r["kind"]) if r["kind"] in KIND_ORDER else len(KIND_ORDER)
    return (kind, r["lookahead"], r["nfe"] if r["nfe"] is not None else math.inf)


def task_aup_scores(rows: Sequence[dict]) -> dict[str, Any]:
    """AUP of every curve of one task: ``{"aup": {curve: AUP}, "y_max": percent, "curves": {curve:
    [strategy, ...] by tokens per forward}, "note": why there is no AUP, or None}``.

    AUP reads the task's quality in percent, so it needs a higher-is-better quality in [0, 1]
    (accuracy, exact match, BLEU, ...); a lower-is-better one (perplexity) gets none."""
    curves = curves_of(rows)
    out: dict[str, Any] = {"aup": {}, "y_max": None, "note": None,
                           "curves": {c: [r["strategy"] for r in pts] for c, pts in curves.items()}}
    q = rows[0]["quality_metric"] if rows else "accuracy"
    if rows and not rows[0]["higher_is_better"]:
        out["note"] = f"no AUP: {q} is lower-is-better, AUP needs an accuracy"
    elif any(not -1e-9 <= r["quality"] <= 1 + 1e-9 for pts in curves.values() for r in pts):
        out["note"] = f"no AUP: {q} is not a fraction in [0, 1]"
    else:
        pts = {c: [(r["tpf"], min(100.0, max(0.0, 100.0 * r["quality"]))) for r in rs if r["tpf"] > 0]
               for c, rs in curves.items()}
        pts = {c: p for c, p in pts.items() if p}
        if pts:
            out["aup"], out["y_max"] = task_aup(pts)
    return out


def _by_aup(rows: list[dict], aups: dict[str, float]) -> list[dict]:
    """Rows by their curve's AUP, best first, a curve's rows together by tokens per forward, the
    oracle (a bound, not a competitor) last; without AUP, by kind, lookahead and NFE."""
    if not aups:
        return sorted(rows, key=_sort_key)
    first = {}
    for r in sorted(rows, key=_sort_key):
        first.setdefault(r["curve"], _sort_key(r))
    return sorted(rows,
                  key=lambda r: (r["kind"] == "oracle", -aups.get(r["curve"], -math.inf), first[r["curve"]],
                                       r["curve"],
                                       r["tpf"] if r["tpf"] is not None else math.inf))


def headline(rows: list[dict], tolerance: float = 0.01) -> dict[str, Any]:
    """Per task: the reference, the cheapest strategy (most tokens per forward) whose quality is
    within ``tolerance`` of the reference's (relative for lower-is-better metrics), and the oracle."""
    ref = next((r for r in rows if r["kind"] == "reference"), None)
    oracle = next((r for r in rows if r["kind"] == "oracle"), None)
    best = None
    if ref is not None and ref["quality"] is not None:
        hib = ref["higher_is_better"]
        pool = [p for p in as_points(rows) if p.kind not in ("reference", "oracle")]
        bound = ref["quality"] - tolerance if hib else ref["quality"] * (1 + tolerance)
        best = match(pool, floor=bound, on="quality", higher_is_better=hib)
    return {"reference": ref, "best": best, "oracle": oracle}


def _row_text(r: Optional[dict]) -> str:
    if r is None:
        return "–"
    q = "accuracy" if r["quality_metric"] == "accuracy" else r["quality_metric"]
    return (f"{r['strategy']} ({r['kind']}): {q} {figure(r['quality'])}, {figure(r['nfe'], 2)} NFE, "
            f"{figure(r['tpf'], 2)} tokens/forward")


def write_report(runs_paths: Sequence["str | Path"], out_dir: "str | Path" = "docs", *,
                 title: str = "Benchmark", command: Optional[str] = None) -> dict[str, Path]:
    """Write ``benchmark.md``, ``benchmark.json`` and ``plots/benchmark-<task>.png`` into ``out_dir``."""
    runs = find_runs(runs_paths)
    rows = aggregate(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_task: "OrderedDict[tuple[str, str], list[dict]]" = OrderedDict()
    for r in rows:
        by_task.setdefault((r["experiment"], r["task"]), []).append(r)
    multi = len({r["experiment"] for r in rows}) > 1
    written: dict[str, Path] = {}
    md = _intro_markdown(runs, title, command)
    targets = {run.name: run.targets for run in runs}
    headline_md, tasks = _headline_markdown(by_task, multi, targets)
    md += headline_md
    matched = matched_summary(tasks)
    declared = [targets[r] for r in sorted({exp for exp, _ in by_task})]
    md += [summary_line(matched, [t.matched for t in declared])]
    md += ([line] if (line := against_base_summary(tasks, [t.against_base for t in declared])) else []) + [""]
    published_md, published = published_tables(runs, rows, multi)
    md += published_md
    for (exp, task), trows in by_task.items():
        name = f"{exp} / {task}" if multi else task
        section, png = _task_section(name, _slug(f"{exp}-{task}" if multi else task), trows, tasks[name],
                                     out / "plots", targets[exp])
        written[f"plot:{name}"] = png
        md += section
    md += _READING
    md_path = out / "benchmark.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    json_rows = [{k: r[k] for k in _JSON_FIELDS} for r in rows]
    json_path = out / "benchmark.json"
    doc = {"rows": json_rows, "tasks": tasks, "matched": matched, "published": published,
           "targets": {name: asdict(t) for name, t in targets.items()}}
    json_path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    written["markdown"] = md_path
    written["json"] = json_path
    return written


#: the fields of each row of ``benchmark.json``
_JSON_FIELDS = ("experiment", "task", "strategy", "curve", "sweep", "kind", "aup", "accuracy", "nfe", "tpf", "tpf_mean",
                "ms_per_token", "peak_mem_mb", "lookahead", "quality_metric", "quality", "higher_is_better",
                "controller", "params", "n", "seeds", "metrics", "model", "lookahead_nfe")

#: the closing section of ``benchmark.md``: what each column means
_READING = [
    "## Reading the table", "",
    "- *quality*: the task's own score (exact match; for Sudoku any valid completion; for pairs every slot a "
    "valid phrase) unless the task names another metric (free text: generative perplexity under a small "
    "causal LM trained on the corpus, lower is better).",
    "- *kind*: `reference` decodes one token per forward; `baseline` are the published samplers (LLaDA, "
    "Dream, Fast-dLLM, EB, ...); `heuristic`, `tuned` (Optuna) and `learned` are this project's "
    "controllers; `oracle` commits exactly the tokens the reference ends with, the upper bound on tokens "
    "per forward at the reference's output.",
    "- *tokens per forward*, as the field counts it (the d3LLM leaderboard, dInfer): the answers' tokens "
    "(up to and including the first end-of-text, or all G) summed over the examples, divided by the "
    "forwards summed over them; *per-sample mean*, where shown, is the mean of each answer's tokens / its "
    "NFE, which flatters a decoder whose forwards vary between examples. AUP and every matched "
    "comparison use the pooled figure.",
    "- *AUP* (accuracy under parallelism, the d3LLM leaderboard's score): over a curve's points (ρ tokens "
    "per forward, y accuracy in percent) sorted by ρ, those more than 5 points below the first dropped, "
    "AUP = ρ₁·y₁ + Σ ½(ρᵢ − ρᵢ₋₁)(yᵢ·W(yᵢ) + yᵢ₋₁·W(yᵢ₋₁)) with W(y) = min(exp(−3(1 − y/y_max)), 1): "
    "the area under the curve, discounting accuracy lost against the best strategy. A curve is the "
    "points of one sweep. A single point scores its unweighted rectangle ρ·y (as in the reference), so a "
    "fast, inaccurate single point can outscore an accurate one: compare sweeps.", ""]


def _intro_markdown(runs: Sequence[Any], title: str, command: Optional[str]) -> list[str]:
    """The report's title, how its figures were measured, and the setup of every run."""
    md: list[str] = [f"# {title}", ""]
    md += [f"Generated by `{command or 'adec report'}` from {len(runs)} run folder(s); every figure below "
           f"was measured in one run per experiment, all strategies side by side on the same model, the "
           f"same test examples and the same seeds. NFE (forward passes per sample, lookahead rollouts "
           f"included) is exact; ms per token is the wall time of the whole decode divided by the generated "
           f"positions; peak memory is measured above the process's memory at the start of each cell.", ""]
    md += ["## Setup", ""]
    for run in runs:
        md += _run_setup(run)
    return md


def _run_setup(run: Any) -> list[str]:
    """One run's setup lines: machine, commands, seeds and sizes, models, strategies not run."""
    env, exp = run.environment, run.experiment
    md = [f"**Run `{run.name}`** ({run.path}):", ""]
    md.append(f"- machine: {env.get('cpu', '?')}, {env.get('cores', '?')} cores"
              + (f", {env['memory_gb']} GB memory" if env.get("memory_gb") else "")
              + (f", GPUs: {', '.join(env['gpus'])}" if env.get("gpus") else "")
              + f"; torch {env.get('torch', '?')} ({env.get('torch_threads', '?')} threads), "
                f"Python {env.get('python', '?')}, {env.get('platform', '?')}"
              + (f"; {env['world_size']} processes" if env.get("world_size", 1) > 1 else ""))
    cmds = sorted({i["command"] for i in run.invocations if i.get("command")})
    if cmds:
        md.append("- commands: " + "; ".join(f"`{c}`" for c in cmds))
    md.append(f"- seeds: {exp.get('seeds', [0])}; {exp.get('n', 100)} {exp.get('split', 'test')} examples "
              f"per cell (data seed {exp.get('data_seed', 0)}); batch size {exp.get('batch_size', 64)}; "
              f"timing: median of {exp.get('repeats', 1)} run(s)")
    models = sorted({str(r.get("model")) for r in run.rows})
    md.append(f"- models: {', '.join(models)}")
    skipped_file = run.path / "skipped.json"
    skipped = json.loads(skipped_file.read_text()) if skipped_file.is_file() else []
    if skipped:
        md.append(f"- not run ({len(skipped)} strategy x task pairs whose files were missing): "
                  + "; ".join(f"{s['strategy']} on {s['task']}" for s in skipped))
    md.append("")
    return md


def _headline_markdown(by_task: "OrderedDict[tuple[str, str], list[dict]]", multi: bool,
                       targets: dict[str, Targets]) -> tuple[list[str], dict[str, dict]]:
    """The headline per task (reference, best within 1 point, oracle, highest AUP) and each task's
    scores: AUPs (also written into every row's ``aup``), matched points, the comparisons with the base
    and with the best non-learned curve, judged against the targets of the task's experiment."""
    md = ["## Headline", ""]
    tasks: dict[str, dict] = {}
    for (exp, task), trows in by_task.items():
        h = headline(trows)
        name = f"{exp} / {task}" if multi else task
        scores = tasks[name] = {"experiment": exp, "task": task, "quality_metric": trows[0]["quality_metric"],
                                **task_aup_scores(trows)}
        for r in trows:
            r["aup"] = scores["aup"].get(r["curve"])
        scores["matched"] = matched_points(trows, scores["aup"], targets=targets[exp].matched)
        scores["against_base"] = against_base(trows, scores["aup"], targets[exp].against_base)
        scores["against_best"] = against_best(trows)
        oracles = {r["curve"] for r in trows if r["kind"] == "oracle"}
        best_aup = max(((c, v) for c, v in scores["aup"].items() if c not in oracles), key=lambda kv: kv[1],
                       default=None)
        md.append(f"- **{name}**: reference {_row_text(h['reference'])}; best within 1 point of it: "
                  f"{_row_text(h['best'])}; oracle bound: {_row_text(h['oracle'])}; highest AUP: "
                  + (f"{best_aup[0]} ({best_aup[1]:.1f})" if best_aup else scores["note"] or "–"))
    return md, tasks


def _task_section(name: str, slug: str, trows: list[dict], scores: dict, plots_dir: Path,
                  targets: Targets) -> tuple[list[str], Path]:
    """One task's section (its plot, its rows sorted by AUP, matched points, comparison with the
    base) and the plot's path."""
    trows = _by_aup(trows, scores["aup"])
    png = plots_dir / f"benchmark-{slug}.png"
    seeds = sorted({s for r in trows for s in r["seeds"]})
    plot_task(trows, png, f"{name}: {quality_label(trows[0])} vs tokens per forward (n={trows[0]['n']}, "
              f"seeds {seeds})", scores["aup"])
    md = [f"## {name}", "", f"![{name}: quality versus tokens per forward](plots/{png.name})", ""]
    if scores["aup"]:
        md += [f"Sorted by AUP (y_max = {scores['y_max']:.1f} %, the best accuracy on this task); the rows "
               f"of a curve share its AUP; the oracle, a bound, comes last.", ""]
    elif scores["note"]:
        md += [scores["note"][0].upper() + scores["note"][1:] + ".", ""]
    md += _task_table(trows)
    md += matched_markdown(name, scores["matched"], trows[0]["quality_metric"])
    md += against_base_markdown(name, scores["against_base"], targets.against_base)
    md += against_best_markdown(name, scores["against_best"])
    return md, png


def _task_table(trows: list[dict]) -> list[str]:
    """The markdown table of one task's rows: AUP, kind, quality (and accuracy), its other metrics,
    NFE, tokens per forward (and its per-sample mean, where the rows carry it), ms per token, peak memory."""
    qname = "accuracy" if trows[0]["quality_metric"] == "accuracy" else trows[0]["quality_metric"]
    extra = [m for m in sorted({m for r in trows for m in r["metrics"]}) if m != trows[0]["quality_metric"]]
    acc = qname != "accuracy"
    mean = any(r.get("tpf_mean") is not None for r in trows)
    head = ["strategy", "AUP", "kind", "lookahead", f"quality: {qname}", *(["accuracy"] if acc else []),
            *extra, "NFE", "tokens per forward", *(["tokens per forward (per-sample mean)"] if mean else []),
            "ms per token", "peak memory (MB)"]
    body = [[r["strategy"], figure(r["aup"], 1), r["kind"], "yes" if r["lookahead"] else "no", figure(r["quality"]),
             *([figure(r["accuracy"])] if acc else []), *(figure(r["metrics"].get(m)) for m in extra),
             figure(r["nfe"], 2), figure(r["tpf"], 2), *([figure(r.get("tpf_mean"), 2)] if mean else []),
             figure(r["ms_per_token"], 3), figure(r["peak_mem_mb"], 1)] for r in trows]
    return markdown_table(head, body) + [""]
