"""Lookahead and revocable variants against their base curve: pairing, matching without interpolation,
its three targets (gain, ratio, no loss)."""

from __future__ import annotations

import adaptive_decoding.controllers as controllers  # noqa: F401  (registers wino / remdm)
from adaptive_decoding.experiments.compare import (
    against_base,
    against_base_markdown,
    against_base_summary,
    base_of,
)
from tests.experiments.test_matched import TARGETS

BASE = TARGETS.against_base


def row(curve, strategy, acc, nfe, controller="margin_topk", lookahead=None, g=81):
    return {"curve": curve, "strategy": strategy, "accuracy": acc, "nfe": nfe, "tpf": g / nfe,
            "controller": controller, "lookahead": lookahead}


def test_base_pairs_by_label_and_by_revocable_controller():
    curves = {"margin_topk", "margin_topk (T=1)", "fast_dllm", "fast_dllm (T=1)", "wino", "wino (T=1)"}
    assert base_of("margin_topk + lookahead", "margin_topk", curves) == "margin_topk"
    assert base_of("margin_topk (T=1) + lookahead", "margin_topk", curves) == "margin_topk (T=1)"
    assert base_of("wino", "wino", curves) == "fast_dllm"
    assert base_of("wino (T=1)", "wino", curves) == "fast_dllm (T=1)"
    assert base_of("entropy_topk", "entropy_topk", curves) is None  # neither a "+" label nor revocable
    assert base_of("eb + lookahead", "eb", curves) is None  # its base is not on the task


def test_points_are_matched_without_interpolation_and_targets_judged():
    la = {"scorer": "logprob"}
    rows = [row("margin_topk", "m (0.99)", 0.70, 20.0), row("margin_topk", "m (0.9)", 0.45, 6.0),
            row("margin_topk + lookahead", "m+la (0.9)", 0.52, 12.0, lookahead=la),
            # +7 at NFE ≤ 12 (vs 0.45)
            row("margin_topk + lookahead", "m+la (0.7)", 0.30, 5.5, lookahead=la),
            # no base point at NFE ≤ 5.5; 1.09×
            row("fast_dllm", "f (0.99)", 0.70, 10.0, "fast_dllm"),
            row("fast_dllm", "f (0.9)", 0.35, 4.0, "fast_dllm"),
            row("wino", "w (0.99)", 0.70, 8.0, "wino"),  # same accuracy, 10/8 = 1.25× tokens per forward
            row("wino", "w (0.9)", 0.20, 4.5, "wino"),  # 15 points below f (0.9) at NFE ≤ 4.5
            row("fast_dllm + eos_fill", "f+e", 0.99, 3.0,
                "fast_dllm")]  # neither lookahead nor revocable: left out
    out = against_base(rows, aups={"wino": 700.0, "fast_dllm": 650.0}, targets=BASE)
    by = {q["variant"]: q for q in out["points"]}
    assert set(by) == {"m+la (0.9)", "m+la (0.7)", "w (0.99)", "w (0.9)"}
    assert by["m+la (0.9)"]["base_at_nfe"] == "m (0.9)" and abs(by["m+la (0.9)"]["delta_points"] - 7.0) < 1e-9
    assert by["m+la (0.7)"]["delta_points"] is None and by["m+la (0.7)"]["base_at_acc"] == "m (0.9)"
    assert abs(by["w (0.99)"]["tpf_ratio"] - 1.25) < 1e-9 and by["w (0.99)"]["kind"] == "revocable"
    assert abs(by["w (0.9)"]["delta_points"] + 15.0) < 1e-9  # revocable losses do not count against lookahead
    t = out["targets"]
    assert t["gain"]["met"] and set(t["gain"]["by"]) == {"m+la (0.9)", "w (0.99)"}
    assert t["lookahead_no_loss"]["met"] and t["lookahead_no_loss"]["checked"] == 2
    assert t["wino_over_fast_dllm"]["met"] and t["wino_over_fast_dllm"]["by"] == ["wino"]
    md = "\n".join(against_base_markdown("sudoku9", out, BASE))
    assert "+7.0" in md and "1.25" in md and md.count("✓") == 3
    # a lookahead point 2 points below its base at equal NFE fails the second target
    rows.append(row("margin_topk + lookahead", "m+la (0.99)", 0.68, 25.0, lookahead=la))
    worse = against_base(rows, aups={"wino": 600.0, "fast_dllm": 650.0}, targets=BASE)
    assert not worse["targets"]["lookahead_no_loss"]["met"] and worse["targets"]["lookahead_no_loss"]["by"] == ["m+la (0.99)"]
    assert not worse["targets"]["wino_over_fast_dllm"]["met"]
    line = against_base_summary({"a": {"against_base": worse}, "b": {"against_base": {"points": []}}}, [BASE])
    assert "a gain on 1 of 1 task(s): a" in line and "below its base at equal NFE on 1: a" in line


def test_wino_curves_are_listed_in_name_order_whatever_the_set_order():
    """The report is the same text on every run: the WINO line does not follow a set's hash order."""
    names = ["wino (τ₂=0.98)", "wino", "wino (δ=0.2)", "wino (T=1)", "wino (τ₂=0.9)"]
    rows = [row("fast_dllm", "f", 0.7, 10.0, "fast_dllm"), row("fast_dllm (T=1)", "f1", 0.7, 10.0, "fast_dllm")]
    rows += [row(n, f"{n} point", 0.7, 8.0, "wino") for n in names]
    aups = {n: 100.0 + i for i, n in enumerate(names)} | {"fast_dllm": 50.0, "fast_dllm (T=1)": 50.0}
    listed = list(against_base(rows, aups=aups, targets=BASE)["targets"]["wino_over_fast_dllm"]["aups"])
    assert listed == sorted(names)


def test_a_verified_wrapper_is_compared_with_its_own_drafter():
    pol = {"policy": "p.pt"}
    learned = [dict(row("learned", f"l ({t})", a, n, "learned"), params={**pol, "threshold": t},
                    sweep={"threshold": t})
               for t, a, n in [(0.99, 0.70, 20.0), (0.9, 0.40, 8.0)]]
    other = [dict(row("learned other", "o (0.9)", 0.9, 30.0, "learned"),
                  params={"policy": "q.pt", "threshold": 0.9},
                  sweep={"threshold": 0.9})]
    fast = [row("fast_dllm", "f (0.9)", 0.95, 5.0, "fast_dllm")]
    wrapped = [dict(row("verified learned", f"v ({t})", a, n, "verified"),
                    params={"inner": "learned", "inner_params": {**pol, "threshold": t},
                            "verify_threshold": 0.98},
                    sweep={"inner_params.threshold": t}) for t, a, n in [(0.9, 0.55, 8.5)]]
    orphan = [dict(row("verified other", "v2", 0.5, 9.0, "verified"),
                   params={"inner": "learned", "inner_params": {"policy": "r.pt", "threshold": 0.9}})]
    out = against_base(learned + other + fast + wrapped + orphan)
    by = {q["variant"]: q for q in out["points"]}
    assert set(by) == {"v (0.9)"}  # its own drafter's curve; none for a drafter the task did not run
    assert by["v (0.9)"]["base"] == "learned" and by["v (0.9)"]["base_at_nfe"] == "l (0.9)"
    assert abs(by["v (0.9)"]["delta_points"] - 15.0) < 1e-9 and by["v (0.9)"]["kind"] == "revocable"


def test_a_task_without_variants_has_no_section():
    out = against_base([row("margin_topk", "m", 0.7, 10.0)])
    assert out["points"] == [] and against_base_markdown("t", out) == []


def test_the_forwards_ratio_is_not_fooled_by_a_ragged_nfe():
    # the variant spends 2 forwards on half its samples and 30 on the others (mean 16, mean G/NFE 21.6 for
    # G = 81); the base spends 18 on every sample (4.5): per sample means say 4.8x, total forwards 1.125x
    la = {"scorer": "sudoku_rules"}
    lazy = dict(row("margin_topk + lookahead", "lazy (0.95)", 0.72, 16.0, lookahead=la),
                tpf=(81 / 2 + 81 / 30) / 2)
    rows = [row("margin_topk", "m (0.99)", 0.73, 18.0), row("margin_topk", "m (0.98)", 0.70, 15.0), lazy]
    out = against_base(rows, targets=BASE)
    q = out["points"][0]
    assert q["base_at_acc"] == "m (0.99)" and abs(q["tpf_ratio"] - lazy["tpf"] / 4.5) < 1e-9
    assert abs(q["nfe_ratio"] - 18.0 / 16.0) < 1e-9
    md = "\n".join(against_base_markdown("sudoku9", out, BASE))
    assert "forwards ratio" in md and "| 4.80 | 1.12 |" in md
    assert not out["targets"]["gain"]["met"]  # +2 at equal NFE; 4.8x per sample, 1.125x in forwards
