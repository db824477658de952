"""Revocable decoding: the shadow block, WINO's and ReMDM's exact decisions, the loop's re-mask bounds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.denoise import verification_logits, window_logits
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.testing.toys import JointDenoiser

# a, b, c, x, y, z, e = 0..6 (as in test_lookahead): p(first) a .42 b .37 c .21, p(second) x .42 z .37 y .21
GARDEN = dict(answers=[[0, 3, 6], [0, 4, 6], [2, 3, 6], [1, 5, 6]], weights=[0.21, 0.21, 0.21, 0.37],
              vocab_size=10, prompt_length=1)
PROMPT = [7]


def tiny(n_layers: int = 1) -> TinyDenoiser:
    torch.manual_seed(0)
    cfg = TinyConfig(vocab_size=20, mask_token_id=19, pad_token_id=0, eos_token_id=2, max_len=40, d_model=32,
                     n_layers=n_layers, n_heads=2, d_ff=64)
    return TinyDenoiser(cfg).eval()


def _own_llada(tmp_path, n_layers: int):
    build = Path(__file__).resolve().parents[1] / "fixtures" / "real_format" / "build.py"
    spec = importlib.util.spec_from_file_location("_adec_build_revocable", build)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from adaptive_decoding.framework.models.arch import load_architecture
    from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

    arch = load_architecture(module.build_llada(tmp_path / "ckpt", seed=3, n_layers=n_layers, init_std=0.3))
    return OwnArchitectureDenoiser(arch, mask_token_id=arch.mask_token_id, vocab_size=arch.vocab_size,
                                   eos_token_id=arch.eos_token_id, pad_token_id=arch.pad_token_id)


# ---------------------------------------------------------------------- the shadow block
@pytest.mark.parametrize("which", ["tiny", "llada"])
def test_shadow_block_predicts_each_column_as_if_it_were_masked(which, tmp_path):
    # with one layer the shadow slot sees exactly the keys a masked column would: equal to a probe forward
    model = tiny(1) if which == "tiny" else _own_llada(tmp_path, 1)
    mask = int(model.mask_token_id)
    torch.manual_seed(1)
    x = torch.randint(3, 18, (2, 14))
    x[1, 12:] = int(model.pad_token_id)
    attn = torch.ones_like(x)
    attn[1, 12:] = 0  # a padded row: its padding is no key of the shadow either
    cols = torch.arange(6, 12).expand(2, 6)
    win, shadow = model.shadow_logits(x, attn, cols)
    assert torch.allclose(win, window_logits(model, x, attn, cols), atol=1e-5)
    for j in range(6):
        probe = x.clone()
        probe[:, 6 + j] = mask
        want = window_logits(model, probe, attn, cols[:, j:j + 1])[:, 0]
        assert torch.allclose(shadow[:, j], want, atol=1e-5), j
    # the engine's helper: one shadow forward per probing row; a plain model pays one forward per probe
    probe_mask = torch.tensor([[True, False, True, False, False, False], [False] * 6])
    _, cost = verification_logits(model, x, attn, cols, probe_mask)
    assert cost.tolist() == [1, 0]


def test_deeper_shadow_differs_from_a_probe_so_the_test_above_can_fail():
    model = tiny(2)
    x = torch.randint(3, 18, (1, 14))
    cols = torch.arange(6, 12)[None]
    _, shadow = model.shadow_logits(x, torch.ones_like(x), cols)
    probe = x.clone()
    probe[0, 6] = 19
    assert not torch.allclose(shadow[:, 0], window_logits(model, probe, torch.ones_like(x), cols[:, :1])[:, 0],
                              atol=1e-4)


# ---------------------------------------------------------------------- WINO and ReMDM decisions
def test_wino_drafts_low_and_remasks_what_fails_verification():
    # canvas columns: prompt 0, generation 1-3. Step 1 commits e (p 1 ≥ τ₁). Step 2: a/x tie at .42
    # < τ₁, so the best one, a (column 1). Step 3 on [a, M, e]: a with its column hidden has p .42 <
    # τ₂ = .5: re-masked, while x|a (.5) is committed. Step 4 on [M, x, e]: x hidden has p .42:
    # re-masked, a|x (.5) committed. The two flip until a reaches remask_per_position = 2 (step 5);
    # step 6 commits y|a (.5 = τ₂, kept). A designed oscillation that only the loop's bound ends.
    m = JointDenoiser(**GARDEN)
    wino = build_controller("wino", draft_threshold=0.9, verify_threshold=0.5, progress_guard=False)
    res = decode(m, [PROMPT], wino, DecodeConfig(gen_length=3), trace=True)
    assert [r["commit"][0].nonzero().squeeze(1).tolist() for r in res.trace] == [[3], [1], [2], [1], [2], [1]]
    assert [r["remask"][0].nonzero().squeeze(1).tolist() for r in res.trace] == [[], [], [1], [2], [1], []]
    assert res.generated.tolist() == [[0, 4, 6]] and res.remasks.tolist() == [3]
    # NFE: 6 steps plus one probe forward per verified token (0+1+2+2+2+2 = 9): no shadow block here
    assert res.nfe.tolist() == [15] and int(res.nfe.sum()) == m.rows_seen
    # with the progress guard a step that commits one token re-masks none: plain one-at-a-time decoding
    guarded = decode(JointDenoiser(**GARDEN), [PROMPT], build_controller("wino", draft_threshold=0.9,
                                                                          verify_threshold=0.5), DecodeConfig(gen_length=3))
    assert guarded.remasks.tolist() == [0] and guarded.steps.tolist() == [3]


def test_wino_rival_margin_keeps_a_mode_among_equals_and_revokes_an_outvoted_draft():
    from adaptive_decoding.framework.engine.features import FeatureOptions, StepWindow, compute_features

    logits = torch.zeros(1, 4, 10)
    logits[0, 3, 0] = 9.0  # slot 3 masked and confident: this step's draft
    last = torch.tensor([[False, False, False, True]])
    zero = torch.zeros(1, dtype=torch.long)
    window = StepWindow(eligible=last, masked=last, rel=torch.arange(4)[None], block_start=zero,
                        block_end=torch.full((1,), 4), block_index=zero, block_masked_at_start=torch.full((1,), 4),
                        step=zero, block_step=zero)
    f = compute_features(logits, window, FeatureOptions(gen_length=4))
    f.revocable = torch.tensor([[True, True, True, False]])
    # slot 0: one of three equal modes (p .34, favourite .35); slot 1: outvoted (p .30, favourite .65);
    # slot 2: verified (p .97)
    f.verify_prob = torch.tensor([[0.34, 0.30, 0.97, float("nan")]])
    f.verify_top_prob = torch.tensor([[0.35, 0.65, 0.97, float("nan")]])
    wino = build_controller("wino", draft_threshold=0.9, verify_threshold=0.9, progress_guard=False)
    assert wino.decide(f, None).remask.tolist() == [[True, True, False, False]]  # WINO's rule: both below τ₂
    wino.set_params(rival_margin=0.1)
    assert wino.decide(f, None).remask.tolist() == [[False, True, False, False]]  # only the outvoted one
    # the garden's a/x flip-flop: each re-masked token was its slot's favourite, so δ = 0 keeps it
    res = decode(JointDenoiser(**GARDEN), [PROMPT], build_controller(
        "wino", draft_threshold=0.9, verify_threshold=0.5, progress_guard=False, rival_margin=0.0),
        DecodeConfig(gen_length=3))
    assert res.remasks.tolist() == [0] and res.steps.tolist() == [3]
    with pytest.raises(ParameterError, match="rival_margin=1.5"):
        build_controller("wino", rival_margin=1.5)


def test_wino_verifies_inside_the_steps_own_forward_on_a_model_with_a_shadow_block():
    model = tiny(2)
    wino = build_controller("wino", draft_threshold=0.9, verify_threshold=0.99, progress_guard=False)
    res = decode(model, [[3, 4, 5], [6, 7]], wino, DecodeConfig(gen_length=12, block_length=6))
    assert (res.nfe == res.steps).all() and int(res.remasks.sum()) > 0  # one forward a step, re-masks happen
    for mode in ("prefix", "dual"):  # under a KV cache the shadow block rides in the cached forward too
        cfg = DecodeConfig(gen_length=12, block_length=6, cache=mode)
        cached = decode(model, [[3, 4, 5], [6, 7]], wino, cfg)
        assert (cached.nfe == cached.steps).all() and int(cached.remasks.sum()) > 0, mode
        for i, prompt in enumerate([[3, 4, 5], [6, 7]]):  # ragged rows: a batch of N equals N single runs
            single = decode(model, [prompt], wino, cfg)
            assert torch.equal(single.generated[0], cached.generated[i]) and single.nfe[0] == cached.nfe[i], mode
    # a model without a shadow block under the cache: one counted probe forward per verified token
    from adaptive_decoding.framework.testing.toys import CachedToy

    toy = CachedToy(JointDenoiser(**GARDEN))
    probed = decode(toy, [PROMPT], build_controller("wino", draft_threshold=0.9, verify_threshold=0.5,
                                                    progress_guard=False), DecodeConfig(gen_length=3, cache="dual"))
    assert (probed.nfe > probed.steps).all()


def test_verification_by_exact_probes_decides_as_the_one_layer_shadow_and_counts_each_probe():
    model = tiny(1)  # one layer: the shadow block equals a probe (first test), so the decisions agree
    wino = build_controller("wino", draft_threshold=0.9, verify_threshold=0.99, progress_guard=False)
    prompts = [[3, 4, 5], [6, 7]]
    shadow = decode(model, prompts, wino, DecodeConfig(gen_length=12, block_length=6))
    probe = decode(model, prompts, wino, DecodeConfig(gen_length=12, block_length=6, verification="probe"))
    assert int(shadow.remasks.sum()) > 0 and torch.equal(shadow.generated, probe.generated)
    assert torch.equal(shadow.remasks, probe.remasks) and torch.equal(shadow.steps, probe.steps)
    assert (shadow.nfe == shadow.steps).all() and (probe.nfe > probe.steps).all()  # one forward a probe
    with pytest.raises(ParameterError, match="verification='exact'.*'shadow', 'probe'"):
        DecodeConfig.build(verification="exact")


@pytest.mark.parametrize("which", ["tiny", "llada"])
@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_shadow_block_equals_the_uncached_one_on_a_fresh_cache(which, mode, tmp_path):
    # the refresh keeps only the real columns; a cached forward on the canvas the cache was built from
    # sees exactly the keys of the uncached one, the shadow slots' own keys included (ephemeral)
    model = tiny(2) if which == "tiny" else _own_llada(tmp_path, 2)
    torch.manual_seed(4)
    x = torch.randint(3, 18, (2, 16))
    x[1, 14:] = int(model.pad_token_id)
    attn = torch.ones_like(x)
    attn[1, 14:] = 0
    cols = torch.arange(6, 12).expand(2, 6)
    win, shadow = model.shadow_logits(x, attn, cols)
    w2, s2, cache = model.shadow_window_logits(x, attn, cols, use_cache=True)
    assert torch.allclose(w2, win, atol=1e-5) and torch.allclose(s2, shadow, atol=1e-5)
    _, plain = model.window_logits(x, attn, cols, use_cache=True)
    assert cache.length == x.shape[1] and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(cache.keys, plain.keys))
    lengths = attn.sum(1)
    if mode == "prefix":
        query = 6 + torch.arange(10)[None].expand(2, 10)
        valid = query < lengths[:, None]
        query = torch.where(valid, query, (lengths - 1)[:, None].expand_as(query))
    else:
        query, valid = cols, torch.ones_like(cols, dtype=torch.bool)
    w3, s3, _ = model.shadow_window_logits(x, attn, cols, cache=cache.clone(), query_cols=query, query_valid=valid)
    assert torch.allclose(w3, win, atol=1e-4) and torch.allclose(s3, shadow, atol=1e-4)
    with pytest.raises(ValueError, match="ephemeral=3 needs a cache"):
        model.core(x[:, :4], ephemeral=3)


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_verified_around_fast_dllm_is_wino_token_for_token(cache):
    # WINO = Fast-dLLM's threshold rule drafting + the narrow-out; the wrapper composes the same two
    model = tiny(2)
    prompts = [[3, 4, 5], [6, 7]]
    cfg = DecodeConfig(gen_length=12, block_length=6, cache=cache)
    for guard, delta in [(False, None), (True, None), (False, 0.05)]:
        wino = build_controller("wino", draft_threshold=0.9, verify_threshold=0.99, progress_guard=guard,
                                rival_margin=delta)
        wrapped = build_controller("verified", inner="fast_dllm", inner_params={"threshold": 0.9},
                                   verify_threshold=0.99, progress_guard=guard, rival_margin=delta)
        a, b = decode(model, prompts, wino, cfg), decode(model, prompts, wrapped, cfg)
        assert torch.equal(a.generated, b.generated) and torch.equal(a.nfe, b.nfe), (guard, delta)
        assert torch.equal(a.remasks, b.remasks), (guard, delta)
        if not guard and delta is None:  # the plain rule re-masks on this model: the comparison has teeth
            assert int(a.remasks.sum()) > 0
    # the garden's designed flip-flop, on exact probes: the same six steps as WINO's own test
    wrapped = build_controller("verified", inner="fast_dllm", inner_params={"threshold": 0.9},
                               verify_threshold=0.5, progress_guard=False)
    res = decode(JointDenoiser(**GARDEN), [PROMPT], wrapped, DecodeConfig(gen_length=3), trace=True)
    assert [r["remask"][0].nonzero().squeeze(1).tolist() for r in res.trace] == [[], [], [1], [2], [1], []]


def test_verified_lets_its_inner_controller_draft_and_refuses_a_revocable_one():
    # around margin_topk (one commit a step at eta 1: no margin exceeds it) with τ₂ = 0 nothing is revoked
    model = tiny(2)
    cfg = DecodeConfig(gen_length=12, block_length=6)
    inner = decode(model, [[3, 4, 5]], build_controller("margin_topk", eta=1.0, depth=0), cfg)
    kept = decode(model, [[3, 4, 5]], build_controller("verified", inner="margin_topk",
                                                        inner_params={"eta": 1.0, "depth": 0},
                                                        verify_threshold=0.0), cfg)
    assert torch.equal(inner.generated, kept.generated) and kept.remasks.tolist() == [0]
    with pytest.raises(ParameterError, match="verified.inner='wino' is revocable"):
        build_controller("verified", inner="wino")
    with pytest.raises(ParameterError, match="verify_threshold=2"):
        build_controller("verified", verify_threshold=2.0)


def test_remdm_remasks_the_least_confident_earlier_token_and_is_seeded():
    m = JointDenoiser(**GARDEN)
    ctrl = build_controller("remdm", threshold=0.9, eta=1.0, start=0.0, max_per_step=1)
    res = decode(m, [PROMPT] * 3, ctrl, DecodeConfig(gen_length=3), seeds=[0, 1, 2], trace=True)
    assert (res.generated != m.mask_token_id).all() and (res.remasks >= 1).any()
    for r in res.trace:  # σ = η·(1 − ψ) is 0 for e (committed at p = 1, canvas column 3): never re-masked
        assert not r["remask"][:, 3].any()
    again = decode(JointDenoiser(**GARDEN), [PROMPT] * 3, ctrl, DecodeConfig(gen_length=3), seeds=[0, 1, 2])
    assert torch.equal(again.generated, res.generated) and torch.equal(again.nfe, res.nfe)


# ---------------------------------------------------------------------- the loop's bounds
class Flipper(Controller):
    """Adversarial: commits one token a step and re-masks every revocable one, forever if allowed."""

    revocable = True
    params: dict = {}

    def __init__(self) -> None:
        pass

    def decide(self, f, state):
        commit = select_topk(f.confidence, f.eligible, 1)
        return Decision(commit=commit, remask=f.revocable.clone())


@pytest.mark.parametrize("budget, per_position", [(None, 2), (5, 2), (0, 2), (50, 1)])
def test_remasking_terminates_on_an_adversarial_controller(budget, per_position):
    g = 3
    m = JointDenoiser(**GARDEN)
    cfg = DecodeConfig(gen_length=g, remask_budget=budget, remask_per_position=per_position)
    res = decode(m, [PROMPT, PROMPT], Flipper(), cfg)
    r = cfg.effective_remask_budget
    assert (res.generated != m.mask_token_id).all()  # it ended, fully decided
    cap = min(r, g * per_position)  # the per-sample budget, or every position's own cap
    assert (res.remasks <= cap).all() and ((res.remasks > 0) == (cap > 0)).all()
    assert torch.equal(res.steps, g + res.remasks)  # one commit a step: G + re-masks steps, within G + budget
    assert (res.steps <= g + r).all() and int(res.nfe.sum()) == m.rows_seen


def test_remask_bounds_are_validated():
    with pytest.raises(ParameterError, match="remask_budget=-1"):
        DecodeConfig(remask_budget=-1).validate()
    with pytest.raises(ParameterError, match="remask_per_position=-2"):
        DecodeConfig(remask_per_position=-2).validate()
    with pytest.raises(ParameterError, match="draft_threshold=1.5"):
        build_controller("wino", draft_threshold=1.5)
    with pytest.raises(ParameterError, match="max_per_step=-1"):
        build_controller("remdm", max_per_step=-1)


def test_a_controller_that_does_not_revoke_decodes_exactly_as_before():
    m = JointDenoiser(**GARDEN)
    a = decode(m, [PROMPT], build_controller("fast_dllm", threshold=0.5), DecodeConfig(gen_length=3))
    b = decode(m, [PROMPT], build_controller("fast_dllm", threshold=0.5), DecodeConfig(gen_length=3, remask_budget=0))
    assert torch.equal(a.generated, b.generated) and torch.equal(a.nfe, b.nfe) and a.remasks.tolist() == [0]
