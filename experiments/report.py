"""The benchmark report: ``docs/benchmark.md`` (plots first, then tables), PNG plots, ``docs/benchmark.json``.

Input: run folders written by :func:`experiments.runner.run_experiment` (``summary.json``,
``environment.json``, ``invocations.jsonl``). Rows of the same experiment, task and strategy are
averaged over seeds (peak memory: the maximum). Per task the report shows

* a quality-versus-NFE plot: one point per strategy, coloured by kind (reference, baseline,
  heuristic, tuned, learned, oracle), triangles for strategies with lookahead, the Pareto front
  (fewest NFE for a quality) as a step line and the oracle as a star: the upper bound on tokens per
  forward at the reference's quality;
* a table ``strategy | kind | lookahead | quality | NFE | tokens per forward | ms per token | peak memory``.

``docs/benchmark.json`` holds the same rows as a list of objects with at least ``task``,
``strategy``, ``kind``, ``accuracy`` (in [0, 1]), ``nfe``, ``tpf``, ``ms_per_token``, ``peak_mem_mb``.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

KIND_ORDER = ("reference", "baseline", "heuristic", "tuned", "learned", "oracle")
KIND_COLOURS = {"reference": "#000000", "baseline": "#1f77b4", "heuristic": "#2ca02c", "tuned": "#ff7f0e",
                "learned": "#9467bd", "oracle": "#d62728"}


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
        runs.append(RunInfo(path=f, name=f.name, rows=rows, environment=env, invocations=inv, experiment=exp or {}))
    return runs


def _mean(xs: Sequence[Any]) -> Optional[float]:
    vals = [float(x) for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]
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
            "kind": first.get("kind", "heuristic"), "lookahead": bool(first.get("lookahead")),
            "controller": first.get("controller"), "params": first.get("params") or {},
            "accuracy": min(1.0, max(0.0, acc)) if acc is not None else 0.0,
            "quality_metric": first.get("quality_metric", "accuracy"),
            "quality": _mean([r.get("quality", r["accuracy"]) for r in rows]),
            "higher_is_better": bool(first.get("higher_is_better", True)),
            "nfe": _mean([r["nfe"] for r in rows]), "tpf": _mean([r["tpf"] for r in rows]),
            "ms_per_token": _mean([r["ms_per_token"] for r in rows]),
            "peak_mem_mb": max((r["peak_mem_mb"] for r in rows if r.get("peak_mem_mb") is not None), default=None),
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


def pareto_front(points: Sequence[tuple[float, float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the points not dominated in (fewer NFE, better quality), sorted by NFE."""
    sign = 1.0 if higher_is_better else -1.0
    idx = [i for i, (x, y) in enumerate(points) if x is not None and y is not None]
    front = []
    for i in idx:
        xi, yi = points[i][0], sign * points[i][1]
        dominated = any(
            (points[j][0] <= xi and sign * points[j][1] >= yi) and (points[j][0] < xi or sign * points[j][1] > yi)
            for j in idx if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "task"


def _quality_label(row: dict) -> str:
    q = row["quality_metric"]
    name = "accuracy" if q == "accuracy" else q.replace("_", " ")
    return f"{name} ({'higher' if row['higher_is_better'] else 'lower'} is better)"


def plot_task(rows: list[dict], path: Path, title: str) -> Path:
    """The quality-versus-NFE Pareto plot of one task's rows, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    hib = rows[0]["higher_is_better"]
    pts = [(r["nfe"], r["quality"]) for r in rows]
    for kind in KIND_ORDER:
        for look in (False, True):
            sel = [r for r in rows if r["kind"] == kind and r["lookahead"] == look and r["quality"] is not None]
            if not sel:
                continue
            marker = "*" if kind == "oracle" else ("s" if kind == "reference" else ("^" if look else "o"))
            size = 160 if kind == "oracle" else 46
            ax.scatter([r["nfe"] for r in sel], [r["quality"] for r in sel], c=KIND_COLOURS[kind], marker=marker,
                       s=size, label=kind + (" + lookahead" if look else ""), zorder=3, edgecolors="white",
                       linewidths=0.5)
    front = pareto_front([p if rows[i]["kind"] != "oracle" else (None, None) for i, p in enumerate(pts)], hib)
    if len(front) > 1:
        ax.step([pts[i][0] for i in front], [pts[i][1] for i in front], where="post", color="#888888",
                lw=1, ls="--", zorder=2, label="Pareto front")
    for r in rows:
        if r["quality"] is None:
            continue
        ax.annotate(_short(r["strategy"]), (r["nfe"], r["quality"]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points", color="#333333")
    oracle = [r for r in rows if r["kind"] == "oracle" and r["quality"] is not None]
    if oracle:
        ax.axvline(oracle[0]["nfe"], color=KIND_COLOURS["oracle"], lw=0.8, ls=":", zorder=1)
    if rows[0]["quality_metric"] == "accuracy":
        ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("NFE per sample (forward passes, lower is cheaper)")
    ax.set_ylabel(_quality_label(rows[0]))
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _short(label: str, limit: int = 28) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _sort_key(r: dict) -> tuple:
    kind = KIND_ORDER.index(r["kind"]) if r["kind"] in KIND_ORDER else len(KIND_ORDER)
    return (kind, r["lookahead"], r["nfe"] if r["nfe"] is not None else math.inf)


def headline(rows: list[dict], tolerance: float = 0.01) -> dict[str, Any]:
    """Per task: the reference, the cheapest strategy (most tokens per forward) whose quality is
    within ``tolerance`` of the reference's (relative for lower-is-better metrics), and the oracle."""
    ref = next((r for r in rows if r["kind"] == "reference"), None)
    oracle = next((r for r in rows if r["kind"] == "oracle"), None)
    best = None
    if ref is not None and ref["quality"] is not None:
        hib = ref["higher_is_better"]
        ok = [r for r in rows if r["kind"] not in ("reference", "oracle") and r["quality"] is not None and
              (r["quality"] >= ref["quality"] - tolerance if hib else r["quality"] <= ref["quality"] * (1 + tolerance))]
        best = max(ok, key=lambda r: (r["tpf"] or 0.0), default=None)
    return {"reference": ref, "best": best, "oracle": oracle}


def _row_text(r: Optional[dict]) -> str:
    if r is None:
        return "–"
    q = "accuracy" if r["quality_metric"] == "accuracy" else r["quality_metric"]
    return f"{r['strategy']} ({r['kind']}): {q} {_f(r['quality'])}, {_f(r['nfe'], 2)} NFE, {_f(r['tpf'], 2)} tokens/forward"


def write_report(runs_paths: Sequence["str | Path"], out_dir: "str | Path" = "docs", *,
                 title: str = "Benchmark", command: Optional[str] = None) -> dict[str, Path]:
    """Write ``benchmark.md``, ``benchmark.json`` and ``plots/benchmark-<task>.png`` into ``out_dir``."""
    runs = find_runs(runs_paths)
    rows = aggregate(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots_dir = out / "plots"
    by_task: "OrderedDict[tuple[str, str], list[dict]]" = OrderedDict()
    for r in rows:
        by_task.setdefault((r["experiment"], r["task"]), []).append(r)
    multi = len({r["experiment"] for r in rows}) > 1
    written: dict[str, Path] = {}
    md: list[str] = [f"# {title}", ""]
    md += [f"Generated by `{command or 'adec report'}` from {len(runs)} run folder(s); every figure below was "
           "measured in one run per experiment, all strategies side by side on the same model, the same test "
           "examples and the same seeds. NFE (forward passes per sample, lookahead rollouts included) is exact; "
           "ms per token is the wall time of the whole decode divided by the generated positions; peak memory "
           "is measured above the process's memory at the start of each cell.", ""]
    md += ["## Setup", ""]
    for run in runs:
        env, exp = run.environment, run.experiment
        md.append(f"**Run `{run.name}`** ({run.path}):")
        md.append("")
        md.append(f"- machine: {env.get('cpu', '?')}, {env.get('cores', '?')} cores"
                  + (f", {env['memory_gb']} GB memory" if env.get("memory_gb") else "")
                  + (f", GPUs: {', '.join(env['gpus'])}" if env.get("gpus") else "")
                  + f"; torch {env.get('torch', '?')} ({env.get('torch_threads', '?')} threads), "
                    f"Python {env.get('python', '?')}, {env.get('platform', '?')}"
                  + (f"; {env['world_size']} processes" if env.get("world_size", 1) > 1 else ""))
        cmds = sorted({i["command"] for i in run.invocations if i.get("command")})
        if cmds:
            md.append("- commands: " + "; ".join(f"`{c}`" for c in cmds))
        md.append(f"- seeds: {exp.get('seeds', [0])}; {exp.get('n', 100)} {exp.get('split', 'test')} examples per "
                  f"cell (data seed {exp.get('data_seed', 0)}); batch size {exp.get('batch_size', 64)}; "
                  f"timing: median of {exp.get('repeats', 1)} run(s)")
        models = sorted({str(r.get("model")) for r in run.rows})
        md.append(f"- models: {', '.join(models)}")
        skipped = json.loads((run.path / "skipped.json").read_text()) if (run.path / "skipped.json").is_file() else []
        if skipped:
            md.append(f"- not run ({len(skipped)} strategy x task pairs whose files were missing): "
                      + "; ".join(f"{s['strategy']} on {s['task']}" for s in skipped))
        md.append("")
    md += ["## Headline", ""]
    heads = {}
    for (exp, task), trows in by_task.items():
        h = headline(trows)
        heads[(exp, task)] = h
        name = f"{exp} / {task}" if multi else task
        md.append(f"- **{name}**: reference {_row_text(h['reference'])}; best within 1 point of it: "
                  f"{_row_text(h['best'])}; oracle bound: {_row_text(h['oracle'])}")
    md.append("")
    for (exp, task), trows in by_task.items():
        trows = sorted(trows, key=_sort_key)
        name = f"{exp} / {task}" if multi else task
        slug = _slug(f"{exp}-{task}" if multi else task)
        png = plots_dir / f"benchmark-{slug}.png"
        seeds = sorted({s for r in trows for s in r["seeds"]})
        plot_task(trows, png, f"{name}: {_quality_label(trows[0])} vs NFE (n={trows[0]['n']}, seeds {seeds})")
        written[f"plot:{name}"] = png
        md += [f"## {name}", "", f"![{name}: quality versus NFE](plots/{png.name})", ""]
        qname = "accuracy" if trows[0]["quality_metric"] == "accuracy" else trows[0]["quality_metric"]
        extra = [m for m in sorted({m for r in trows for m in r["metrics"]}) if m != trows[0]["quality_metric"]]
        head = ["strategy", "kind", "lookahead", f"quality: {qname}", *([] if qname == "accuracy" else ["accuracy"]),
                *extra, "NFE", "tokens per forward", "ms per token", "peak memory (MB)"]
        md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in trows:
            vals = [r["strategy"], r["kind"], "yes" if r["lookahead"] else "no", _f(r["quality"])]
            if qname != "accuracy":
                vals.append(_f(r["accuracy"]))
            vals += [_f(r["metrics"].get(m)) for m in extra]
            vals += [_f(r["nfe"], 2), _f(r["tpf"], 2), _f(r["ms_per_token"], 3), _f(r["peak_mem_mb"], 1)]
            md.append("| " + " | ".join(v.replace("|", "\\|") for v in vals) + " |")
        md.append("")
    md += ["## Reading the table", "",
           "- *quality*: the task's own score (exact match; for Sudoku any valid completion; for pairs every slot a "
           "valid phrase) unless the task names another metric (free text: generative perplexity under a small "
           "causal LM trained on the corpus, lower is better).",
           "- *kind*: `reference` decodes one token per forward; `baseline` are the published samplers (LLaDA, "
           "Dream, Fast-dLLM, EB, ...); `heuristic`, `tuned` (Optuna) and `learned` are this project's "
           "controllers; `oracle` commits exactly the tokens the reference ends with, the upper bound on tokens "
           "per forward at the reference's output.",
           "- *tokens per forward* = generated positions / NFE, averaged over samples.", ""]
    md_path = out / "benchmark.md"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    json_rows = [{k: r[k] for k in ("experiment", "task", "strategy", "kind", "accuracy", "nfe", "tpf", "ms_per_token",
                                     "peak_mem_mb", "lookahead", "quality_metric", "quality", "higher_is_better",
                                     "controller", "params", "n", "seeds", "metrics", "model", "lookahead_nfe")}
                 for r in rows]
    json_path = out / "benchmark.json"
    json_path.write_text(json.dumps(json_rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    written["markdown"] = md_path
    written["json"] = json_path
    return written
