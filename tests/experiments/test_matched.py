"""The report's matched-accuracy tables (baseline spread and oracle room), on hand-made summary rows: no decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from adaptive_decoding.experiments.compare import matched_markdown, matched_points
from adaptive_decoding.experiments.report import aggregate, find_runs, write_report
from adaptive_decoding.experiments.targets import check_targets

G = 8  # generated positions per sample: tokens per forward = 8 / NFE


def row(task, strategy, kind, acc, nfe, curve=None, quality=None, metric="accuracy", hib=True):
    return {"cell": f"{task}-{strategy}", "task": task, "strategy": strategy, "curve": curve or strategy,
            "sweep": {"p": strategy} if curve else None, "kind": kind, "seed": 0, "n": 50, "accuracy": acc,
            "quality": acc if quality is None else quality, "quality_metric": metric, "higher_is_better": hib,
            "nfe": nfe, "tpf": G / nfe, "ms_per_token": 0.1, "peak_mem_mb": 3.0, "lookahead": None,
            "controller": strategy, "params": {}, "metrics": {}, "model": "tiny-" + task}


#: the benchmark's targets, as experiments/configs/benchmark.yaml declares them
TARGETS_YAML = """targets:
  matched: {baseline_spread: 2.0, oracle_room: 2.0, controller_over_baseline: 1.0,
            learned_over_non_learned: 1.0, learned_over_hand_rule: 0.9, tasks: 3}
  against_base: {gain_points: 5.0, gain_ratio: 1.2, gain_tasks: 2, lookahead_loss_points: 1.0, wino_tasks: 1}
"""
TARGETS = check_targets(yaml.safe_load(TARGETS_YAML)["targets"])[0]


def make_run(folder: Path, rows: list[dict], name: str = "bench", targets: str = TARGETS_YAML) -> Path:
    run = folder / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(rows))
    (run / "experiment.yaml").write_text("name: bench\nseeds: [0]\nn: 50\n" + targets)
    return run


# sudoku: reference 0.90, so a point matches at quality ≥ 0.89 (ρ = tokens per forward = 8 / NFE)
SUDOKU = [
    row("sudoku", "sequential", "reference", 0.90, 8.0),                                 # ρ 1
    row("sudoku", "fast_dllm (threshold=0.9)", "baseline", 0.90, 4.0, "fast_dllm"),      # ρ 2
    row("sudoku", "fast_dllm (threshold=0.7)", "baseline", 0.89, 2.0, "fast_dllm"),
    # ρ 4, exactly 1 point below: matched
    row("sudoku", "fast_dllm (threshold=0.5)", "baseline", 0.70, 1.6, "fast_dllm"),      # ρ 5, too far below
    row("sudoku", "llada", "baseline", 0.91, 5.0),
    # ρ 1.6: the worst baseline
    row("sudoku", "eb", "baseline", 0.60, 2.0),
    # no point within 1 point
    row("sudoku", "margin (k=2)", "heuristic", 0.92, 4.0, "margin"),                     # ρ 2
    row("sudoku", "margin (k=4)", "heuristic", 0.895, 1.6, "margin"),                    # ρ 5: matched
    row("sudoku", "tuned_margin", "tuned", 0.88, 1.0),
    # 2 points below: none
    row("sudoku", "learned_policy", "learned", 0.90, 2.5),                               # ρ 3.2
    row("sudoku", "oracle", "oracle", 0.90, 1.0),                                        # ρ 8
]
# addition: both targets missed (spread 2.5 / 2 = 1.25, room 4 / 2.5 = 1.6)
ADDITION = [
    row("addition", "sequential", "reference", 0.96, 8.0),
    row("addition", "llada", "baseline", 0.96, 4.0),                                     # ρ 2
    row("addition", "fast_dllm", "baseline", 0.955, 3.2),                                # ρ 2.5
    row("addition", "oracle", "oracle", 0.96, 2.0),                                      # ρ 4
]
# text: perplexity, lower is better: no matched table
TEXT = [row("text", "sequential", "reference", 0.9, 16.0, quality=40.0, metric="gen_perplexity", hib=False),
        row("text", "fast_dllm", "baseline", 0.8, 6.0, quality=40.2, metric="gen_perplexity", hib=False)]


def task_rows(rows: list[dict], tmp_path: Path) -> list[dict]:
    return aggregate(find_runs([make_run(tmp_path, rows)]))


def test_matched_points_and_targets_by_hand(tmp_path):
    m = matched_points(task_rows(SUDOKU, tmp_path), targets=TARGETS.matched)
    assert m["note"] is None and m["reference"] == "sequential" and m["threshold"] == pytest.approx(0.89)
    got = [(p["curve"], p["kind"], p["strategy"], p["tpf"]) for p in m["points"]]
    assert got == [("sequential", "reference", "sequential", 1.0),
                   ("fast_dllm", "baseline", "fast_dllm (threshold=0.7)", 4.0),
                   ("llada", "baseline", "llada", 1.6),
                   ("eb", "baseline", None, None),
                   ("margin", "heuristic", "margin (k=4)", 5.0),
                   ("tuned_margin", "tuned", None, None),
                   ("learned_policy", "learned", "learned_policy", 3.2),
                   ("oracle", "oracle", "oracle", 8.0)]
    eb = next(p for p in m["points"] if p["curve"] == "eb")
    assert eb["quality"] is None and eb["nfe"] is None and eb["accuracy"] is None
    t = m["targets"]
    assert t["baseline_spread"] == {"value": pytest.approx(2.5), "target": 2.0, "met": True,
                                    "of": "fast_dllm",
                                    "over": "llada", "of_tpf": 4.0, "over_tpf": 1.6,
                                    "forwards": pytest.approx(2.5)}
    assert t["oracle_room"]["value"] == pytest.approx(2.0) and t["oracle_room"]["met"]  # 8 / 4: exactly the target
    assert (t["oracle_room"]["of"], t["oracle_room"]["over"]) == ("oracle", "fast_dllm")
    c = t["controllers"]
    assert set(c) == {"heuristic", "tuned", "learned"}
    assert c["heuristic"]["value"] == pytest.approx(1.25) and c["heuristic"]["met"]
    assert c["tuned"]["value"] is None and not c["tuned"]["met"]
    assert c["learned"]["value"] == pytest.approx(0.8) and not c["learned"]["met"]
    # the sampling noise of a 1-point match: reference 0.90 on 50 examples, 1.96·√(0.9·0.1/50) = 8.3 points
    assert m["n_examples"] == 50 and m["noise"] == pytest.approx(100 * 1.96 * (0.9 * 0.1 / 50) ** 0.5)
    md = "\n".join(matched_markdown("sudoku", m))
    assert "On 50 examples a cell's accuracy has a 95% interval of about ±8.3 points" in md
    assert "partly its luckiest one" in md


def test_one_baseline_has_no_spread(tmp_path):
    rows = [r for r in ADDITION if r["strategy"] != "fast_dllm"]
    m = matched_points(task_rows(rows, tmp_path), targets=TARGETS.matched)
    assert m["targets"]["baseline_spread"]["value"] is None and not m["targets"]["baseline_spread"]["met"]
    assert m["targets"]["oracle_room"]["value"] == pytest.approx(2.0) and m["targets"]["controllers"] == {}
    md = "\n".join(matched_markdown("addition", m))
    assert "- baseline spread (best / worst baseline): – (needs two baselines within 1 point; target ≥ 2×) ✗" in md


@pytest.mark.parametrize("rows,why", [
    (TEXT, "gen_perplexity is lower-is-better"),
    ([r for r in ADDITION if r["kind"] != "reference"], "no reference"),
    ([row("bleu", "sequential", "reference", 0.5, 8.0, quality=31.0, metric="bleu"),
      row("bleu", "eb", "baseline", 0.5, 4.0, quality=30.5, metric="bleu")],
      "bleu is not a fraction in [0, 1]"),
])
def test_no_matched_table_without_an_accuracy_and_a_reference(tmp_path, rows, why):
    m = matched_points(task_rows(rows, tmp_path), targets=TARGETS.matched)
    assert why in m["note"] and m["points"] == [] and m["targets"] == {}
    md = matched_markdown("t", m)
    assert md[0] == "### t: matched accuracy" and md[2].startswith("No matched-accuracy table: "
                                                                   "") and why in md[2]
    assert not any(line.startswith("|") for line in md)


def test_report_renders_the_matched_tables_and_the_headline_count(tmp_path):
    make_run(tmp_path / "runs", SUDOKU + ADDITION + TEXT)
    out = write_report([tmp_path / "runs"], tmp_path / "docs")
    md = out["markdown"].read_text()
    data = json.loads(out["json"].read_text())
    aup = data["tasks"]["sudoku"]["aup"]
    # single points score ρ·y: llada 1.6·91, eb 4·60, tuned 8·88, learned 3.2·90, oracle 8·90
    assert aup["llada"] == pytest.approx(145.6) and aup["eb"] == pytest.approx(240.0)
    assert aup["learned_policy"] == pytest.approx(288.0) and aup["oracle"] == pytest.approx(720.0)
    # y_max = 92 (margin k=2), W(y) = exp(−3(1 − y/92)). fast_dllm: (2, 90), (4, 89); (5, 70) dropped:
    #   2·90 + ½·2·(89·0.906808 + 90·0.936864) = 180 + 80.706 + 84.318 = 345.02
    # margin: (2, 92), (5, 89.5): 2·92 + ½·3·(89.5·0.921713 + 92·1) = 184 + 261.74 = 445.74
    assert aup["fast_dllm"] == pytest.approx(345.02, abs=0.01) and aup["margin"] == pytest.approx(445.74,
                                                                                                  abs=0.01)

    headline = md[md.index("## Headline"):md.index("\n## ", md.index("## Headline") + 1)]
    assert ("- **Matched accuracy** (targets: baseline spread and oracle room, at no more than 1 point "
            "below one token per step): both targets met on 1 of 2 task(s) with a matched table: sudoku "
            "(baseline spread ≥ 2× on 1, oracle room ≥ 2× on 1; the goal: at least 3 tasks)") in headline

    sudoku = md[md.index("## sudoku"):md.index("\n## ", md.index("## sudoku") + 1)]
    assert sudoku.index("| strategy | AUP |") < sudoku.index("### sudoku: matched accuracy")
    section = sudoku[sudoku.index("### sudoku: matched accuracy"):]
    expected = [
        "Each curve's most parallel point no more than 1 point below the reference (sequential: accuracy ≥ "
        "0.890); tokens per forward compared at that point. On 50 examples a cell's accuracy has a 95% "
        "interval of about ±8.3 points at the reference's value (unpaired; two strategies on the same "
        "examples differ by less), wider than the 1-point tolerance: a curve's matched point is partly its "
        "luckiest one; repeat close comparisons on more examples.",
        "",
        "| curve | kind | matched point | accuracy | NFE | tokens per forward | AUP of the curve |",
        "|---|---|---|---|---|---|---|",
        "| sequential | reference | sequential | 0.900 | 8.00 | 1.00 | 90.0 |",
        "| fast_dllm | baseline | fast_dllm (threshold=0.7) | 0.890 | 2.00 | 4.00 | 345.0 |",
        "| llada | baseline | llada | 0.910 | 5.00 | 1.60 | 145.6 |",
        "| eb | baseline | no point within 1 point | – | – | – | 240.0 |",
        "| margin | heuristic | margin (k=4) | 0.895 | 1.60 | 5.00 | 445.7 |",
        "| tuned_margin | tuned | no point within 1 point | – | – | – | 704.0 |",
        "| learned_policy | learned | learned_policy | 0.900 | 2.50 | 3.20 | 288.0 |",
        "| oracle | oracle | oracle | 0.900 | 1.00 | 8.00 | 720.0 |",
        "",
        "- baseline spread (best / worst baseline): fast_dllm (4.00) / llada (1.60) = 2.50× (target ≥ 2×) ✓",
        "- oracle room (oracle / best baseline): oracle (8.00) / fast_dllm (4.00) = 2.00× (target ≥ 2×) ✓",
        "- best heuristic / best baseline: margin (5.00) / fast_dllm (4.00) = 1.25× (target > 1×) ✓",
        "- best tuned / best baseline: – (needs a tuned curve and a baseline within 1 point; target > 1×) ✗",
        "- best learned / best baseline: learned_policy (3.20) / fast_dllm (4.00) = 0.80× (target > 1×) ✗",
    ]
    assert section.splitlines()[2:2 + len(expected)] == expected

    addition = md[md.index("## addition"):md.index("\n## ", md.index("## addition") + 1)]
    assert "fast_dllm (2.50) / llada (2.00) = 1.25× (target ≥ 2×) ✗" in addition
    assert "oracle (4.00) / fast_dllm (2.50) = 1.60× (target ≥ 2×) ✗" in addition
    text = md[md.index("## text"):]
    assert ("No matched-accuracy table: gen_perplexity is lower-is-better, matching needs an "
            "accuracy." in text)

    tasks = data["tasks"]
    assert tasks["sudoku"]["matched"]["targets"]["baseline_spread"]["met"] is True
    assert tasks["sudoku"]["matched"]["targets"]["oracle_room"]["met"] is True
    assert [p["strategy"] for p in tasks["sudoku"]["matched"]["points"]][:3] == \
        ["sequential", "fast_dllm (threshold=0.7)", "llada"]
    assert tasks["addition"]["matched"]["targets"]["baseline_spread"]["value"] == pytest.approx(1.25)
    assert tasks["addition"]["matched"]["targets"]["oracle_room"]["met"] is False
    assert tasks["text"]["matched"]["points"] == [] and "lower-is-better" in tasks["text"]["matched"]["note"]
    assert data["matched"] == {"tasks": 3, "with_table": 2, "baseline_spread_met": 1, "oracle_room_met": 1,
                               "both_met": 1, "both_met_on": ["sudoku"]}


def test_learned_targets_on_the_hand_made_sudoku(tmp_path):
    """Best learned (ρ 3.2) over the best non-learned, which is the heuristic margin (ρ 5, above every
    baseline): 0.64×, below it; of the hand rule 0.64 < 0.9, missed; over the oracle (ρ 8) 0.40×, for
    scale only. A learned curve at ρ 6.8 meets both targets; one at ρ 4.6 is 92 % of the hand rule but
    below it."""
    m = matched_points(task_rows(SUDOKU, tmp_path), targets=TARGETS.matched)
    t = m["targets"]["learned"]
    assert t["over_non_learned"]["value"] == pytest.approx(3.2 / 5) and not t["over_non_learned"]["met"]
    assert t["over_non_learned"]["over"] == "margin" and t["of_hand_rule"]["over"] == "margin"
    assert t["of_hand_rule"]["value"] == pytest.approx(3.2 / 5) and t["of_hand_rule"]["met"] is False
    assert t["of_oracle"]["value"] == pytest.approx(3.2 / 8) and t["of_oracle"]["met"] is None
    fast = SUDOKU + [row("sudoku", "window_policy", "learned", 0.90, 8 / 6.8)]
    t = matched_points(task_rows(fast, tmp_path / "fast"), targets=TARGETS.matched)["targets"]["learned"]
    assert t["over_non_learned"]["value"] == pytest.approx(6.8 / 5) and t["over_non_learned"]["met"]
    assert t["of_hand_rule"]["met"] and t["of_oracle"]["value"] == pytest.approx(0.85)
    close = SUDOKU + [row("sudoku", "window_policy", "learned", 0.90, 8 / 4.6)]
    t = matched_points(task_rows(close, tmp_path / "close"), targets=TARGETS.matched)["targets"]["learned"]
    assert t["of_hand_rule"]["met"] and not t["over_non_learned"]["met"]
    md = "\n".join(matched_markdown("sudoku", matched_points(task_rows(fast, tmp_path / "md"), targets=TARGETS.matched)))
    assert "best learned / best non-learned (baseline, heuristic, tuned): window_policy (6.80) / margin (5.00) = 1.36× (target ≥ 1×) ✓" in md
    assert "best learned / best hand rule (heuristic): window_policy (6.80) / margin (5.00) = 1.36× (target ≥ 0.9×) ✓" in md
    assert "best learned / oracle: window_policy (6.80) / oracle (8.00) = 0.85× (for scale, no target)" in md
    # no learned curve, no learned targets
    assert "learned" not in matched_points(task_rows(ADDITION, tmp_path / "a"), targets=TARGETS.matched)["targets"]
    # a ragged NFE: the same mean NFE as the ρ 6.8 curve's, a mean G / NFE of 9 (easy samples cost little):
    # per sample 1.80× the margin rule, in total forwards still 1.36×, and the line says both
    ragged = [dict(r, tpf=9.0) if r["strategy"] == "window_policy" else r
              for r in task_rows(fast, tmp_path / "r")]
    t = matched_points(ragged, targets=TARGETS.matched)["targets"]["learned"]["over_non_learned"]
    assert t["value"] == pytest.approx(9.0 / 5) and t["forwards"] == pytest.approx(6.8 / 5)
    md = "\n".join(matched_markdown("sudoku", matched_points(ragged, targets=TARGETS.matched)))
    assert "window_policy (9.00) / margin (5.00) = 1.80× (target ≥ 1×; in total forwards (mean NFE) 1.36×) ✓" in md


def test_learned_table_puts_the_best_learned_beside_the_best_non_learned_and_the_oracle(tmp_path):
    from adaptive_decoding.experiments.studies.learned_table import table

    rows = SUDOKU + [row("sudoku", "window_policy", "learned", 0.90, 8 / 6.8)]
    bench = {"tasks": {"sudoku": {"matched": matched_points(task_rows(rows, tmp_path),
                                                            aups={"window_policy": 500.0, "margin": 400.0,
                                                                  "oracle": 900.0}, targets=TARGETS.matched),
                                  "aup": {"window_policy": 500.0, "margin": 400.0, "oracle": 900.0}}}}
    text = table(bench)
    assert "highest AUP: window_policy 500.0" in text  # the oracle is a bound, not a contender
    assert "| best learned | window_policy | window_policy | 0.900 | 1.18 | 6.80 | 500.0 |" in text
    assert "| best non-learned | margin | margin (k=4) | 0.895 | 1.60 | 5.00 | 400.0 |" in text
    assert "learned / best non-learned (≥ 1×): 1.36× ✓" in text
    assert "learned / oracle (for scale): 0.85×" in text
