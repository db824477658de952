"""Adaptive lookahead in the loop: it beats greedy where greedy provably loses, counts every rollout
forward, respects the budget, falls back when a plug-in raises; the guards of the technique."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError, StopDecoding
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext, MissingContextError
from adaptive_decoding.framework.engine.controller import Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.lookahead import Lookahead
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.scorer import Scorer
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.testing.toys import CharTokenizer, JointDenoiser, ToyDenoiser

# a, b, c, x, y, z, e = 0..6; V = 10 (pad 7, eos 8, mask 9). Position 2 is always e.
# p(first): a .42, b .37, c .21; p(second): x .42, z .37, y .21 (margins .05, tied).
# Greedy commits a (or x) first, after which the other is a coin flip: joint 0.21.
# The joint mode (b, z, e) has 0.37.
GARDEN = dict(answers=[[0, 3, 6], [0, 4, 6], [2, 3, 6], [1, 5, 6]], weights=[0.21, 0.21, 0.21, 0.37],
              vocab_size=10, prompt_length=1)
PROMPT = [7]


#: the lookahead's defaults before they became those of the configured escalating rules verifier
#: (docs/lookahead.md): these tests pass them, so they decode what they did
EARLIER_DEFAULTS = dict(width=4, rollout="threshold", max_depth=8, rescore="pll", advance=1, lazy=False, budget=64)


def lookahead(**params) -> Lookahead:
    """A lookahead with :data:`EARLIER_DEFAULTS` under ``params``."""
    return Lookahead.build(**{**EARLIER_DEFAULTS, **params})


def garden():
    return JointDenoiser(**GARDEN)


def ladder():
    """margin top-k commits the confident position, keeps k=3 at the coupled ones; depth from the ladder."""
    return build_controller("confidence_ladder", base={"name": "margin_topk", "params": {"eta": 0.3, "k": 3}})


class Branchy(Controller):
    """Test controller: commit the most confident eligible position unless some margin < 0.3,
    then commit nothing and ask for k=3 candidates at depth 2 everywhere uncertain."""

    params: dict = {}

    def __init__(self) -> None:
        pass

    def decide(self, f, state):
        uncertain = f.eligible & (f.margin < 0.3)
        commit = select_topk(f.confidence, f.eligible & ~uncertain, 1)
        k = torch.where(uncertain, 3, 1)
        depth = torch.where(uncertain.any(1), 2, 0)
        return Decision(commit=commit, k=k, depth=depth)


def test_lookahead_picks_the_joint_mode_where_greedy_provably_loses():
    cfg = DecodeConfig(gen_length=3)
    for name in ("sequential", "fast_dllm", "margin_topk"):
        m = garden()
        plain = decode(m, [PROMPT], build_controller(name), cfg)
        assert m.joint(plain.generated).item() == pytest.approx(0.21), name  # greedy: every path has 0.21
    m = garden()
    plain = decode(m, [PROMPT], ladder(), cfg)
    assert m.joint(plain.generated).item() == pytest.approx(0.21)
    m = garden()
    res = decode(m, [PROMPT], ladder(), cfg, lookahead=lookahead(scorer="logprob", width=3))
    assert res.generated.tolist() == [[1, 5, 6]]  # b z e, the joint mode
    assert m.joint(res.generated).item() == pytest.approx(0.37)
    # step 1: candidates hold / a / b; hold's rollout needs 2 forwards (it fills one position, then
    # completes), a's and b's 1 each; the pseudo-likelihood re-scoring probes 3 positions of each of
    # the 3 on this plain toy (no shadow block); step 2 reuses b's first rollout forward
    assert res.lookahead_nfe.tolist() == [4 + 9] and res.nfe.tolist() == [1 + 13] and res.steps.tolist() == [2]
    assert res.fallbacks.tolist() == [0] and int(res.nfe.sum()) == m.rows_seen
    m2 = garden()
    res2 = decode(m2, [PROMPT], ladder(), cfg, lookahead=lookahead(scorer="logprob", width=3, rescore="none"))
    assert res2.generated.tolist() == [[1, 5, 6]] and res2.nfe.tolist() == [1 + 4] and m2.rows_seen == 5


def test_nfe_counts_every_rollout_forward_exactly():
    m = garden()
    prompts = [PROMPT] * 3
    res = decode(m, prompts, Branchy(), DecodeConfig(gen_length=3),
                 lookahead=lookahead(scorer="logprob", width=3, rollout="sequential", complete=False, budget=64))
    assert res.lookahead_nfe.min() > 0
    assert int(res.nfe.sum()) == m.rows_seen  # every row of every forward, rollouts included
    assert (res.nfe <= res.steps + res.lookahead_nfe).all()  # a reused rollout forward is not run again


def test_the_step_after_a_lookahead_reuses_the_winners_first_forward():
    # without the hold candidate and re-scoring: step 1 runs 1 forward + 3 rollouts (a, b, c, one
    # forward each, on canvases [a|b|c, M, e]); b wins, and step 2 decodes [b, M, e], the canvas
    # b's rollout already ran: no forward, so 2 steps cost 4 forwards, not 5
    m = garden()
    la = lookahead(scorer="logprob", width=3, hold=False, rescore="none")
    res = decode(m, [PROMPT], ladder(), DecodeConfig(gen_length=3), lookahead=la)
    assert res.generated.tolist() == [[1, 5, 6]]
    assert res.steps.tolist() == [2] and res.lookahead_nfe.tolist() == [3]
    assert res.nfe.tolist() == [4] and m.rows_seen == 4
    # the reused logits decide exactly what a fresh forward would: same tokens as with no reuse possible
    fresh = decode(garden(), [PROMPT], ladder(), DecodeConfig(gen_length=3, cache="none"),
                   lookahead=lookahead(scorer="logprob", width=3, hold=False, rescore="none", max_depth=1))
    assert fresh.generated.tolist() == res.generated.tolist()


class PreferCandidate(Scorer):
    """Test scorer: the ``which``-th candidate of each group wins (0 = the hold candidate)."""

    params: dict = {}

    def __init__(self, which: int = 0) -> None:
        self.which = which

    def _score(self, c, ctx):
        rank = torch.zeros(c.tokens.shape[0])
        for src in c.source.unique():
            rows = (c.source == src).nonzero().squeeze(1)
            rank[rows] = -1.0
            rank[rows[min(self.which, rows.numel() - 1)]] = 0.0
        return rank


# six positions, four answers (ids 0-8; pad 9, eos 10, mask 11): margins differ by position and
# shrink or grow as positions are decided, so a margin rule commits a few a step and branches
ORCHARD = dict(answers=[[0, 1, 2, 3, 4, 5], [0, 1, 6, 3, 7, 5], [0, 2, 6, 4, 7, 8], [1, 2, 2, 3, 4, 8]],
               weights=[0.3, 0.25, 0.2, 0.25], vocab_size=12, prompt_length=1)


@pytest.mark.parametrize("rescore,temperature", [("none", 0.0), ("pll", 0.0), ("none", 1.0)])
def test_advance_commits_the_winning_rollout_further_and_wastes_none_of_its_forwards(rescore, temperature):
    # the hold rollout always wins and rolls the controller itself out: whatever advance is, the
    # decode is the controller's own, token for token, and as many decoding steps (at temperature 1
    # too: a rollout samples as the loop does); a larger advance runs fewer forwards, all counted
    # six independent positions, token 0 with p = 0.6 and 1 with 0.4 whatever is decided: a sampler
    # keeps sampling at every step (ORCHARD's marginals turn certain once a few positions are decided)
    coins = [list(c) for c in itertools.product([0, 1], repeat=6)]
    spec = dict(answers=coins, weights=[0.6 ** (6 - sum(c)) * 0.4 ** sum(c) for c in coins], vocab_size=12,
                prompt_length=1)
    answers, nfe = set(), {1: 0, 2: 0, 4: 0}
    for seed in range(4 if temperature > 0 else 1):
        cfg = DecodeConfig(gen_length=6, temperature=temperature, seed=seed)
        alone = decode(JointDenoiser(**spec), [[9]], ladder(), cfg)
        answers.add(tuple(alone.generated[0].tolist()))
        for a in nfe:
            m = JointDenoiser(**spec)
            la = lookahead(scorer=PreferCandidate(0), width=2, rollout="controller", max_depth=4, advance=a,
                           rescore=rescore, budget=1000)
            res = decode(m, [[9]], ladder(), cfg, lookahead=la)
            assert res.generated.tolist() == alone.generated.tolist(), (seed, a)
            assert res.steps.tolist() == alone.steps.tolist(), (seed, a)
            assert int(res.nfe.sum()) == m.rows_seen and res.fallbacks.tolist() == [0]
            assert a > 1 or res.lookahead_nfe.item() > 0
            nfe[a] += res.nfe.item()
    assert nfe[1] > nfe[2] > nfe[4]
    assert temperature == 0 or len(answers) > 1  # the seeds really sample


def test_advance_commits_the_winners_first_rollout_fill_and_hands_back_the_forward_after_it():
    m = JointDenoiser(**ORCHARD)
    x = torch.tensor([[9] + [11] * 6])
    f = _features(m, x)
    commit = torch.zeros_like(x, dtype=torch.bool)
    d = Decision(commit=commit, k=torch.full_like(x, 3), depth=torch.tensor([3]))
    state = DecodeState(config=DecodeConfig(gen_length=6), seeds=torch.zeros(1, dtype=torch.long), mask_token_id=11)
    def la(a):
        return lookahead(scorer=PreferCandidate(1), width=3, rollout="sequential", max_depth=3, rescore="none",
                         advance=a).refine(m, x, torch.ones_like(x), f, d, commit, f.x0, state, torch.tensor([64]))

    one, two = la(1), la(2)
    # advance 1: the winner (the top-1 branch token at the lowest-margin slot) commits that slot only
    (slot,) = one.commit[0].nonzero().squeeze(1).tolist()
    assert int(one.info["advanced"][0]) == 0 and int(two.info["advanced"][0]) == 1
    # advance 2: also the slot its first sequential forward filled, with the greedy token there
    after_first = x.clone()
    after_first[0, slot] = one.tokens[0, slot]
    probs = torch.softmax(m(after_first)[0].float(), -1)
    probs[:, 11] = 0
    conf, pred = probs.max(-1)
    conf[after_first[0] != 11] = -1
    nxt = int(conf.argmax())
    assert sorted(two.commit[0].nonzero().squeeze(1).tolist()) == sorted([slot, nxt])
    assert two.tokens[0, nxt] == pred[nxt] and two.tokens[0, slot] == one.tokens[0, slot]
    # the forward handed back ran on exactly the canvas with both committed: a fresh forward agrees
    canvas = after_first.clone()
    canvas[0, nxt] = pred[nxt]
    assert torch.equal(two.next_canvas[0], canvas[0])
    assert torch.allclose(two.next_logits[0].float(), m(canvas)[0].float())
    assert two.extra_nfe.tolist() == one.extra_nfe.tolist()  # the same rollouts ran; only what is kept differs


class TokenAt(Scorer):
    """Test scorer, a property of each candidate alone: 0 if generation position ``pos`` holds ``token``, else −1."""

    params: dict = {}

    def __init__(self, pos: int = 0, token: int = 0) -> None:
        self.pos, self.token = pos, token

    def _score(self, c, ctx):
        return (c.tokens[:, self.pos] == self.token).float() - 1.0


@pytest.mark.parametrize("toy,scorers", [
    ("garden", [TokenAt(0, t) for t in (0, 1, 2)] + [TokenAt(1, t) for t in (3, 4, 5)]),
    ("orchard", [TokenAt(2, t) for t in (2, 6)] + ["logprob"]),
])
def test_lazy_rolls_out_the_others_only_when_the_hold_can_lose_same_tokens_fewer_forwards(toy, scorers):
    spec, prompt = (GARDEN, PROMPT) if toy == "garden" else (ORCHARD, [9])
    g = len(spec["answers"][0])
    saved = 0
    for scorer in scorers:
        for bonus in (0.0, 0.6):
            runs = []
            for lazy in (False, True):
                m = JointDenoiser(**spec)
                la = lookahead(scorer=scorer, width=3, rollout="controller", max_depth=4, hold_bonus=bonus, lazy=lazy,
                               budget=1000)
                res = decode(m, [prompt], ladder(), DecodeConfig(gen_length=g), lookahead=la)
                assert int(res.nfe.sum()) == m.rows_seen
                runs.append(res)
            eager, lazy_ = runs
            assert lazy_.generated.tolist() == eager.generated.tolist(), (scorer, bonus)
            assert lazy_.nfe.item() <= eager.nfe.item()
            saved += eager.nfe.item() - lazy_.nfe.item()
    assert saved > 0  # some hold rollouts were sure winners and the others never ran


def test_branch_position_is_committed_only_when_the_winning_rollout_commits_it():
    m = garden()
    x = torch.tensor([[7, 9, 9, 9]])
    f = _features(m, x)
    commit = torch.tensor([[False, False, False, True]])  # the controller commits e (slot 3)
    d = Decision(commit=commit, k=torch.tensor([[1, 3, 3, 1]]), depth=torch.tensor([1]))
    state = DecodeState(config=DecodeConfig(gen_length=3), seeds=torch.zeros(1, dtype=torch.long), mask_token_id=9)
    held = lookahead(scorer=PreferCandidate(0), width=3).refine(m, x, torch.ones_like(x), f, d, commit, f.x0, state,
                                                                torch.tensor([64]))
    assert held.commit.tolist() == commit.tolist()  # the hold rollout won: slot 1 (the branch) stays masked
    assert int(held.info["held"][0]) == 1
    took = lookahead(scorer=PreferCandidate(2), width=3).refine(m, x, torch.ones_like(x), f, d, commit, f.x0, state,
                                                                torch.tensor([64]))
    assert took.commit.tolist() == [[False, True, False, True]] and int(took.tokens[0, 1]) == 1  # b
    assert int(took.info["held"][0]) == 0
    # a hold bonus larger than the winner's lead keeps the branch masked
    guarded = lookahead(scorer=PreferCandidate(2), width=3, hold_bonus=1.5).refine(
        m, x, torch.ones_like(x), f, d, commit, f.x0, state, torch.tensor([64]))
    assert guarded.commit.tolist() == commit.tolist() and int(guarded.info["held"][0]) == 1


def test_batch_of_samples_equals_single_runs():
    cfg = DecodeConfig(gen_length=3)
    la = lookahead(scorer="logprob", width=3)
    batch = decode(garden(), [PROMPT, PROMPT], ladder(), cfg, lookahead=la)
    single = decode(garden(), [PROMPT], ladder(), cfg, lookahead=la)
    assert batch.generated.tolist() == single.generated.tolist() * 2
    assert batch.nfe.tolist() == single.nfe.tolist() * 2


@pytest.mark.parametrize("budget, expected_extra", [(0, 0), (1, 0), (2, 2), (3, 3), (64, 3)])
def test_budget_caps_extra_nfe_per_sample(budget, expected_extra):
    m = garden()
    la = lookahead(scorer="logprob", width=3, hold=False, rescore="none", budget=budget)
    res = decode(m, [PROMPT, PROMPT], ladder(), DecodeConfig(gen_length=3), lookahead=la)
    assert res.lookahead_nfe.tolist() == [expected_extra] * 2
    assert int(res.nfe.sum()) == m.rows_seen
    if budget < 2:  # too little for two candidates: plain decoding
        plain = decode(garden(), [PROMPT, PROMPT], ladder(), DecodeConfig(gen_length=3))
        assert res.generated.tolist() == plain.generated.tolist()
    if budget == 2:  # two candidates (a, b) of depth 1: b still wins
        assert res.generated.tolist() == [[1, 5, 6]] * 2
    # with re-scoring, a candidate costs its rollout and 3 probes: 6 affords nothing, 64 everything
    m2 = garden()
    res2 = decode(m2, [PROMPT], ladder(), DecodeConfig(gen_length=3),
                  lookahead=lookahead(scorer="logprob", width=3, hold=False, budget=budget))
    assert int(res2.lookahead_nfe[0]) <= budget and int(res2.nfe.sum()) == m2.rows_seen


def test_depth_is_bounded_by_budget_over_width():
    la = lookahead(scorer="logprob", width=3, rollout="sequential", complete=False, budget=7)
    m = JointDenoiser([[0, 3, 6, 6, 6, 6], [1, 5, 6, 6, 6, 6]], [0.5, 0.5], vocab_size=10)
    ctrl = Branchy()
    res = decode(m, [PROMPT], ctrl, DecodeConfig(gen_length=6), lookahead=la)
    assert int(res.lookahead_nfe) <= 7
    assert int(res.nfe.sum()) == m.rows_seen


class Exploding(Scorer):
    """A scorer that always raises."""

    params: dict = {}

    def __init__(self) -> None:
        pass

    def _score(self, c, ctx):
        raise RuntimeError("scorer exploded")


def test_fallback_keeps_decoding_when_the_scorer_raises(caplog):
    m = garden()
    with caplog.at_level(logging.WARNING, logger="adaptive_decoding.framework.engine.lookahead"):
        res = decode(m, [PROMPT, PROMPT], ladder(), DecodeConfig(gen_length=3),
                     lookahead=lookahead(scorer=Exploding(), width=3, hold=False, rescore="none"))
    plain = decode(garden(), [PROMPT, PROMPT], ladder(), DecodeConfig(gen_length=3))
    assert res.generated.tolist() == plain.generated.tolist()  # the controller's own decision, nothing lost
    assert (res.fallbacks > 0).all()
    assert "scorer exploded" in caplog.text and "fall back" in caplog.text
    assert res.lookahead_nfe.tolist() == [3, 3]  # forwards spent before the failure still count
    assert int(res.nfe.sum()) == m.rows_seen


class Stops(Exploding):
    def _score(self, c, ctx):
        raise StopDecoding("the job's deadline passed")


def test_a_stop_inside_the_lookahead_is_not_absorbed_by_its_fallback():
    """A deadline (:class:`StopDecoding`) raised during the search stops the decode now; any other
    failure falls back (the test above)."""
    with pytest.raises(StopDecoding, match="deadline"):
        decode(garden(), [PROMPT, PROMPT], ladder(), DecodeConfig(gen_length=3),
               lookahead=lookahead(scorer=Stops(), width=3, hold=False, rescore="none"))


class RaisesInRollouts(Branchy):
    """Decides like Branchy for the loop (one row) and raises inside rollouts (several rows)."""

    def decide(self, f, state):
        if f.batch_size > 1:
            raise RuntimeError("controller exploded")
        return super().decide(f, state)


def test_fallback_keeps_decoding_when_the_rollout_controller_raises(caplog):
    cfg = DecodeConfig(gen_length=3)
    ok = decode(garden(), [PROMPT], Branchy(), cfg,
                lookahead=lookahead(scorer="logprob", width=3, rollout="controller", hold=False))
    assert ok.generated.tolist() == [[1, 5, 6]] and ok.fallbacks.tolist() == [0]
    m = garden()
    with caplog.at_level(logging.WARNING, logger="adaptive_decoding.framework.engine.lookahead"):
        res = decode(m, [PROMPT], RaisesInRollouts(), cfg,
                     lookahead=lookahead(scorer="logprob", width=3, rollout="controller"))
    plain = decode(garden(), [PROMPT], Branchy(), cfg)
    assert res.generated.tolist() == plain.generated.tolist()
    assert int(res.fallbacks[0]) >= 1 and "controller exploded" in caplog.text
    assert int(res.nfe.sum()) == m.rows_seen


def test_rollouts_never_touch_the_controllers_memory():
    ctrl = build_controller("margin_topk", adapt=True, k=3)
    f_model = garden()
    state = DecodeState(config=DecodeConfig(gen_length=3), seeds=torch.zeros(1, dtype=torch.long), mask_token_id=9)
    ctrl.reset(state)
    x = torch.tensor([[7, 9, 9, 9]])
    from adaptive_decoding.framework.engine.features import FeatureOptions, StepWindow, compute_features

    logits = f_model(x)
    rel = torch.arange(4)[None] - 1
    masked = x == 9
    zero = torch.zeros(1, dtype=torch.long)
    window = StepWindow(eligible=masked, masked=masked, rel=rel, block_start=zero, block_end=torch.full((1,), 3),
                        block_index=zero, block_masked_at_start=torch.full((1,), 3), step=zero, block_step=zero)
    f = compute_features(logits, window, FeatureOptions(gen_length=3))
    d = ctrl.decide(f, state)
    before = {k: v.clone() for k, v in state.memory.items()}
    d.depth = torch.tensor([2])
    la = lookahead(scorer="logprob", width=3, rollout="controller")
    out = la.refine(f_model, x, torch.ones_like(x), f, d, d.commit, f.x0, state, torch.tensor([64]), controller=ctrl)
    assert out.extra_nfe.item() > 0 and not out.fallback.any()
    assert all(torch.equal(before[k], state.memory[k]) for k in before)


def _features(m, x):
    from adaptive_decoding.framework.engine.features import FeatureOptions, StepWindow, compute_features

    g = x.shape[1] - 1
    masked = x == m.mask_token_id
    zero = torch.zeros(1, dtype=torch.long)
    window = StepWindow(eligible=masked, masked=masked, rel=torch.arange(x.shape[1])[None] - 1, block_start=zero,
                        block_end=torch.full((1,), g), block_index=zero, block_masked_at_start=torch.full((1,), g),
                        step=zero, block_step=zero)
    return compute_features(m(x), window, FeatureOptions(gen_length=g))


def test_candidate_set_design_top_alternatives_joint_and_capped():
    f = _features(garden(), torch.tensor([[7, 9, 9, 9]]))
    commit = torch.tensor([[False, False, False, True]])
    k = torch.tensor([[1, 3, 3, 1]])
    d = Decision(commit=commit, k=k, depth=torch.tensor([1]))
    p1 = lookahead(width=3, positions=1, hold=False).plan(f, d, commit, torch.tensor([64]))
    assert p1.branch_pos.tolist() == [[1]]  # tied margins: the lower position
    assert p1.cand_tokens.tolist() == [[[0], [1], [2]]]  # a, b, c by probability
    ph = lookahead(width=3, positions=1).plan(f, d, commit, torch.tensor([64]))
    assert ph.hold.tolist() == [[True, False, False]]  # the hold candidate first, then a and b
    assert ph.cand_tokens.tolist()[0][1:] == [[0], [1]]
    p2 = lookahead(width=4, positions=2, hold=False).plan(f, d, commit, torch.tensor([64]))
    assert p2.branch_pos.tolist() == [[1, 2]]
    # joint assignments ranked by summed log-probability: (a,x) first, then (a,z) / (b,x), then (b,z)
    assert p2.cand_tokens.tolist()[0][0] == [0, 3]
    assert sorted(map(tuple, p2.cand_tokens.tolist()[0][1:3])) == [(0, 5), (1, 3)]
    assert p2.cand_tokens.tolist()[0][3] == [1, 5]
    # k = 2 at one position caps its alternatives
    d2 = Decision(commit=commit, k=torch.tensor([[1, 2, 3, 1]]), depth=torch.tensor([1]))
    p3 = lookahead(width=9, positions=2, hold=False).plan(f, d2, commit, torch.tensor([64]))
    assert int(p3.cand_ok.sum()) == 6
    assert lookahead(width=3).plan(f, Decision(commit=commit, k=torch.ones_like(k), depth=torch.tensor([1])),
                                   commit, torch.tensor([64])) is None  # nothing uncertain: no lookahead


def test_branch_lowest_takes_the_riskiest_uncertain_position_highest_the_next_commit():
    f = _features(garden(), torch.tensor([[7, 9, 9, 9]]))
    f.margin = torch.tensor([[0.0, 0.10, 0.40, 0.95]])  # slot 3 is committed, 1 and 2 are uncertain
    commit = torch.tensor([[False, False, False, True]])
    d = Decision(commit=commit, k=torch.tensor([[1, 3, 3, 1]]), depth=torch.tensor([1]))
    low = lookahead(width=3, branch="lowest").plan(f, d, commit, torch.tensor([64]))
    high = lookahead(width=3, branch="highest").plan(f, d, commit, torch.tensor([64]))
    assert low.branch_pos.tolist() == [[1]] and high.branch_pos.tolist() == [[2]]
    # the committed slot 3 has the highest margin of all but is never a branch position
    assert lookahead(width=3, positions=2, branch="highest").plan(f, d, commit, torch.tensor([64])).branch_pos.tolist() == [[2, 1]]
    with pytest.raises(ParameterError, match="branch='middle'.*lowest.*highest"):
        Lookahead.build(branch="middle")


def test_two_branch_positions_find_the_joint_mode_through_pseudo_likelihood():
    m = garden()
    res = decode(m, [PROMPT], ladder(), DecodeConfig(gen_length=3),
                 lookahead=lookahead(scorer="logprob", width=9, positions=2, hold=False, rescore="none"))
    assert res.generated.tolist() == [[1, 5, 6]]
    # 9 joint candidates × 2 verification forwards; nothing is left to roll out
    assert res.lookahead_nfe.tolist() == [18] and int(res.nfe.sum()) == m.rows_seen
    # without verification the branch tokens keep their marginals: (a, x) wins the product 0.42²
    res2 = decode(garden(), [PROMPT], ladder(), DecodeConfig(gen_length=3),
                  lookahead=lookahead(scorer="logprob", width=9, positions=2, branch_pll=False, hold=False,
                                      rescore="none"))
    assert res2.generated.tolist() == [[0, 3, 6]]
    with pytest.raises(ParameterError, match="Lookahead.verify is now called branch_pll"):
        Lookahead.build(verify=False)  # its earlier name


def test_lookahead_parameters_validate():
    with pytest.raises(ParameterError, match="Lookahead.width=0 is out of range"):
        Lookahead.build(width=0)
    with pytest.raises(ParameterError, match="rollout='beam'"):
        Lookahead.build(rollout="beam")
    with pytest.raises(ParameterError, match="rescore='joint'.*pll"):
        Lookahead.build(rescore="joint")
    with pytest.raises(ParameterError, match="Lookahead.advance=0 is out of range"):
        Lookahead.build(advance=0)
    la = Lookahead.build(scorer="logprob:0.5,repetition:1", width=2)
    assert la.get_scorer().display_name() == "mixture"


# ---------------------------------------------------------------------- guards
DIGITS = list(range(10))  # toy vocabulary: ids 0-9 are digits, 10-12 letters


def test_number_guard_commits_one_position_per_number_left_to_right():
    # answer 2 5 6 x 1 2 (x = 11 is not a digit), all confident: fast_dllm commits all at once
    m = ToyDenoiser(answer=[2, 5, 6, 11, 1, 2], conf=[0.99] * 6, vocab_size=16)
    cfg = DecodeConfig(gen_length=6)
    plain = decode(m, [[12, 12]], build_controller("fast_dllm"), cfg)
    assert plain.nfe.tolist() == [1]
    guard = build_controller("number_guard", inner="fast_dllm", digit_ids=DIGITS)
    res = decode(m, [[12, 12]], guard, cfg, trace=True)
    assert res.generated.tolist() == [[2, 5, 6, 11, 1, 2]]
    # step 1: leftmost of each number + the letter; then one digit per number per step
    assert [int(r["commits"][0]) for r in res.trace] == [3, 2, 1]
    assert res.nfe.tolist() == [3]


def test_number_guard_by_confidence_and_by_meta_spans():
    m = ToyDenoiser(answer=[2, 5, 6, 11], conf=[0.95, 0.99, 0.97, 0.99], vocab_size=16)
    cfg = DecodeConfig(gen_length=4)
    guard = build_controller("number_guard", inner="fast_dllm", digit_ids=DIGITS, order="confidence")
    res = decode(m, [[12, 12]], guard, cfg, trace=True)
    assert [int(r["commits"][0]) for r in res.trace] == [2, 1, 1]
    span = torch.tensor([[False, False, True, True]])  # the task marks positions 2-3 only
    meta_guard = build_controller("number_guard", inner="fast_dllm", rule="meta")
    res2 = decode(m, [[12, 12]], meta_guard, cfg, trace=True, context=DecodeContext(span_mask=span))
    assert [int(r["commits"][0]) for r in res2.trace] == [3, 1]


def test_number_guard_finds_digits_through_the_tokenizer():
    tok = CharTokenizer(alphabet="abcdefgh0123")
    assert tok.vocab_size == 15
    m = ToyDenoiser(answer=tok.encode("a012"), conf=[0.99] * 4, vocab_size=tok.vocab_size)
    guard = build_controller("number_guard", inner="fast_dllm")
    res = decode(m, [tok.encode("bb")], guard, DecodeConfig(gen_length=4), trace=True,
                 context=DecodeContext(tokenizer=tok))
    assert [int(r["commits"][0]) for r in res.trace] == [2, 1, 1]
    with pytest.raises(MissingContextError, match="number_guard needs the tokenizer in the decode context"):
        decode(m, [tok.encode("bb")], build_controller("number_guard", inner="fast_dllm"), DecodeConfig(gen_length=4))


def test_compliance_penalty_enters_the_entropy_of_entropy_topk():
    tok = CharTokenizer()
    text = "the cheapest pc"
    m = ToyDenoiser(answer=tok.encode(text), conf=[0.995] * len(text), vocab_size=tok.vocab_size)
    cfg = DecodeConfig(gen_length=len(text))
    prompt = [tok.encode("ab")]
    inner = build_controller("entropy_topk")
    d_plain = decode(m, prompt, inner, cfg, trace=True)
    assert int(d_plain.trace[0]["commits"][0]) == len(text)  # every position is confident
    ce = build_controller("compliance_entropy", inner="entropy_topk", weight=2.0)
    res = decode(m, prompt, ce, cfg, trace=True, context=DecodeContext(tokenizer=tok))
    banned = len("the cheapest")  # "the cheapest" is penalised, " pc" is not
    assert int(res.trace[0]["commits"][0]) == len(text) - banned
    assert int(res.trace[0]["penalised"][0]) == banned
    with pytest.raises(ParameterError, match="compliance_entropy.compliance"):
        build_controller("compliance_entropy", compliance={"numbers": "sometimes"})
    with pytest.raises(ParameterError, match="compliance_entropy.inner"):
        build_controller("compliance_entropy", inner="no_such_controller")


def test_cli_scorer_option_builds_the_lookahead():
    from adaptive_decoding.framework.cli.main import build_parser
    from adaptive_decoding.framework.cli.options import build_lookahead

    args = build_parser().parse_args(["decode", "--prompt", "1+2=", "--controller", "confidence_ladder",
                                      "--scorer", "logprob:0.7,repetition:1", "--lookahead", "width=2",
                                      "--lookahead", "rollout=sequential"])
    la = build_lookahead(args)
    assert (la.width, la.rollout) == (2, "sequential")
    assert [c["name"] for c in la.get_scorer().get_components()] == ["logprob", "repetition"]
    assert build_lookahead(build_parser().parse_args(["decode", "--prompt", "x"])) is None
    with pytest.raises(ParameterError, match="weight -2"):
        build_lookahead(build_parser().parse_args(["decode", "--scorer", "logprob:-2"]))
    with pytest.raises(ParameterError, match="Lookahead has no parameter 'wdth'"):
        build_lookahead(build_parser().parse_args(["decode", "--scorer", "logprob", "--lookahead", "wdth=2"]))
    with pytest.raises(ParameterError, match="without --scorer"):
        build_lookahead(build_parser().parse_args(["decode", "--lookahead", "width=2"]))
    from adaptive_decoding.framework.cli.options import LOOKAHEAD_OPTIONS

    assert sorted(LOOKAHEAD_OPTIONS) == sorted(Lookahead.params)  # --help names every knob


def _untrained(task_name):
    """The task and a 1-layer tiny denoiser with random weights for it (uncertain everywhere)."""
    from adaptive_decoding.framework.models.protocol import LoadedModel
    from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
    from adaptive_decoding.framework.tasks.base import get_task

    task = get_task(task_name)
    tok = task.tokenizer
    torch.manual_seed(0)
    den = TinyDenoiser(TinyConfig(vocab_size=tok.vocab_size, mask_token_id=tok.mask_token_id,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                  max_len=task.canvas_length, d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    return task, LoadedModel(denoiser=den, tokenizer=tok, name="untrained", task=task_name)


def test_lookahead_sweep_rows_on_an_untrained_pairs_model():
    from adaptive_decoding.framework.core.options import ExampleDraw
    from adaptive_decoding.framework.engine.lookahead.sweep import SweepGrid, lookahead_sweep

    task, loaded = _untrained("pairs")
    cfg = DecodeConfig(gen_length=task.gen_length)
    earlier = {k: v for k, v in EARLIER_DEFAULTS.items() if k not in ("width", "max_depth")}
    la = Lookahead.build(scorer="logprob:1,repetition:1", **{**earlier, "budget": 6})
    rows = lookahead_sweep(loaded, task, ladder(), cfg, lookahead=la, grid=SweepGrid.build(widths=[2], depths=[1, 3]),
                           draw=ExampleDraw.build(n=6, batch_size=4))
    assert [(r["width"], r["depth"]) for r in rows] == [(0, 0), (2, 1), (2, 3)]
    assert rows[0]["lookahead_nfe"] == 0 and rows[0]["fallbacks"] == 0
    for r in rows[1:]:
        assert 0 < r["lookahead_nfe"] <= 6  # an untrained model is uncertain everywhere; the budget caps it
        assert r["nfe"] > r["lookahead_nfe"]
    assert all(0.0 <= r["valid_slots"] <= 1.0 and 0.0 <= r["incoherent_slots"] <= 1.0 for r in rows)


def test_evaluate_hands_the_lookahead_scorer_the_tokenizer_prompts_and_metas():
    # before, `adec run` cells built their lookahead without a context: text scorers read token ids as numbers
    from adaptive_decoding.framework.engine.evaluate import evaluate
    from adaptive_decoding.framework.engine.scorer import Scorer

    seen = []

    class Recorder(Scorer):
        params: dict = {}

        def __init__(self) -> None:
            pass

        def _score(self, cands, context):
            seen.append((context.tokenizer, context.prompt_texts(cands), context.meta_for(int(cands.source[0]))))
            return torch.zeros(cands.n)

    task, loaded = _untrained("sudoku")
    tok = task.tokenizer
    cfg = DecodeConfig(gen_length=task.gen_length)
    evaluate(loaded, task, ladder(), cfg, n=3, batch_size=3, lookahead=lookahead(scorer=Recorder(), width=2, budget=4))
    examples = task.examples("test", 3)
    assert seen and all(t is tok for t, _, _ in seen)
    assert set(seen[0][1]) <= {ex.prompt for ex in examples} and seen[0][2].get("givens") is not None
