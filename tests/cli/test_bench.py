"""``adec bench``: the one-line reading of its table, and the default run on the packaged model."""

from __future__ import annotations

from framework.cli.bench import reading


def _row(name: str, kind: str, acc: float, tpf: float) -> dict:
    return {"strategy": name, "kind": kind, "accuracy": acc, "tpf": tpf}


def test_reading_names_the_fastest_matched_strategy_and_the_oracles_room():
    rows = [_row("sequential", "reference", 0.90, 1.0), _row("a", "baseline", 0.895, 3.0),
            _row("b", "baseline", 0.92, 2.0), _row("c", "baseline", 0.50, 9.0), _row("oracle", "oracle", 1.0, 7.5)]
    text = reading(rows)
    assert "one token per step reaches 90.0%" in text
    assert "fastest within 1% of it is a at 3.00 tokens per forward" in text  # c is faster but lost 40 points
    assert "the oracle commits 2.5x as many per forward (7.50)" in text
    assert "1 lose accuracy, worst c (50.0%)" in text


def test_reading_without_a_match_or_a_reference():
    assert "no parallel strategy stays within" in reading([_row("s", "reference", 0.9, 1.0), _row("c", "baseline", 0.1, 5.0)])
    assert "no one-token-per-step reference" in reading([_row("c", "baseline", 0.1, 5.0)])
