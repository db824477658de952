"""Exact decisions of the published adaptive decoders on designed confidences, and their loops.

fast_dllm_factor (NVlabs' code, also checked against a loop reference in
test_fast_dllm_factor_reference.py), fast_dllm_pp (with the equal-confidence equivalence to the
factor paper's inequality), cadllm (adaptive blocks keep every loop invariant) and the
temporal_stability heuristic (early commits on a toy whose prediction settles; once named leap).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import CONTROLLERS, DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import FeatureOptions, StepWindow, compute_features
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.testing.toys import ToyDenoiser

V = 32


def feats(conf, eligible=None, x0=None, masked=None, block_step=0, block=None, step=None):
    """StepFeatures whose p(x0) is ``conf`` ``[B, L]`` (the rest spread over V − 1 tokens)."""
    conf = torch.as_tensor(conf, dtype=torch.float64)
    if conf.dim() == 1:
        conf = conf[None]
    b, l = conf.shape  # noqa: E741
    x0 = torch.zeros(b, l, dtype=torch.long) if x0 is None else torch.as_tensor(x0).reshape(b, l)
    eligible = torch.ones(b, l, dtype=torch.bool) if eligible is None else torch.as_tensor(eligible).reshape(b, l)
    masked = eligible if masked is None else torch.as_tensor(masked).reshape(b, l)
    probs = ((1 - conf) / (V - 1))[..., None].expand(b, l, V).clone()
    probs.scatter_(2, x0[..., None], conf[..., None])
    start, end = block if block is not None else (0, l)
    full = lambda v: torch.full((b,), v, dtype=torch.long)  # noqa: E731
    window = StepWindow(eligible=eligible, masked=masked, rel=torch.arange(l)[None].expand(b, l),
                        block_start=full(start), block_end=full(end), block_index=full(0),
                        block_masked_at_start=eligible.sum(1), step=full(step if step is not None else block_step),
                        block_step=full(block_step))
    return compute_features(probs.log().float(), window, FeatureOptions(gen_length=l))


def state(batch=1, gen_length=8, block_length=None):
    s = DecodeState(config=DecodeConfig(gen_length=gen_length, block_length=block_length),
                    seeds=torch.zeros(batch, dtype=torch.long), mask_token_id=V - 1)
    return s


def decide(name, f, st=None, **params):
    ctrl = build_controller(name, **params)
    st = st or state(f.batch_size, f.x0.shape[1])
    ctrl.reset(st)
    return ctrl.decide(f, st)


def positions(mask, row=0):
    return mask[row].nonzero().squeeze(1).tolist()


# --------------------------------------------------------------------------- registry facts
@pytest.mark.parametrize("name, kind", [("fast_dllm_factor", "baseline"), ("fast_dllm_pp", "baseline"),
                                        ("cadllm", "baseline"), ("temporal_stability", "heuristic")])
def test_registered_kinds(name, kind):
    cls = CONTROLLERS.get(name)
    assert cls.kind == kind
    ctrl = build_controller(name)
    assert type(ctrl).build(**ctrl.get_params()) == ctrl  # round trip
    assert set(cls.search_space()) <= set(cls.params)


def test_stability_heuristic_does_not_claim_to_be_leap():
    assert "leap" not in CONTROLLERS and "early_convergence" not in CONTROLLERS
    assert CONTROLLERS.get("stability") is CONTROLLERS.get("temporal_stability")
    doc = CONTROLLERS.get("temporal_stability").__doc__
    assert "not LEAP" in doc.splitlines()[0]


# --------------------------------------------------------------------------- fast_dllm_factor
def test_factor_rule_designed_profile():
    # sorted: 0.95, 0.8, 0.7, 0.3 -> (n+1)(1-c): 0.1, 0.6, 1.2, 3.5 -> n* = 2 with f = 1
    f = feats([0.7, 0.95, 0.3, 0.8])
    assert positions(decide("fast_dllm_factor", f, factor=1.0).commit) == [1, 3]
    # f = 1.5: ranks 2 and 3 pass (0.8 ≥ 0.5, 0.7 ≥ 0.625), only the last fails (0.3 < 0.7):
    # NVlabs' code then commits all four
    assert positions(decide("fast_dllm_factor", f, factor=1.5).commit) == [0, 1, 2, 3]
    # f = 0.05: even n = 1 fails (0.1), still commits the most confident
    assert positions(decide("fast_dllm_factor", f, factor=0.05).commit) == [1]


def test_factor_rule_respects_eligibility_and_rows():
    conf = [[0.99, 0.99, 0.99, 0.99], [0.99, 0.6, 0.99, 0.99]]
    elig = [[True, False, True, True], [False, True, False, False]]
    d = decide("fast_dllm_factor", feats(conf, eligible=elig), factor=1.0)
    assert positions(d.commit, 0) == [0, 2, 3] and positions(d.commit, 1) == [1]
    assert d.info["n_commit"].tolist() == [3, 1]


def _reference_largest_n(sorted_conf, rule):
    """A plain-Python reading of the papers: the largest n whose rule holds, at least 1."""
    best = 1
    for n in range(1, len(sorted_conf) + 1):
        if rule(n, sorted_conf[:n]):
            best = n
    return best


def _paper_factor_n(sorted_conf, factor):
    """The factor *paper's* inequality, strict: the largest n with (n + 1)(1 − c_(n)) < f (≥ 1)."""
    return _reference_largest_n(sorted_conf, lambda n, cs: (n + 1) * (1 - cs[-1]) < factor - 1e-9)


def test_profile_rule_matches_a_plain_reading_of_the_paper_on_random_profiles():
    g = torch.Generator().manual_seed(0)
    conf = 0.3 + 0.7 * torch.rand(64, 12, generator=g, dtype=torch.float64) ** 0.3
    elig = torch.rand(64, 12, generator=g) < 0.7
    elig[:, 0] = True
    f = feats(conf, eligible=elig)
    pp = decide("fast_dllm_pp", f, margin=0.1).info["n_commit"]
    c_feat = f.confidence.double()
    for b in range(64):
        c = sorted(c_feat[b][elig[b]].tolist(), reverse=True)
        assert pp[b] == _reference_largest_n(c, lambda n, cs: max(0.0, sum(cs) - (n - 1)) - (1 - cs[-1]) > 0.1)


# --------------------------------------------------------------------------- fast_dllm_pp
def test_profile_rule_equals_the_papers_factor_inequality_on_equal_confidences():
    """G_n = 1 − (n+1)ε when every c = 1 − ε: fast_dllm_pp(δ) ≡ the paper's (n+1)ε < 1 − δ.
    NVlabs' factor code (fast_dllm_factor) commits a superset: non-strict, and all when only the
    last rank fails."""
    g = torch.Generator().manual_seed(1)
    rows = 200
    c = 0.5 + 0.5 * torch.rand(rows, 1, generator=g, dtype=torch.float64)
    c[:6, 0] = torch.tensor([0.9, 0.8, 0.95, 0.75, 0.5, 1.0], dtype=torch.float64)  # exact boundaries
    conf = c.expand(rows, 24)
    n_elig = torch.randint(1, 25, (rows,), generator=g)
    elig = torch.arange(24)[None] < n_elig[:, None]
    elig = elig[:, torch.randperm(24, generator=g)]  # eligible positions scattered
    f = feats(conf, eligible=elig)
    c_feat = f.confidence.double()
    for margin in (0.0, 0.1, 0.25, 0.5, 0.9):
        pp = decide("fast_dllm_pp", f, margin=margin)
        fac = decide("fast_dllm_factor", f, factor=1.0 - margin)
        for b in range(rows):
            c = sorted(c_feat[b][elig[b]].tolist(), reverse=True)
            assert int(pp.info["n_commit"][b]) == _paper_factor_n(c, 1.0 - margin), (margin, b)
        assert not (pp.commit & ~fac.commit).any(), margin  # same order, the code commits ≥ the paper
    # the boundary rows, by hand: ε = 0.1, f = 1 -> (n+1)ε < 1 gives n = 8 (n = 9 sits on the boundary)
    d = decide("fast_dllm_pp", feats([[0.9] * 12]), margin=0.0)
    assert d.info["n_commit"].tolist() == [8]


def test_profile_rule_heterogeneity_bonus_designed():
    # sorted 0.99, 0.99, 0.99, 0.75, 0.4: factor (f = 1) stops at n = 3 (0.75 < 1 − 1/5 = 0.8);
    # profile: Σε + ε_n = 0.03 + 0.25 + 0.25 = 0.53 < 1 admits n = 4.
    f = feats([0.75, 0.99, 0.4, 0.99, 0.99])
    assert positions(decide("fast_dllm_factor", f, factor=1.0).commit) == [1, 3, 4]
    assert positions(decide("fast_dllm_pp", f, margin=0.0).commit) == [0, 1, 3, 4]
    # margin 0.5: G_4 = 1 − 0.53 = 0.47 ≤ 0.5, G_3 = 1 − 0.04 > 0.5 -> n = 3
    assert positions(decide("fast_dllm_pp", f, margin=0.5).commit) == [1, 3, 4]


def test_profile_rule_commits_at_least_the_papers_factor_inequality():
    g = torch.Generator().manual_seed(2)
    conf = 0.2 + 0.8 * torch.rand(128, 16, generator=g, dtype=torch.float64)
    f = feats(conf)
    c_feat = f.confidence.double()
    for margin in (0.0, 0.25):
        pp = decide("fast_dllm_pp", f, margin=margin).info["n_commit"]
        paper = torch.tensor([_paper_factor_n(sorted(c_feat[b].tolist(), reverse=True), 1.0 - margin)
                              for b in range(128)])
        assert bool((pp >= paper).all())
        assert bool((pp > paper).any())  # and strictly more somewhere on heterogeneous profiles


def test_profile_margin_is_validated():
    with pytest.raises(ParameterError, match=r"fast_dllm_pp\.margin=1\.5 is out of range"):
        build_controller("fast_dllm_pp", margin=1.5)
    with pytest.raises(ParameterError, match="factor"):
        build_controller("fast_dllm_factor", factor=0.0)


# --------------------------------------------------------------------------- cadllm
CAD = dict(min_block=4, max_block=64, initial_steps=4, max_steps=12, threshold_high=0.85, threshold_low=0.4)


def test_cadllm_first_step_threshold_and_next_block_designed():
    ctrl = build_controller("cadllm", **CAD)
    st = state(gen_length=64, block_length=4)
    ctrl.reset(st)
    d = ctrl.decide(feats([0.9, 0.86, 0.84, 0.3]), st)
    assert positions(d.commit) == [0, 1]  # τ_0 = τ_hi = 0.85
    assert d.info["step_budget"].tolist() == [4]  # no history yet: S_min
    # c̄ = 0.725 -> B = 4 + ⌊60·0.725⌋ = 47
    assert d.next_block_length.tolist() == [47]
    # step 2 of the same block (only 2 still eligible): τ_2 = 0.85·(1 − 2/4) + 0.4·2/4 = 0.625
    d = ctrl.decide(feats([0.9, 0.86, 0.64, 0.6], eligible=[False, False, True, True], block_step=2), st)
    assert positions(d.commit) == [2]
    assert d.info["threshold"].tolist() == pytest.approx([0.625])
    # r = mean(0.725, 0.62) = 0.6725 -> B = 4 + ⌊60·0.6725⌋ = 44
    assert d.next_block_length.tolist() == [44]


def test_cadllm_step_budget_from_running_confidence_scales_with_block():
    ctrl = build_controller("cadllm", **CAD)
    st = state(gen_length=64, block_length=4)
    ctrl.reset(st)
    ctrl.decide(feats([0.5, 0.5, 0.5, 0.5]), st)  # c̄ = 0.5
    ctrl.decide(feats([0.7, 0.7, 0.7, 0.7], block_step=1), st)  # c̄ = 0.7 -> r = 0.6
    # new block of 8 positions: S = 4 + ⌊8·0.4⌋ = 7, scaled by 8 / B_0 = 2 -> 14
    d = ctrl.decide(feats([0.8] * 8, block=(0, 8)), st)
    assert d.info["step_budget"].tolist() == [14]
    assert d.info["block_length"].tolist() == [8]
    # the budget stays fixed within the block: τ_7 = 0.85·(1 − 7/14) + 0.4·7/14 = 0.625
    d = ctrl.decide(feats([0.8] * 8, block=(0, 8), block_step=7), st)
    assert d.info["step_budget"].tolist() == [14]
    assert d.info["threshold"].tolist() == pytest.approx([0.625])


def test_cadllm_switches_and_validation():
    st = state(gen_length=16, block_length=4)
    d = decide("cadllm", feats([0.9, 0.5, 0.5, 0.5], block_step=3), st, adaptive_blocks=False,
               adaptive_threshold=False, initial_steps=4)
    assert d.next_block_length is None
    assert d.info["threshold"].tolist() == pytest.approx([0.85])  # no decay
    with pytest.raises(ParameterError, match=r"cadllm\.min_block=9 exceeds max_block=8"):
        build_controller("cadllm", min_block=9, max_block=8)
    with pytest.raises(ParameterError, match="threshold_low"):
        build_controller("cadllm", threshold_low=0.9, threshold_high=0.8)
    with pytest.warns(UserWarning, match=r"cadllm\.max_block=32 has no effect: adaptive_blocks=false"):
        build_controller("cadllm", adaptive_blocks=False, max_block=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_controller("cadllm", adaptive_blocks=False)  # defaults: nothing to warn about


class Recorder(nn.Module):
    """Wraps a denoiser and keeps every canvas it was called on."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.mask_token_id, self.eos_token_id = inner.mask_token_id, inner.eos_token_id
        self.pad_token_id, self.vocab_size = inner.pad_token_id, inner.vocab_size
        self.canvases: list[torch.Tensor] = []

    def forward(self, input_ids, attention_mask=None):
        self.canvases.append(input_ids.clone())
        return self.inner(input_ids, attention_mask)


def test_cadllm_changes_block_length_and_keeps_every_loop_invariant():
    """8 confident positions then 24 hard ones: the block widens (4 -> 15), then narrows."""
    g, p = 32, 2
    answer = [1 + i % 8 for i in range(g)]
    conf = [0.95] * 8 + [0.3] * 24
    second = [0.025] * 8 + [0.1] * 24
    model = Recorder(ToyDenoiser(answer, conf, vocab_size=16, second=second, prompt_length=p))
    prompts = [[3, 4], [5, 6]]
    ctrl = build_controller("cadllm", min_block=2, max_block=16, initial_steps=4, max_steps=8)
    r = decode(model, prompts, ctrl, DecodeConfig(gen_length=g, block_length=4), trace=True)

    blocks = [(int(t["block_start"][0]), int(t["block_end"][0])) for t in r.trace]
    spans = list(dict.fromkeys(blocks))
    lengths = [e - s for s, e in spans]
    # B_0 = 4; after one step at c̄ = 0.95: 2 + ⌊14·0.95⌋ = 15; then the low confidences narrow it
    assert lengths[:2] == [4, 15] and max(lengths[2:]) < 15
    assert all(s2 == e1 for (_, e1), (s2, _) in zip(spans, spans[1:])) and spans[-1][1] == g  # contiguous, clamped
    nexts = {}  # a block's length is the previous block's last next_block_length
    for t in r.trace:
        nexts[(int(t["block_start"][0]), int(t["block_end"][0]))] = int(t["next_block_length"][0])
    for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
        assert e2 - s2 == min(nexts[(s1, e1)], g - s2)

    # NFE exact: one forward per step per row, and the recorder saw exactly that many canvases
    assert r.nfe.tolist() == [len(r.trace)] * 2 == [len(model.canvases)] * 2
    mask = model.mask_token_id
    committed = torch.zeros(2, g, dtype=torch.long)
    for step, t in enumerate(r.trace):
        c = t["commit"][:, p:p + g]
        s, e = int(t["block_start"][0]), int(t["block_end"][0])
        assert c.any(1).all()  # progress every step
        assert not c[:, :s].any() and not c[:, e:].any()  # only inside the current block
        committed += c.long()
        canvas = model.canvases[step]
        assert canvas[:, :p].tolist() == prompts  # prompt untouched
        nxt = model.canvases[step + 1] if step + 1 < len(model.canvases) else r.tokens
        changed = (nxt != canvas)[:, p:p + g]
        assert torch.equal(changed, c) and (canvas[:, p:p + g][c] == mask).all()  # mask -> token only
    assert committed.eq(1).all()  # every position decoded exactly once
    assert r.generated.tolist() == [answer, answer]


# --------------------------------------------------------------------------- temporal_stability
def test_stability_commits_a_prediction_after_n_stable_steps():
    ctrl = build_controller("temporal_stability", threshold=0.9, n_stable=3)
    st = state(gen_length=4)
    ctrl.reset(st)
    conf = [0.5, 0.5, 0.95, 0.4]
    elig = [True, True, False, True]  # position 2 is the threshold commit of step 1, then gone
    seq = [[3, 5, 7, 1], [3, 6, 7, 1], [3, 5, 7, 1]]
    d1 = ctrl.decide(feats(conf, x0=seq[0]), st)
    assert positions(d1.commit) == [2]  # p > τ
    d2 = ctrl.decide(feats(conf, x0=seq[1], eligible=elig), st)
    assert positions(d2.commit) == [0]  # only the top-1 fallback: runs are [2, 1, -, 2]
    elig3 = [False, True, False, True]
    d3 = ctrl.decide(feats(conf, x0=seq[2], eligible=elig3), st)
    # runs now [-, 1, -, 3]: position 3 (p = 0.4) is stable for 3 steps; position 1 changed twice
    assert positions(d3.commit) == [1, 3]
    assert st.memory["stability.run"][0].tolist() == [0, 1, 0, 3]
    assert d3.info["stable_commits"].tolist() == [1]


def test_stability_floor_and_ineligible_history():
    ctrl = build_controller("temporal_stability", threshold=0.9, n_stable=2, min_confidence=0.3)
    st = state(gen_length=4)
    ctrl.reset(st)
    block0 = [True, True, False, False]
    conf = [0.6, 0.5, 0.6, 0.2]
    ctrl.decide(feats(conf, eligible=block0, masked=[True] * 4), st)
    # step 2: everything stable for 2 steps; block 0 commits both, but position 3 is below the floor
    d = ctrl.decide(feats(conf, eligible=[True] * 4, masked=[True] * 4), st)
    assert positions(d.commit) == [0, 1, 2]


class SettlingDenoiser(nn.Module):
    """Position i predicts a different wrong token every call until call ``settle[i]``, then its
    answer: churning predictions have p = 0.4, settled ones p = 0.5 (all below τ = 0.9)."""

    def __init__(self, answer, settle, vocab_size=16, prompt_length=1):
        super().__init__()
        self.answer, self.settle, self.p = torch.tensor(answer), torch.tensor(settle), prompt_length
        self.vocab_size, self.mask_token_id = vocab_size, vocab_size - 1
        self.eos_token_id, self.pad_token_id = vocab_size - 2, vocab_size - 3
        self.calls = 0

    def forward(self, input_ids, attention_mask=None):
        b, l = input_ids.shape  # noqa: E741
        g = self.answer.numel()
        churn = 4 + (torch.arange(g) + self.calls) % 4  # tokens 4..7, never an answer (1..3)
        settled = self.calls >= self.settle
        x0 = torch.where(settled, self.answer, churn)
        conf = torch.where(settled, torch.tensor(0.5), torch.tensor(0.4))
        probs = torch.full((b, l, self.vocab_size), 1e-6)
        probs.scatter_(2, input_ids[..., None], 1.0)
        gen = ((1 - conf) / (self.vocab_size - 2))[:, None].repeat(1, self.vocab_size)
        gen[torch.arange(g), x0] = conf
        gen[:, self.mask_token_id] = 0.0  # p(x0) is exactly conf once the loop drops the mask token
        probs[:, self.p:self.p + g] = gen
        self.calls += 1
        return probs.log()


def test_stability_cuts_nfe_when_predictions_settle():
    """Positions 0-3 settled from the start, 4-7 from call 3. With n = 3 and τ = 0.9:
    call 0 -> {0} (top-1), 1 -> {1}, 2 -> {2, 3} (3 calls stable), 3 -> {4} (settled p = 0.5),
    4 -> {5}, 5 -> {6, 7} (stable since call 3): 6 NFE; the threshold rule alone needs 8."""
    answer, settle = [1, 2, 3, 1, 2, 3, 1, 2], [0, 0, 0, 0, 3, 3, 3, 3]
    cfg = DecodeConfig(gen_length=8)
    r = decode(SettlingDenoiser(answer, settle), [[0]], build_controller("temporal_stability", threshold=0.9, n_stable=3),
               cfg, trace=True)
    steps = [positions(t["commit"][:, 1:]) for t in r.trace]
    assert steps == [[0], [1], [2, 3], [4], [5], [6, 7]]
    assert r.nfe.tolist() == [6] and r.generated[0].tolist() == answer
    base = decode(SettlingDenoiser(answer, settle), [[0]], build_controller("fast_dllm", threshold=0.9), cfg)
    assert base.nfe.tolist() == [8] and base.generated[0].tolist() == answer
