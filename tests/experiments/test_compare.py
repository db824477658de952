"""The comparison layer's core (experiments/compare.py): the typed point and the one matcher, on a
designed pool whose answers are known under every bound."""

from __future__ import annotations

import pytest

from adaptive_decoding.experiments.compare import Point, as_points, match, match_point
from adaptive_decoding.experiments.tables import figure, markdown_table


def pt(strategy, accuracy, nfe, tpf, **kw) -> Point:
    return Point(strategy=strategy, curve=kw.pop("curve", strategy), accuracy=accuracy, quality=accuracy,
                 nfe=nfe, tpf=tpf, **kw)


# a designed pool: a is accurate and slow, b and c tie on tokens per forward (c the more accurate),
# d is fast and poor, e ties a on accuracy with fewer NFE, f has no figures
POOL = [pt("a", 0.90, 20.0, 4.0), pt("b", 0.80, 10.0, 8.0), pt("c", 0.85, 12.0, 8.0), pt("d", 0.50, 4.0, 20.0),
        pt("e", 0.90, 16.0, 4.0), Point(strategy="f", curve="f")]


@pytest.mark.parametrize("floor,expected", [
    (0.95, None),   # nothing reaches it
    (0.90, "e"),    # a and e tie on accuracy and tokens per forward: the fewer NFE (e)
    (0.85, "c"),    # c (8.0) beats a/e (4.0)
    (0.80, "c"),    # b and c tie at 8.0 tokens per forward: the more accurate c
    (0.50, "d"),    # d's 20 tokens per forward
    (0.8 + 1e-12, "c"),  # a float just above 0.8 still admits b's 0.80 (tolerance), c still wins the tie
])
def test_floor_picks_the_most_tokens_per_forward(floor, expected):
    got = match(POOL, floor=floor)
    assert (got.strategy if got else None) == expected


@pytest.mark.parametrize("budget,expected", [
    (3.0, None),    # no point within 3 NFE
    (4.0, "d"),     # exactly the budget counts
    (11.0, "b"),    # b (0.80) within 11, c not
    (16.0, "e"),    # a needs 20: e has a's accuracy at 16 NFE
    (100.0, "e"),   # a and e tie on accuracy: the fewer NFE
])
def test_budget_picks_the_best_accuracy(budget, expected):
    got = match(POOL, budget=budget)
    assert (got.strategy if got else None) == expected


def test_fewest_forwards_objective_and_lower_is_better():
    assert match(POOL, floor=0.85, objective="nfe").strategy == "c"  # 12 NFE, before e (16) and a (20)
    assert match(POOL, floor=0.90, objective="nfe").strategy == "e"
    # perplexity: lower is better, the bound is a ceiling: points at 30 or below, the most tpf
    ppl = [Point("p1", "p1", quality=25.0, tpf=2.0, nfe=8.0), Point("p2", "p2", quality=31.0, tpf=9.0, nfe=2.0),
           Point("p3", "p3", quality=29.0, tpf=5.0, nfe=4.0)]
    assert match(ppl, floor=30.0, on="quality", higher_is_better=False).strategy == "p3"
    assert match(ppl, budget=8.0, on="quality", higher_is_better=False).strategy == "p1"  # the lowest


def test_exactly_one_bound():
    with pytest.raises(ValueError, match="exactly one bound"):
        match(POOL)
    with pytest.raises(ValueError, match="exactly one bound"):
        match(POOL, floor=0.5, budget=10.0)


def test_a_point_against_a_pool():
    q = match_point(pt("x", 0.86, 11.0, 9.0), POOL, "base")
    assert q["base_at_nfe"] == "b" and q["delta_points"] == pytest.approx(6.0)  # 0.86 vs b's 0.80 at ≤ 11 NFE
    assert q["base_at_acc"] == "e"  # only a and e reach 0.86, both at 4.0: the fewer NFE
    assert q["tpf_ratio"] == pytest.approx(9.0 / 4.0) and q["nfe_ratio"] == pytest.approx(16.0 / 11.0)
    lucky = match_point(pt("y", 0.99, 1.0, 50.0), POOL, "best")
    assert lucky["best_at_nfe"] is None and lucky["best_at_acc"] is None and lucky["tpf_ratio"] is None


def test_a_point_from_a_result_row():
    row = {"strategy": "fast_dllm (threshold=0.9)", "curve": "fast_dllm", "kind": "baseline", "task": "sudoku9",
           "accuracy": 0.7, "nfe": 16.0, "tpf": 5.0, "tpf_mean": 12.4, "lookahead": {"scorer": "logprob"},
           "params": {"threshold": 0.9}, "ms_per_token": 0.1}
    p = Point.of(row)
    assert (p.curve, p.kind, p.task, p.quality, p.tpf, p.tpf_mean, p.lookahead) == \
        ("fast_dllm", "baseline", "sudoku9", 0.7, 5.0, 12.4, True)
    bare = Point.of({"strategy": "s", "accuracy": 0.5, "nfe": 2.0, "tpf": 4.0})
    assert bare.curve == "s" and bare.kind == "heuristic" and bare.tpf_mean is None and bare["quality"] == 0.5
    assert as_points([p, row])[0] is p and as_points([row])[0] == p


def test_the_one_formatter_and_table_writer():
    assert [figure(1.23456, 2), figure(3, 1), figure(-0.5, 1, signed=True), figure(2.0, 1, signed=True)] == \
        ["1.23", "3.0", "-0.5", "+2.0"]
    assert [figure(None), figure(float("nan")), figure(float("inf")), figure(True), figure("x")] == ["–"] * 5
    assert markdown_table(["a", "b|c"], [["x|y", 1]]) == ["| a | b\\|c |", "|---|---|", "| x\\|y | 1 |"]
