"""Exact decisions of the heuristic controllers on designed features."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.controllers.heuristic import (
    ConfidenceLadder,
    EntropyTopK,
    Hybrid,
    MarginTopK,
    bucket_k,
    pow2_buckets,
)
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.testing.toys import ToyDenoiser


def feats(eligible, margin=None, entropy=None, top1=None, step=0, block_step=None, progress=None) -> StepFeatures:
    """Hand-built features: rows of per-position values; anything not given is neutral."""
    eligible = torch.tensor(eligible, dtype=torch.bool)
    b, l = eligible.shape  # noqa: E741
    zeros = torch.zeros(b, l)
    margin = torch.tensor(margin, dtype=torch.float32) if margin is not None else zeros + 0.5
    entropy = torch.tensor(entropy, dtype=torch.float32) if entropy is not None else zeros + 0.5
    top1 = torch.tensor(top1, dtype=torch.float32) if top1 is not None else (margin + 1) / 2
    step_t = torch.as_tensor(step, dtype=torch.long).expand(b).clone()
    bstep = step_t if block_step is None else torch.as_tensor(block_step, dtype=torch.long).expand(b).clone()
    frac = torch.full((b,), 0.5) if progress is None else 1.0 - torch.as_tensor(progress, dtype=torch.float32)
    x0 = torch.arange(l).expand(b, l).clone()
    return StepFeatures(
        x0=x0, confidence=top1, top1_prob=top1, top2_prob=top1 - margin, top1_id=x0, top2_id=x0 + 1,
        margin=margin, entropy=entropy, eligible=eligible, masked=eligible.clone(),
        position=torch.arange(l).expand(b, l).clone(), position_in_block=zeros, frac_masked=frac,
        step=step_t, block_step=bstep, block_index=torch.zeros(b, dtype=torch.long),
        block_start=torch.zeros(b, dtype=torch.long), block_end=torch.full((b,), l, dtype=torch.long),
        block_masked_at_start=torch.full((b,), l, dtype=torch.long), n_eligible=eligible.sum(1),
    )


def state(b: int) -> DecodeState:
    return DecodeState(config=DecodeConfig(gen_length=4), seeds=torch.zeros(b, dtype=torch.long), mask_token_id=15)


def started(ctrl, b):
    s = state(b)
    ctrl.reset(s)
    return s


# ---------------------------------------------------------------------- margin_topk
def test_margin_fixed_eta_commits_above_and_keeps_k_below():
    c = MarginTopK.build(eta=0.3, k=3)
    f = feats([[1, 1, 1, 0], [1, 1, 1, 1]], margin=[[0.8, 0.25, 0.31, 0.9], [0.1, 0.2, 0.05, 0.29]])
    d = c.decide(f, started(c, 2))
    # row 1: no margin exceeds η, so only its best (0.29 at position 3) is committed
    assert d.commit.tolist() == [[True, False, True, False], [False, False, False, True]]
    assert d.k.tolist() == [[1, 3, 1, 1], [3, 3, 3, 1]]
    assert d.k.dtype == torch.long and d.info["eta"].tolist() == pytest.approx([0.3, 0.3])
    assert d.depth.tolist() == [1, 1]
    assert MarginTopK.build(depth=3).decide(f, state(2)).depth.tolist() == [3, 3]


def test_margin_all_confident_and_none_confident_batches():
    c = MarginTopK.build(eta=0.3, k=4)
    all_conf = feats([[1, 1, 1], [1, 0, 1]], margin=[[0.5, 0.9, 0.31], [0.4, 0.0, 0.7]])
    d = c.decide(all_conf, started(c, 2))
    assert torch.equal(d.commit, all_conf.eligible) and d.k.eq(1).all()
    assert d.depth.tolist() == [0, 0]  # nothing kept, nothing to look ahead at
    none_conf = feats([[1, 1, 1], [1, 1, 0]], margin=[[0.1, 0.2, 0.2], [0.0, 0.0, 0.9]])
    d = c.decide(none_conf, started(c, 2))
    # the best margin only (ties go to the lower position); every other eligible position keeps k
    assert d.commit.tolist() == [[False, True, False], [True, False, False]]
    assert d.k.tolist() == [[4, 1, 4], [1, 4, 1]]


def test_margin_row_without_eligible_positions_commits_nothing_and_keeps_eta():
    c = MarginTopK.build(adapt=True)
    s = started(c, 2)
    d = c.decide(feats([[0, 0], [1, 1]], margin=[[0.9, 0.9], [0.5, 0.1]]), s)
    assert d.commit.tolist() == [[False, False], [True, False]]
    assert s.memory["margin_topk.eta"].tolist() == pytest.approx([0.3, 0.9 * 0.3 + 0.1 * 0.3])


def test_margin_ema_updates_step_by_step_per_sample():
    c = MarginTopK.build(eta=0.3, k=2, adapt=True, beta=0.9)
    s = started(c, 2)
    assert s.memory["margin_topk.eta"].tolist() == pytest.approx([0.3, 0.3])
    # step 0: row 0 mean margin (0.8 + 0.2 + 0.1) / 3, row 1 mean 0.05
    d0 = c.decide(feats([[1, 1, 1], [1, 1, 0]], margin=[[0.8, 0.2, 0.1], [0.05, 0.05, 0.0]]), s)
    eta1 = [0.9 * 0.3 + 0.1 * (1.1 / 3), 0.9 * 0.3 + 0.1 * 0.05]
    assert eta1 == pytest.approx([0.306667, 0.275], abs=1e-6)
    assert d0.info["eta"].tolist() == pytest.approx([0.3, 0.3])  # decided with η_0
    assert s.memory["margin_topk.eta"].tolist() == pytest.approx(eta1)
    # step 1: η_1 decides: row 0 commits 0.31 > 0.3067 but not 0.30; row 1 commits 0.28 > 0.275
    d1 = c.decide(feats([[0, 1, 1], [1, 1, 0]], margin=[[0.0, 0.31, 0.30], [0.28, 0.27, 0.0]]), s)
    assert d1.commit.tolist() == [[False, True, False], [True, False, False]]
    assert d1.k.tolist() == [[1, 1, 2], [1, 2, 1]]
    eta2 = [0.9 * eta1[0] + 0.1 * 0.305, 0.9 * eta1[1] + 0.1 * 0.275]
    assert s.memory["margin_topk.eta"].tolist() == pytest.approx(eta2)
    assert eta2 == pytest.approx([0.3065, 0.275], abs=1e-6)


def test_margin_ema_in_the_loop_matches_the_designed_margins():
    conf = [0.9, 0.5, 0.6, 0.45]
    model = ToyDenoiser([3, 4, 5, 6], conf, vocab_size=16, prompt_length=2)
    margins = [c - (1 - c) / 2 for c in conf]  # default second = (1 - conf) / 2
    res = decode(model, [[1, 2]], MarginTopK.build(adapt=True, k=2), DecodeConfig(gen_length=4), trace=True)
    eta, left, expect = 0.3, [0, 1, 2, 3], []
    for rec in res.trace:
        expect.append(eta)
        committed = [p for p in left if margins[p] > eta] or [max(left, key=lambda p: margins[p])]
        eta = 0.9 * eta + 0.1 * sum(margins[p] for p in left) / len(left)
        left = [p for p in left if p not in committed]
    assert not left
    assert [float(r["eta"][0]) for r in res.trace] == pytest.approx(expect, abs=1e-5)
    assert int(res.nfe[0]) == len(expect) == 3  # 0.9→commit; 0.4,0.25,0.175 < η: best one per step


# ---------------------------------------------------------------------- entropy_topk
def test_pow2_buckets_and_bucketing():
    assert pow2_buckets(5) == [1, 2, 4, 5]
    assert pow2_buckets(8) == [1, 2, 4, 8]
    assert pow2_buckets(6) == [1, 2, 4, 6]
    assert pow2_buckets(1) == [1]
    k = torch.tensor([[1, 2, 3, 4, 5, 6, 9]])
    assert bucket_k(k, [1, 2, 4, 5]).tolist() == [[1, 2, 4, 4, 5, 5, 5]]
    assert bucket_k(k, [2, 6]).tolist() == [[2, 2, 6, 6, 6, 6, 6]]


def test_entropy_k_per_position_rounding_clamp_and_buckets():
    c = EntropyTopK.build()  # k_base 3, α 2, τ 1, k_max 5
    h = [[0.1, 0.25, 0.6, 0.74, 0.75, 2.0]]
    # raw k = 3.2, 3.5, 4.2, 4.48, 4.5, 7 -> half-up 3, 4, 4, 4, 5, 7 -> clamp 5 -> buckets {1,2,4,5}
    d = c.decide(feats([[1] * 6], entropy=h), state(1))
    assert d.commit.tolist() == [[True, False, False, False, False, False]]  # α·H/τ < 1/2 only at H = 0.1
    assert d.k.tolist() == [[1, 4, 4, 4, 5, 5]]
    d = EntropyTopK.build(k_max=8, buckets=[2, 6]).decide(feats([[1] * 6], entropy=h), state(1))
    assert d.k.tolist() == [[1, 6, 6, 6, 6, 6]]  # 4 -> 6, 5 -> 6, 7 -> 6 (largest bucket)
    d = EntropyTopK.build(tau=2.0, k_max=8).decide(feats([[1] * 6], entropy=h), state(1))
    # τ = 2: raw = 3.1, 3.25, 3.6, 3.74, 3.75, 5 -> 3, 3, 4, 4, 4, 5 -> buckets {1,2,4,8}
    assert d.commit.tolist() == [[True, True, False, False, False, False]]
    assert d.k.tolist() == [[1, 1, 4, 4, 4, 8]]


def test_entropy_ragged_batch_all_and_none_confident():
    c = EntropyTopK.build(k_base=3, alpha=2.0, tau=1.0, k_max=5)
    f = feats([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]],
              entropy=[[0.01, 0.02, 0.2, 0.0], [1.5, 0.9, 1.2, 0.0], [0.0, 0.0, 0.0, 0.0]])
    d = c.decide(f, state(3))
    assert d.commit.tolist() == [[True, True, True, True], [False, True, False, False], [False] * 4]
    assert d.k.tolist() == [[1, 1, 1, 1], [5, 1, 5, 1], [1, 1, 1, 1]]  # 6 -> 5, 4.8 -> 5 (+ bucket)
    assert d.depth.tolist() == [0, 1, 0]


def test_entropy_buckets_must_increase():
    with pytest.raises(ParameterError, match=r"entropy_topk.buckets=\[4, 2\]"):
        EntropyTopK.build(buckets=[4, 2])
    with pytest.raises(ParameterError, match="alpha=0.0"):
        EntropyTopK.build(alpha=0.0)


# ---------------------------------------------------------------------- confidence ladder
def test_ladder_depths_from_least_confident_and_mean():
    top1 = [[0.95, 0.99], [0.8, 0.99], [0.5, 0.99], [0.9, 0.99], [0.99, 0.6], [0.1, 0.1]]
    eligible = [[1, 1], [1, 1], [1, 1], [1, 1], [1, 1], [0, 0]]
    f = feats(eligible, top1=top1, margin=[[0.5, 0.5]] * 6)
    lad = ConfidenceLadder.build()
    assert lad.depth(f).tolist() == [1, 3, 5, 3, 5, 1]  # 0.9 is not > 0.9; no eligible -> s = 1
    kw = dict(high=0.96, mid=0.7, depth_mid=2, d_max=7)
    # row means 0.97, 0.895, 0.745, 0.945, 0.795; minima 0.95, 0.8, 0.5, 0.9, 0.6
    assert ConfidenceLadder.build(statistic="mean", **kw).depth(f).tolist() == [1, 2, 2, 2, 2, 1]
    assert ConfidenceLadder.build(statistic="min", **kw).depth(f).tolist() == [2, 2, 7, 2, 7, 1]


def test_ladder_wraps_any_commit_rule():
    f = feats([[1, 1, 1]], top1=[[0.95, 0.72, 0.6]], margin=[[0.9, 0.44, 0.2]])
    lad = ConfidenceLadder.build(base={"name": "fast_dllm", "params": {"threshold": 0.7}})
    d = lad.decide(f, started(lad, 1))
    assert d.commit.tolist() == [[True, True, False]] and d.depth.tolist() == [5]
    lad = ConfidenceLadder.build(base={"name": "margin_topk", "params": {"adapt": True, "k": 4}})
    s = started(lad, 1)
    d = lad.decide(f, s)
    assert d.commit.tolist() == [[True, True, False]] and d.k.tolist() == [[1, 1, 4]]
    assert set(s.memory) == {"confidence_ladder/base/margin_topk.eta"}


def test_ladder_parameters_are_checked():
    with pytest.raises(ParameterError, match="mid=0.95 must be ≤ high=0.9"):
        ConfidenceLadder.build(mid=0.95)
    with pytest.raises(ParameterError, match="depth_mid=6"):
        ConfidenceLadder.build(depth_mid=6)
    with pytest.raises(ParameterError, match=r"confidence_ladder.base: .*fast_dllm.threshold=-1"):
        ConfidenceLadder.build(base={"name": "fast_dllm", "params": {"threshold": -1}})


# ---------------------------------------------------------------------- hybrid / switch / compose
MARGIN_VS_ENTROPY = dict(margin=[[0.5, 0.1], [0.5, 0.1]], entropy=[[1.0, 0.05], [1.0, 0.05]])


def test_hybrid_switches_at_the_warmup_step_per_sample():
    h = Hybrid.build(warmup=2)
    s = started(h, 2)
    for step, expect in ((0, [True, False]), (1, [True, False]), (2, [False, True]), (3, [False, True])):
        d = h.decide(feats([[1, 1]] * 2, step=step, **MARGIN_VS_ENTROPY), s)
        assert d.commit.tolist() == [expect] * 2, step
        assert d.info["phase"].tolist() == [int(step >= 2)] * 2
    d = h.decide(feats([[1, 1]] * 2, step=[1, 2], **MARGIN_VS_ENTROPY), s)  # rows at different steps
    assert d.commit.tolist() == [[True, False], [False, True]]
    assert d.k.tolist() == [[1, 3], [5, 1]]  # margin's k = 3; entropy's round(3 + 2·1.0) = 5


def test_hybrid_child_state_is_prefixed_and_only_advances_while_active():
    h = Hybrid.build(warmup=1, margin={"adapt": True})
    s = started(h, 2)
    assert set(s.memory) == {"hybrid/margin/margin_topk.eta"}
    h.decide(feats([[1, 1]] * 2, step=[0, 1], **MARGIN_VS_ENTROPY), s)
    assert s.memory["hybrid/margin/margin_topk.eta"].tolist() == pytest.approx([0.9 * 0.3 + 0.1 * 0.3, 0.3])


def test_hybrid_in_the_loop_switches_at_warmup():
    # margin 0.45 − 0.275 < η and entropy > 0.25: both rules commit one token per step
    model = ToyDenoiser(list(range(3, 11)), [0.45] * 8, vocab_size=16, prompt_length=2)
    res = decode(model, [[1, 2]], Hybrid.build(warmup=3), DecodeConfig(gen_length=8), trace=True)
    assert [int(r["phase"][0]) for r in res.trace] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert "margin.eta" in res.trace[0] and "margin.eta" not in res.trace[3]
    assert res.generated[0].tolist() == list(range(3, 11))


def test_switch_by_config_with_any_controllers_and_clear_errors():
    sw = build_controller("switch", controllers=[{"name": "fast_dllm", "params": {"threshold": 0.3}}, "sequential"],
                          at=[0.5], by="progress")
    f = feats([[1, 1, 1]] * 2, top1=[[0.9, 0.4, 0.2]] * 2, progress=[0.25, 0.5])
    d = sw.decide(f, started(sw, 2))
    assert d.commit.tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(ParameterError, match=r"switch.0: fast_dllm.threshold=-1"):
        build_controller("switch", controllers=[{"name": "fast_dllm", "params": {"threshold": -1}}, "sequential"])
    with pytest.raises(ParameterError, match="unknown controller 'nope'"):
        build_controller("switch", controllers=["nope", "sequential"])
    with pytest.raises(ParameterError, match=r"at=\[2, 1\] must be 2 strictly increasing"):
        build_controller("switch", controllers=["sequential"] * 3, at=[2, 1])
    with pytest.raises(ParameterError, match="switch.controllers"):
        build_controller("switch", controllers=[{"nme": "sequential"}])


def test_two_children_of_one_kind_do_not_share_state():
    sw = build_controller("switch", controllers=[{"name": "margin_topk", "params": {"adapt": True, "eta": 0.1}},
                                                 {"name": "margin_topk", "params": {"adapt": True, "eta": 0.5}}],
                          at=[1])
    s = started(sw, 2)
    sw.decide(feats([[1, 1]] * 2, step=[0, 1], margin=[[0.2, 0.2]] * 2), s)
    assert s.memory["switch/0/margin_topk.eta"].tolist() == pytest.approx([0.9 * 0.1 + 0.02, 0.1])
    assert s.memory["switch/1/margin_topk.eta"].tolist() == pytest.approx([0.5, 0.9 * 0.5 + 0.02])


def test_compose_takes_commit_k_and_depth_from_different_controllers():
    c = build_controller("compose", commit={"name": "fast_dllm", "params": {"threshold": 0.8}},
                         k="entropy_topk", depth="confidence_ladder")
    f = feats([[1, 1, 1]], top1=[[0.95, 0.75, 0.6]], margin=[[0.9, 0.5, 0.2]], entropy=[[0.1, 0.6, 1.0]])
    d = c.decide(f, started(c, 1))
    assert d.commit.tolist() == [[True, False, False]]
    assert d.k.tolist() == [[1, 4, 5]]  # entropy_topk's k where fast_dllm leaves positions open
    assert d.depth.tolist() == [5]  # least-confident top-1 0.6 -> d_max


def test_a_wrapper_keeps_its_inner_memory_under_its_prefix_like_every_composite():
    """One memory rule: a wrapper's inner controller is a child like a switch's, its keys under
    ``"<owner>/inner/"``, evolving exactly as the bare controller's; nested twice, the prefixes stack."""
    f = feats([[1, 1]] * 2, step=[0, 1], margin=[[0.2, 0.6]] * 2)
    bare = build_controller("margin_topk", adapt=True)
    s_bare = started(bare, 2)
    bare.decide(f, s_bare)
    assert not torch.equal(s_bare.memory["margin_topk.eta"], torch.full((2,), 0.3))  # η moved
    guard = build_controller("number_guard", inner="margin_topk", inner_params={"adapt": True}, digit_ids=[])
    s = started(guard, 2)
    assert set(s.memory) == {"number_guard/inner/margin_topk.eta"}
    d = guard.decide(f, s)
    assert d.commit.tolist() == bare.decide(f, started(bare, 2)).commit.tolist()
    assert torch.equal(s.memory["number_guard/inner/margin_topk.eta"], s_bare.memory["margin_topk.eta"])
    sw = build_controller("switch", controllers=[{"name": "number_guard", "params": {
        "inner": "margin_topk", "inner_params": {"adapt": True}, "digit_ids": []}}, "sequential"], at=[5])
    s = started(sw, 2)
    assert set(s.memory) == {"switch/0/number_guard/inner/margin_topk.eta"}
    assert sw.children()["0"].controller.inner_controller().adapt is True
