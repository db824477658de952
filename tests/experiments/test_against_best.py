"""Every learned and lookahead point against the pool of non-learned points (experiments/against_best.py)."""

from __future__ import annotations

import json

import pytest

from adaptive_decoding.experiments.compare import against_best, against_best_markdown
from adaptive_decoding.experiments.report import write_report
from tests.experiments.test_matched import make_run, row

G = 8.0
ROWS = [
    row("t", "sequential", "reference", 0.90, 8.0),
    row("t", "fast_dllm (threshold=0.9)", "baseline", 0.90, 4.0, "fast_dllm"),   # ρ 2
    row("t", "fast_dllm (threshold=0.7)", "baseline", 0.80, 2.0, "fast_dllm"),   # ρ 4
    row("t", "margin", "heuristic", 0.85, 2.5),                                  # ρ 3.2
    dict(row("t", "margin + lookahead", "heuristic", 0.88, 2.2), lookahead={"scorer": "logprob"}),
    row("t", "policy", "learned", 0.90, 2.5),                                    # ρ 3.2
    row("t", "oracle", "oracle", 0.90, 1.0),
]


def test_each_point_meets_the_pool_at_equal_nfe_and_at_equal_accuracy():
    result = against_best(ROWS)
    assert result["pool"] == 3  # the reference, the oracle and the lookahead point are not in it
    assert result["pool_with_lookahead"] == 4  # a learned point meets the lookahead curve too
    got = {q["strategy"]: q for q in result["points"]}
    assert set(got) == {"policy", "margin + lookahead"}
    p = got["policy"]  # at ≤ 2.5 NFE the best is margin + lookahead (0.88); at ≥ 0.90 fast_dllm τ 0.9 (ρ 2, 4 NFE)
    assert (p["best_at_nfe"], p["delta_points"]) == ("margin + lookahead", pytest.approx(2.0))
    assert (p["best_at_acc"], p["tpf_ratio"], p["nfe_ratio"]) == ("fast_dllm (threshold=0.9)", pytest.approx(1.6),
                                                                 pytest.approx(1.6))
    q = got["margin + lookahead"]  # never matched with itself: at ≤ 2.2 NFE only fast_dllm τ 0.7 (0.80)
    assert (q["best_at_nfe"], q["delta_points"]) == ("fast_dllm (threshold=0.7)", pytest.approx(8.0))
    assert q["tpf_ratio"] == pytest.approx((G / 2.2) / 2.0) and q["kind"] == "heuristic" and q["lookahead"]
    md = "\n".join(against_best_markdown("t", result))
    assert "| policy | learned | 0.900 | 2.50 | 3.20 | margin + lookahead (0.880) | +2.0 | fast_dllm (threshold=0.9) (2.00) " \
           "| 1.60 | 1.60 |" in md
    assert "| margin + lookahead | heuristic + lookahead |" in md


def test_a_point_better_than_every_pool_point_has_no_match_at_equal_accuracy():
    rows = ROWS + [row("t", "lucky", "learned", 0.95, 1.5)]
    q = next(q for q in against_best(rows)["points"] if q["strategy"] == "lucky")
    assert q["best_at_nfe"] is None and q["delta_points"] is None  # no pool point with ≤ 1.5 NFE
    assert q["best_at_acc"] is None and q["tpf_ratio"] is None and q["nfe_ratio"] is None
    assert against_best_markdown("t", {"points": [], "pool": 3}) == []


def test_the_report_has_the_section_and_the_json_its_points(tmp_path):
    make_run(tmp_path / "runs", ROWS)
    out = write_report([tmp_path / "runs"], tmp_path / "docs")
    md = out["markdown"].read_text()
    assert "### t: learned and lookahead points against the best non-learned curve" in md
    data = json.loads(out["json"].read_text())
    assert [q["strategy"] for q in data["tasks"]["t"]["against_best"]["points"]] == ["margin + lookahead", "policy"]
