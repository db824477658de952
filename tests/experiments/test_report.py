"""The benchmark report: Pareto fronts, aggregation over seeds, markdown with plots first, JSON rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptive_decoding.experiments.report import (
    ReportError,
    aggregate,
    find_runs,
    headline,
    pareto_front,
    write_report,
)


def row(task, strategy, kind, acc, nfe, seed=0, lookahead=None, quality=None, metric="accuracy", hib=True,
        **kw):
    g = 8
    return {"cell": f"{task}-{strategy}-{seed}", "task": task, "strategy": strategy, "kind": kind,
            "seed": seed,
            "n": 50, "accuracy": acc, "quality": acc if quality is None else quality,
            "quality_metric": metric,
            "higher_is_better": hib, "nfe": nfe, "tpf": g / nfe, "ms_per_token": 0.5 * nfe / g,
            "peak_mem_mb": 3.0 + seed,
            "lookahead": lookahead, "controller": strategy, "params": {}, "metrics": kw.get("metrics", {}),
            "model": "tiny-" + task}


def make_run(folder: Path, rows: list[dict], name: str = "bench") -> Path:
    run = folder / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(rows))
    (run / "environment.json").write_text(json.dumps({"cpu": "Test CPU 9000", "cores": 2, "torch": "2.13.0",
                                                      "python": "3.11", "torch_threads": 1}))
    (run / "invocations.jsonl").write_text(json.dumps({"command": "adec run experiments/bench.yaml"}) + "\n")
    (run / "experiment.yaml").write_text("name: bench\nseeds: [0, 1]\nn: 50\n")
    return run


ROWS = [
    row("addition", "sequential", "reference", 0.96, 8.0),
    row("addition", "fast_dllm (τ=0.9)", "baseline", 0.95, 3.0),
    row("addition", "fast_dllm (τ=0.7)", "baseline", 0.80, 2.0),
    row("addition", "llada", "baseline", 0.70, 4.0),            # dominated by fast_dllm (τ=0.9)
    row("addition", "margin_topk", "heuristic", 0.90, 2.5),
    row("addition", "margin_topk + lookahead", "heuristic", 0.97, 3.5, lookahead={"scorer": "logprob"}),
    row("addition", "oracle", "oracle", 0.96, 1.5),
    row("addition", "sequential", "reference", 0.98, 8.0, seed=1),
    row("text", "sequential", "reference", 0.9, 16.0, quality=40.0, metric="gen_perplexity", hib=False,
        metrics={"gen_perplexity": 40.0}),
    row("text", "fast_dllm (τ=0.9)", "baseline", 0.8, 6.0, quality=40.2, metric="gen_perplexity", hib=False,
        metrics={"gen_perplexity": 40.2}),
    row("text", "eb", "baseline", 0.7, 5.0, quality=55.0, metric="gen_perplexity", hib=False,
        metrics={"gen_perplexity": 55.0}),
]


def test_pareto_front_both_orientations():
    pts = [(8.0, 0.96), (3.0, 0.95), (2.0, 0.80), (4.0, 0.70), (2.5, 0.90), (3.5, 0.97)]
    assert pareto_front(pts) == [2, 4, 1, 5]
    assert pareto_front([(1.0, 40.0), (2.0, 30.0), (3.0, 35.0)], higher_is_better=False) == [0, 1]


def test_aggregate_averages_seeds_and_keeps_the_max_memory(tmp_path):
    rows = aggregate(find_runs([make_run(tmp_path, ROWS)]))
    seq = next(r for r in rows if r["task"] == "addition" and r["strategy"] == "sequential")
    assert seq["accuracy"] == pytest.approx(0.97) and seq["seeds"] == [0, 1] and seq["peak_mem_mb"] == 4.0
    assert seq["accuracy_std"] == pytest.approx(0.01)
    h = headline([r for r in rows if r["task"] == "addition"])
    assert h["best"]["strategy"] == "margin_topk + lookahead" and h["oracle"]["strategy"] == "oracle"
    h = headline([r for r in rows if r["task"] == "text"])
    assert h["best"]["strategy"] == "fast_dllm (τ=0.9)"  # within 1 % of the reference's perplexity


def test_report_markdown_json_and_plots(tmp_path):
    run = make_run(tmp_path / "runs", ROWS)
    out = write_report([tmp_path / "runs"], tmp_path / "docs", command="adec report --runs runs --out docs")
    md = out["markdown"].read_text()
    for png in (tmp_path / "docs" / "plots").glob("*.png"):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert sorted(p.name for p in (tmp_path / "docs" / "plots").glob("*.png")) == \
        ["benchmark-addition.png", "benchmark-text.png"]
    assert "Test CPU 9000, 2 cores" in md and "torch 2.13.0" in md
    assert "`adec run experiments/bench.yaml`" in md and "seeds: [0, 1]" in md
    section = md[md.index("## addition"):]
    assert section.index("![addition") < section.index("| strategy | AUP | kind | lookahead | quality: "
                                                       "accuracy")
    assert "| margin_topk + lookahead | 221.7 | heuristic | yes | 0.970 |" in section  # one point: (8 / 3.5) × 97
    assert "quality: gen_perplexity" in md
    rows = json.loads(out["json"].read_text())["rows"]
    assert len(rows) == 10
    for r in rows:
        assert {"task", "strategy", "kind", "accuracy", "nfe", "tpf", "ms_per_token", "peak_mem_mb"} <= set(r)
        assert r["kind"] in ("reference", "baseline", "heuristic", "tuned", "learned", "oracle")
        assert 0.0 <= r["accuracy"] <= 1.0
    assert run.is_dir()


def test_report_needs_a_run(tmp_path):
    with pytest.raises(ReportError, match="adec run"):
        write_report([tmp_path], tmp_path / "docs")


def test_report_of_a_real_run(tmp_path):
    """adec run on a tiny experiment, then adec report on its folder (the commands a user types)."""
    import yaml

    from adaptive_decoding.framework.cli.main import main

    doc = {"name": "rep", "n": 6, "batch_size": 6, "tasks": ["addition"],
           "model": {"factory": "adaptive_decoding.experiments.cells:tiny_model",
                     "kwargs": {"task": "{task}", "train_steps": 20}},
           "strategies": [{"controller": "sequential"},
                          {"controller": "fast_dllm", "params": {"threshold": 0.5}},
                          {"controller": "oracle"}]}
    path = tmp_path / "rep.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--wandb", "disabled",
                 "--no-progress"]) == 0
    assert main(["report", "--runs", str(tmp_path / "runs" / "rep"), "--out", str(tmp_path / "docs")]) == 0
    png = tmp_path / "docs" / "plots" / "benchmark-addition.png"
    assert png.is_file() and png.stat().st_size > 10_000
    rows = json.loads((tmp_path / "docs" / "benchmark.json").read_text())["rows"]
    assert [r["kind"] for r in rows] == ["reference", "baseline", "oracle"]
    seq, fast, oracle = rows
    assert oracle["accuracy"] == seq["accuracy"] and oracle["nfe"] <= seq["nfe"]  # the oracle reproduces the reference


def point(strategy, acc, nfe, value):
    """A point of the fast_dllm threshold sweep, as adec run writes it (curve = the sweep's base label)."""
    r = row("addition", strategy, "baseline", acc, nfe)
    r.update(curve="fast_dllm", sweep={"threshold": value})
    return r


CURVE_ROWS = [
    row("addition", "sequential", "reference", 0.96, 8.0),                 # ρ = 1
    point("fast_dllm (threshold=0.5)", 0.80, 1.6, 0.5),                     # ρ = 5, 15 points below: dropped
    point("fast_dllm (threshold=0.9)", 0.95, 4.0, 0.9),                     # ρ = 2
    point("fast_dllm (threshold=0.7)", 0.92, 2.0, 0.7),                     # ρ = 4
    row("addition", "eb", "baseline", 0.90, 4.0),                           # ρ = 2, a single point
    row("addition", "oracle", "oracle", 0.96, 2.0),                         # ρ = 4
]


def test_report_groups_a_sweep_into_one_curve_and_writes_its_aup(tmp_path, monkeypatch):
    import matplotlib.axes

    lines = []
    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, x, y,
                        **kw: lines.append((kw.get("label"), list(x))) or real_plot(self, x, y, **kw))
    make_run(tmp_path / "runs", CURVE_ROWS)
    out = write_report([tmp_path / "runs"], tmp_path / "docs")
    data = json.loads(out["json"].read_text())
    task = data["tasks"]["addition"]
    # y_max = 96 (sequential and oracle). fast_dllm: (2, 95), (4, 92); (5, 80) < 95 − 5 is dropped:
    #   W(95) = exp(−3·(1 − 95/96)) = 0.969233, W(92) = exp(−3·(1 − 92/96)) = 0.882497
    #   AUP = 2·95 + ½·(4 − 2)·(92·0.882497 + 95·0.969233) = 190 + 81.189715 + 92.077157 = 363.266872
    assert task["y_max"] == pytest.approx(96.0) and task["quality_metric"] == "accuracy" and task["note"] is None
    assert task["aup"] == {"sequential": pytest.approx(96.0),
                           "fast_dllm": pytest.approx(363.266872, abs=1e-5),
                           "eb": pytest.approx(180.0), "oracle": pytest.approx(384.0)}
    assert task["curves"]["fast_dllm"] == ["fast_dllm (threshold=0.9)", "fast_dllm (threshold=0.7)",
                                           "fast_dllm (threshold=0.5)"]
    rows = {r["strategy"]: r for r in data["rows"]}
    assert rows["fast_dllm (threshold=0.7)"]["curve"] == "fast_dllm"
    assert rows["fast_dllm (threshold=0.7)"]["sweep"] == {"threshold": 0.7}
    assert rows["fast_dllm (threshold=0.5)"]["aup"] == task["aup"]["fast_dllm"]
    assert rows["eb"]["curve"] == "eb" and rows["eb"]["sweep"] is None
    md = out["markdown"].read_text()
    assert "highest AUP: fast_dllm (363.3)" in md  # the oracle is a bound, not a candidate
    table = [line.split(" | ")[0][2:] for line in md[md.index("| strategy | AUP"):].splitlines()[2:8]]
    assert table == ["fast_dllm (threshold=0.9)", "fast_dllm (threshold=0.7)", "fast_dllm (threshold=0.5)",
                     "eb", "sequential", "oracle"]  # by AUP, a curve by tokens per forward, the oracle last
    assert "| fast_dllm (threshold=0.9) | 363.3 | baseline |" in md
    curves = [line for line in lines if line[0] != "Pareto front"]  # ax.step draws through ax.plot
    assert curves == [("fast_dllm (AUP 363.3)", [2.0, 4.0, 5.0])]  # one line; single strategies are markers


def test_a_swept_run_resumes_point_by_point_and_reports_one_curve(tmp_path, monkeypatch):
    """adec run on a sweep, a rerun that decodes nothing, then adec report. The designed toy denoiser
    needs no training but solves nothing (accuracy 0, so every AUP is 0 here): the AUP numbers are
    checked on hand-made rows above, this test checks the pipeline and the grouping."""
    import yaml

    import adaptive_decoding.experiments.runner as E
    from adaptive_decoding.experiments.aup import task_aup
    from adaptive_decoding.framework.cli.main import main

    doc = {"name": "sweep", "n": 6, "batch_size": 6, "tasks": ["addition"],
           "model": {"factory": "adaptive_decoding.experiments.cells:toy_model", "kwargs": {"task": "{task}"}},
           "strategies": [{"controller": "sequential"},
                          {"controller": "fast_dllm", "sweep": {"threshold": [0.95, 0.6, 0.3]}}]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--out", str(runs), "--wandb", "disabled", "--no-progress"]) == 0
    summary = json.loads((runs / "sweep" / "summary.json").read_text())
    assert [(r["strategy"], r["curve"], r["sweep"]) for r in summary] == [
        ("sequential", "sequential", None),
        ("fast_dllm (threshold=0.95)", "fast_dllm", {"threshold": 0.95}),
        ("fast_dllm (threshold=0.6)", "fast_dllm", {"threshold": 0.6}),
        ("fast_dllm (threshold=0.3)", "fast_dllm", {"threshold": 0.3})]
    calls = []
    monkeypatch.setattr(E, "evaluate_cell", lambda cell, *a, **k: calls.append(cell.id))
    assert main(["run", str(path), "--out", str(runs), "--wandb", "disabled", "--no-progress"]) == 0
    assert calls == []  # every point is a finished cell of its own

    assert main(["report", "--runs", str(runs / "sweep"), "--out", str(tmp_path / "docs")]) == 0
    data = json.loads((tmp_path / "docs" / "benchmark.json").read_text())
    task = data["tasks"]["addition"]
    assert set(task["aup"]) == {"sequential", "fast_dllm"} and len(task["curves"]["fast_dllm"]) == 3
    tpf = [next(r["tpf"] for r in data["rows"] if r["strategy"] == s) for s in task["curves"]["fast_dllm"]]
    assert tpf == sorted(tpf) and tpf[-1] > tpf[0]  # a lower threshold commits more per forward
    points = {c: [(r["tpf"], 100 * r["accuracy"]) for r in data["rows"] if r["curve"] == c]
              for c in task["aup"]}
    expected, y_max = task_aup(points)
    assert task["y_max"] == pytest.approx(y_max) and task["aup"] == pytest.approx(expected)
    assert (tmp_path / "docs" / "plots" / "benchmark-addition.png").stat().st_size > 10_000
