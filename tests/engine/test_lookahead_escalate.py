"""Escalation candidates (``lookahead(escalate=[τ_e, …])``): besides "commit this token", the search
can answer "commit less here": a candidate that commits and rolls out by Fast-dLLM's threshold rule
at τ_e, stricter than the step's controller."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_lookahead import ORCHARD, PreferCandidate, lookahead  # the lookahead tests' toy, test scorer and

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.lookahead import Lookahead
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.scorer import Scorer
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.testing.toys import JointDenoiser

# lookahead with the earlier defaults (EARLIER_DEFAULTS), so these tests decode what they did

# Three positions. Position 0 and 1 are coupled: (a, y) .3, (b, x) .25, (d, x) .25, (c, x) .2, so the
# marginal top-1s a (.3) and x (.7) form a pair of joint probability 0. Position 2 is independent and
# uniform over g0..g3. Ids: a b c d = 0-3, x y = 4-5, g0-g3 = 6-9; pad 10, eos 11, mask 12.
PAIRS = [((0, 5), 0.3), ((1, 4), 0.25), ((3, 4), 0.25), ((2, 4), 0.2)]
COUPLED = dict(answers=[[p0, p1, g] for (p0, p1), _ in PAIRS for g in range(6, 10)],
               weights=[w * 0.25 for _, w in PAIRS for _ in range(6, 10)], vocab_size=13, prompt_length=1)
PROMPT = [10]


class TopTwo(Controller):
    """Test controller: commit the two most confident positions; keep k=2 at the others, depth 3."""

    params: dict = {}

    def __init__(self) -> None:
        pass

    def decide(self, f, state):
        commit = select_topk(f.confidence, f.eligible, 2)
        uncertain = f.eligible & ~commit
        return Decision(commit=commit, k=torch.where(uncertain, 2, 1), depth=torch.where(uncertain.any(1), 3, 0))


class Valid(Scorer):
    """Test verifier: 0 for a candidate the toy gives positive probability, −1 otherwise."""

    params: dict = {}

    def __init__(self, toy: JointDenoiser | None = None) -> None:
        self.toy = toy

    def _score(self, c, ctx):
        return (self.toy.joint(c.tokens) > 0).float() - 1.0


def test_escalation_finds_a_valid_answer_where_the_controller_and_a_branch_both_fail():
    cfg = DecodeConfig(gen_length=3)
    alone = decode(JointDenoiser(**COUPLED), [PROMPT], TopTwo(), cfg)
    assert alone.generated[0, :2].tolist() == [0, 4]  # a and x together: probability 0
    m = JointDenoiser(**COUPLED)
    branch = decode(m, [PROMPT], TopTwo(), cfg, lookahead=lookahead(scorer=Valid(m), width=2, rollout="controller"))
    assert m.joint(branch.generated).item() == 0  # branching at position 2 cannot undo the pair
    for lazy in (False, True):
        m = JointDenoiser(**COUPLED)
        la = lookahead(scorer=Valid(m), width=2, hold=True, escalate=[0.99], rollout="controller", rescore="none",
                       lazy=lazy)
        res = decode(m, [PROMPT], TopTwo(), cfg, lookahead=la)
        # the escalation commits x alone (top-1 at .7 < .99), its rollout then b (.357 given x), then a g
        assert res.generated[0, :2].tolist() == [1, 4] and m.joint(res.generated).item() > 0
        # forwards: the loop's first; the hold's rollout 1 (its first step fills a and x, one forward
        # fills g), the escalation's 2; the next step reuses the escalation's first rollout forward
        assert res.lookahead_nfe.tolist() == [3] and res.nfe.tolist() == [4] and m.rows_seen == 4
        assert res.escalations.tolist() == [1]  # one lookahead step, won by the escalation
    assert branch.escalations.tolist() == [0]


def test_a_hold_that_passes_never_rolls_the_escalation_out_when_lazy():
    class Pass(Scorer):
        params: dict = {}

        def _score(self, c, ctx):
            return torch.zeros(c.tokens.shape[0])

    cfg = DecodeConfig(gen_length=3)
    alone = decode(JointDenoiser(**COUPLED), [PROMPT], TopTwo(), cfg)
    runs = {}
    for lazy in (False, True):
        m = JointDenoiser(**COUPLED)
        la = lookahead(scorer=Pass(), width=2, escalate=[0.99], rollout="controller", rescore="none", lazy=lazy)
        runs[lazy] = decode(m, [PROMPT], TopTwo(), cfg, lookahead=la)
        assert runs[lazy].generated.tolist() == alone.generated.tolist()  # ties go to the hold
        assert int(runs[lazy].nfe.sum()) == m.rows_seen
    assert runs[True].lookahead_nfe.tolist() == [1] and runs[False].lookahead_nfe.tolist() == [3]
    assert runs[True].escalations.tolist() == runs[False].escalations.tolist() == [0]


COINS = [list(c) for c in itertools.product([0, 1], repeat=6)]  # six independent positions, 0 at p = .6
SIX_COINS = dict(answers=COINS, weights=[0.6 ** (6 - sum(c)) * 0.4 ** sum(c) for c in COINS], vocab_size=12,
                 prompt_length=1)


@pytest.mark.parametrize("toy,tau,temperature", [
    (ORCHARD, 0.99, 0.0), (ORCHARD, 0.5, 0.0), (SIX_COINS, 0.99, 1.0), (SIX_COINS, 0.5, 1.0)])
def test_an_escalation_that_always_wins_decodes_as_fast_dllm_at_its_threshold(toy, tau, temperature):
    # the escalation wins every lookahead step and its rollout is committed to the end of the block
    # (advance = max_depth = 6): the decode is Fast-dLLM's at τ_e, token for token and step for step,
    # at temperature 1 too (a rollout samples with the loop's draws); every forward is counted
    ladder = build_controller("confidence_ladder", base={"name": "margin_topk", "params": {"eta": 0.3, "k": 3}},
                              depth_high=6, depth_mid=6, d_max=6)
    for seed in range(3 if temperature > 0 else 1):
        cfg = DecodeConfig(gen_length=6, temperature=temperature, seed=seed)
        fast = decode(JointDenoiser(**toy), [[9]], build_controller("fast_dllm", threshold=tau), cfg)
        m = JointDenoiser(**toy)
        la = lookahead(scorer=PreferCandidate(1), width=2, escalate=[tau], rollout="controller", rescore="none",
                       max_depth=6, advance=6, budget=1000)
        res = decode(m, [[9]], ladder, cfg, lookahead=la)
        assert res.generated.tolist() == fast.generated.tolist(), seed
        assert res.steps.tolist() == fast.steps.tolist(), seed
        assert int(res.nfe.sum()) == m.rows_seen and res.fallbacks.tolist() == [0]
        assert res.lookahead_nfe.item() > 0 and res.escalations.item() >= 1


def test_escalation_levels_roll_out_in_order_and_stop_at_the_first_that_passes():
    # levels 0.99 then 0.5: the hold fails (a with x), the first level passes; lazily the second never runs
    nfe = {}
    for lazy in (False, True):
        m = JointDenoiser(**COUPLED)
        la = lookahead(scorer=Valid(m), width=3, escalate=[0.99, 0.5], rollout="controller", rescore="none",
                       lazy=lazy)
        res = decode(m, [PROMPT], TopTwo(), DecodeConfig(gen_length=3), lookahead=la)
        assert res.generated[0, :2].tolist() == [1, 4] and m.joint(res.generated).item() > 0
        nfe[lazy] = res.lookahead_nfe.item()
    assert nfe[False] > nfe[True] == 3


def test_escalate_parameters_validate_with_what_is_allowed():
    with pytest.raises(ParameterError, match=r"escalate=\[1.5\].*thresholds in \(0, 1\]"):
        Lookahead.build(escalate=[1.5])
    with pytest.raises(ParameterError, match=r"escalate=\[0.0\].*allowed"):
        Lookahead.build(escalate=[0.0])
    with pytest.raises(ParameterError, match=r"width=2 leaves no room for escalate=\[0.9, 0.99\].*width >= 3"):
        Lookahead.build(width=2, escalate=[0.9, 0.99])
    assert Lookahead.build(width=2, escalate=0.99).levels() == [0.99]  # `--lookahead escalate=0.99`
    assert Lookahead.build(width=1, hold=False, escalate=[0.99]).levels() == [0.99]


@pytest.mark.parametrize("toy,scorers", [
    (COUPLED, [Valid(None)] + ["logprob"]),
    (ORCHARD, ["logprob", "consistency"]),
])
def test_lazy_with_escalations_picks_the_eager_winner_with_no_more_forwards(toy, scorers):
    prompt = PROMPT if toy is COUPLED else [9]
    g = len(toy["answers"][0])
    for scorer in scorers:
        for width, levels, bonus in ((2, [0.99], 0.0), (3, [0.99], 0.6), (4, [0.99, 0.6], 0.0)):
            runs = []
            for lazy in (False, True):
                m = JointDenoiser(**toy)
                if isinstance(scorer, Valid):
                    scorer.toy = m
                la = lookahead(scorer=scorer, width=width, escalate=levels, rollout="controller", max_depth=4,
                               hold_bonus=bonus, lazy=lazy, budget=1000)
                res = decode(m, [prompt], TopTwo(), DecodeConfig(gen_length=g), lookahead=la)
                assert int(res.nfe.sum()) == m.rows_seen
                runs.append(res)
            eager, lazy_ = runs
            assert lazy_.generated.tolist() == eager.generated.tolist(), (scorer, width, levels, bonus)
            assert lazy_.nfe.item() <= eager.nfe.item()


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_escalating_lookahead_on_a_tiny_transformer_under_every_cache_mode(cache):
    # a 2-layer tiny transformer with random weights (uncertain everywhere, so the ladder asks for depth
    # at every step) and a head scaled to make some positions confident: a ragged batch decodes to the
    # end with lookahead steps, escalations among them, and equals its rows decoded one at a time
    from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser

    torch.manual_seed(0)
    model = TinyDenoiser(TinyConfig(vocab_size=20, mask_token_id=19, pad_token_id=0, eos_token_id=2, max_len=40,
                                    d_model=32, n_layers=2, n_heads=2, d_ff=64)).eval()
    with torch.no_grad():
        model.head.weight.mul_(8.0)
    ladder = build_controller("confidence_ladder", base={"name": "margin_topk", "params": {"eta": 0.5, "k": 3}},
                              depth_high=4, depth_mid=4, d_max=4)
    la = lookahead(scorer=PreferCandidate(1), width=3, escalate=[0.9], rollout="controller", max_depth=4,
                   advance=2, lazy=False, budget=24)
    cfg = DecodeConfig(gen_length=12, block_length=6, cache=cache)
    prompts = [[3, 4, 5], [6, 7]]
    batch = decode(model, prompts, ladder, cfg, lookahead=la)
    assert not (batch.generated == 19).any()
    assert (batch.lookahead_nfe > 0).all() and (batch.escalations > 0).all()
    assert (batch.lookahead_nfe <= la.budget).all()
    for i, prompt in enumerate(prompts):
        single = decode(model, [prompt], ladder, cfg, lookahead=la)
        assert torch.equal(single.generated[0], batch.generated[i]), (cache, i)
        assert single.nfe.tolist() == [int(batch.nfe[i])] and single.escalations.tolist() == [int(batch.escalations[i])]


class TopTwoNoK(TopTwo):
    """TopTwo without candidate counts (``k``), as a learned policy under ``confidence_ladder`` decides."""

    def decide(self, f, state):
        d = super().decide(f, state)
        return Decision(commit=d.commit, depth=d.depth)


def test_escalation_needs_no_branch_position_so_a_controller_without_k_can_escalate():
    cfg = DecodeConfig(gen_length=3)
    m = JointDenoiser(**COUPLED)
    plain = decode(m, [PROMPT], TopTwoNoK(), cfg, lookahead=lookahead(scorer=Valid(m), width=3, rollout="controller"))
    assert plain.lookahead_nfe.tolist() == [0]  # no k > 1 anywhere: nothing to branch on, no lookahead
    m = JointDenoiser(**COUPLED)
    la = lookahead(scorer=Valid(m), width=3, escalate=[0.99], rollout="controller", rescore="none", lazy=False)
    res = decode(m, [PROMPT], TopTwoNoK(), cfg, lookahead=la)
    assert res.generated[0, :2].tolist() == [1, 4] and res.escalations.tolist() == [1]
    # width 3 leaves room for one branch candidate, but with no branch position none is rolled out:
    # the same 3 lookahead forwards as the hold and the escalation alone
    assert res.lookahead_nfe.tolist() == [3] and int(res.nfe.sum()) == m.rows_seen
