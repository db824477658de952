"""The benchmark report: Pareto fronts, aggregation over seeds, markdown with plots first, JSON rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.report import (
    ReportError,
    aggregate,
    find_runs,
    headline,
    pareto_front,
    write_report,
)


def row(task, strategy, kind, acc, nfe, seed=0, lookahead=None, quality=None, metric="accuracy", hib=True, **kw):
    g = 8
    return {"cell": f"{task}-{strategy}-{seed}", "task": task, "strategy": strategy, "kind": kind, "seed": seed,
            "n": 50, "accuracy": acc, "quality": acc if quality is None else quality, "quality_metric": metric,
            "higher_is_better": hib, "nfe": nfe, "tpf": g / nfe, "ms_per_token": 0.5 * nfe / g, "peak_mem_mb": 3.0 + seed,
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
    assert section.index("![addition") < section.index("| strategy | kind | lookahead | quality: accuracy")
    assert "| margin_topk + lookahead | heuristic | yes | 0.970 |" in section
    assert "quality: gen_perplexity" in md
    rows = json.loads(out["json"].read_text())
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

    from framework.cli.main import main

    doc = {"name": "rep", "n": 6, "batch_size": 6, "tasks": ["addition"],
           "model": {"factory": "experiments.cells:tiny_model", "kwargs": {"task": "{task}", "train_steps": 20}},
           "strategies": [{"controller": "sequential"}, {"controller": "fast_dllm", "params": {"threshold": 0.5}},
                          {"controller": "oracle"}]}
    path = tmp_path / "rep.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--out", str(tmp_path / "runs"), "--wandb", "disabled", "--no-progress"]) == 0
    assert main(["report", "--runs", str(tmp_path / "runs" / "rep"), "--out", str(tmp_path / "docs")]) == 0
    png = tmp_path / "docs" / "plots" / "benchmark-addition.png"
    assert png.is_file() and png.stat().st_size > 10_000
    rows = json.loads((tmp_path / "docs" / "benchmark.json").read_text())
    assert [r["kind"] for r in rows] == ["reference", "baseline", "oracle"]
    seq, fast, oracle = rows
    assert oracle["accuracy"] == seq["accuracy"] and oracle["nfe"] <= seq["nfe"]  # the oracle reproduces the reference
