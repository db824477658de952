"""``adec bench``: the one-line reading of its table, and the default run on the packaged model."""

from __future__ import annotations

from adaptive_decoding.framework.cli.bench import reading


def _row(name: str, kind: str, acc: float, tpf: float, nfe: float | None = None) -> dict:
    return {"strategy": name, "kind": kind, "accuracy": acc, "tpf": tpf, "nfe": 81 / tpf if nfe is None else nfe}


def test_reading_names_the_fastest_matched_strategy_and_the_oracles_room():
    rows = [_row("sequential", "reference", 0.90, 1.0), _row("a", "baseline", 0.895, 3.0),
            _row("b", "baseline", 0.92, 2.0), _row("c", "baseline", 0.50, 9.0), _row("oracle", "oracle", 1.0, 7.5)]
    text = reading(rows)
    assert "one token per step reaches 90.0%" in text
    assert "fastest within 1% of it is a at 27.00 forwards (3.00 tokens per forward)" in text  # c lost 40 points
    assert "the oracle commits 2.5x as many per forward (7.50)" in text
    assert "1 lose accuracy, worst c (50.0%)" in text


def test_reading_chooses_by_total_forwards_not_by_the_mean_of_ratios():
    """The main job's case: a decoder that spends few forwards on most puzzles and dozens on some has
    a high per-sample mean of G / NFE but more forwards in all; the reading names the cheaper one."""
    rows = [_row("sequential", "reference", 0.68, 1.0), _row("verifier", "heuristic", 0.72, 5.05, nfe=16.04),
            _row("learned", "learned", 0.68, 6.49, nfe=12.48)]
    rows[1]["tpf_mean"] = 12.44  # flattering, and not what the reading reads
    assert "the fastest within 1% of it is learned at 12.48 forwards (6.49 tokens per forward)" in reading(rows)


def test_reading_without_a_match_or_a_reference():
    assert "no parallel strategy stays within" in reading([_row("s", "reference", 0.9, 1.0), _row("c", "baseline", 0.1, 5.0)])
    assert "no one-token-per-step reference" in reading([_row("c", "baseline", 0.1, 5.0)])


def test_the_newcomer_suite_builds_on_sudoku9_with_its_packaged_policy_and_lookahead():
    """Every row of the main job's suite builds for the default task: the packaged learned policy
    loads by name and the rules-verifier lookahead validates (no decoding here)."""
    from adaptive_decoding.experiments.strategies import NEWCOMER
    from adaptive_decoding.framework.cli.bench import _lookahead
    from adaptive_decoding.framework.engine.controller_io import build_controller

    rows = [s for s in NEWCOMER if s.applies_to("sudoku9")]
    kinds = set()
    for s in rows:
        ctrl = build_controller(s.controller, **s.resolve(81, 81))
        kinds.add(s.kind or ctrl.kind)
        look = _lookahead(s)
        assert (look is None) == (s.lookahead is None)
    assert {"reference", "baseline", "heuristic", "learned", "oracle"} <= kinds
    assert [s.label for s in NEWCOMER if not s.applies_to("phrases")] == [
        "learned (τ=0.996)", "margin_topk + rules verifier (escalate 0.99)",
        "learned + rules verifier (escalate 0.99)"]
    phrases_only = [s for s in NEWCOMER if not s.applies_to("sudoku9")]
    assert [s.label for s in phrases_only] == ["learned window (τ=0.98)"]
    assert build_controller(phrases_only[0].controller, **phrases_only[0].resolve(128, 32)).kind == "learned"


def test_bench_writes_the_accuracy_against_tokens_per_forward_plot(tmp_path, capsys):
    from adaptive_decoding.framework.cli.main import main

    png = tmp_path / "bench.png"
    assert main(["bench", "--controller", "sequential", "--controller", "fast_dllm:threshold=0.9",
                 "--n", "2", "--plot", str(png), "--device", "cpu"]) == 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png}" in capsys.readouterr().err
