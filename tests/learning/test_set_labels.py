"""Set labels (framework/learning/set_labels.py), the dependence features and the tasks' verifiers of
partial answers, on a designed toy of exchangeable pairs: k slots "L R ," whose two words are right
only together (modes (0, 2) and (1, 3), commas 4 between slots)."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.learning.dagger import collect_on_policy
from adaptive_decoding.framework.learning.features import DEPENDENCE_FEATURES, FEATURE_NAMES, feature_matrix
from adaptive_decoding.framework.learning.options import DaggerVisit
from adaptive_decoding.framework.learning.policy import save_policy
from adaptive_decoding.framework.learning.rollouts import StepRecorder
from adaptive_decoding.framework.learning.set_labels import (
    SetLabelError,
    collect_set_labelled,
    greedy_safe_set,
)
from adaptive_decoding.framework.learning.train import train_logreg
from adaptive_decoding.framework.testing.toys import CachedToy

MODES = ((0, 2), (1, 3))
COMMA, K, V = 4, 3, 8
G = 3 * K - 1
MASK = V - 1


class PairsDenoiser(torch.nn.Module):
    """Slot s = generation positions (3s, 3s + 1), comma at 3s + 2. While both words of a slot are
    masked, its first word puts 0.52 on mode 0's word and its second 0.52 on mode 1's: the marginal
    argmaxes disagree ("New Francisco"); once one word is decided the other follows it (0.999)."""

    vocab_size, mask_token_id, eos_token_id, pad_token_id, prompt_length = V, MASK, V - 2, V - 3, 1

    def forward(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        b, n = input_ids.shape
        probs = torch.full((b, n, V), 1e-9)
        probs.scatter_(2, input_ids.unsqueeze(-1), 1.0)
        gen = input_ids[:, 1:1 + G]
        for s in range(K):
            cols = (3 * s, 3 * s + 1)
            for w, col in enumerate(cols):
                other = gen[:, cols[1 - w]]
                row = torch.full((b, V), 1e-9)
                row[:, MODES[0][w]], row[:, MODES[1][w]] = (0.52, 0.48) if w == 0 else (0.48, 0.52)
                for m in MODES:
                    follow = (other == m[1 - w])[:, None]
                    row = torch.where(follow, torch.full((b, V), 1e-9).index_fill(1, torch.tensor(m[w]), 0.999), row)
                masked = (gen[:, col] == MASK)[:, None]
                probs[:, 1 + col] = torch.where(masked, row, probs[:, 1 + col])
            if s < K - 1:
                comma = torch.full((b, V), 1e-9).index_fill(1, torch.tensor(COMMA), 1.0)
                probs[:, 1 + 3 * s + 2] = torch.where((gen[:, 3 * s + 2] == MASK)[:, None], comma,
                                                      probs[:, 1 + 3 * s + 2])
        return (probs / probs.sum(-1, keepdim=True)).log()


def pairs_toy() -> PairsDenoiser:
    return PairsDenoiser()


def check(tokens, committed) -> bool:
    """The toy's verifier: every slot's committed words fit one mode, commas where they belong."""
    for i in range(K):
        words = [(tokens[3 * i + w] if committed[3 * i + w] else None) for w in (0, 1)]
        if not any(all(x in (None, m[w]) for w, x in enumerate(words)) for m in MODES):
            return False
        if i < K - 1 and committed[3 * i + 2] and tokens[3 * i + 2] != COMMA:
            return False
    return True


def is_left(pos: torch.Tensor) -> torch.Tensor:
    return pos % 3 == 0


def test_greedy_safe_set_keeps_one_word_of_each_incoherent_pair():
    mask = MASK
    flags = greedy_safe_set(check, [mask] * G, mask, [(2, COMMA), (0, 0), (1, 3), (3, 1), (4, 3)])
    assert flags == [True, True, False, True, True]  # (0, 3) is "New Francisco"; (1, 3) is a mode
    assert greedy_safe_set(check, [0, 3] + [mask] * (G - 2), mask, [(3, 0)]) is None  # a doomed state
    with pytest.raises(SetLabelError, match="completable"):
        greedy_safe_set(lambda t, c: None, [mask] * G, mask, [(0, 0)])


def test_set_labels_separate_the_two_words_where_reference_labels_cannot():
    """At T = 1 each word's sampled prediction and the reference's end are coin flips, so at the
    first state either word of a slot matches the reference's end about half the time, whichever is
    ranked first; the set label keeps the first-ranked word of each slot always, its partner only
    when the two sampled words agree."""
    toy, n = pairs_toy(), 200
    prompts, seeds = [[5]] * n, torch.arange(n)
    cfg = DecodeConfig(gen_length=G, block_length=G, temperature=1.0)
    seq = build_controller("sequential")
    ref = collect_on_policy(toy, prompts, seq, cfg, seeds=seeds, visit=DaggerVisit.build(states_per_rollout=G))
    sets = collect_set_labelled(toy, prompts, seq, cfg, [check] * n, seeds=seeds)
    for data, first_rate, second_rate in ((ref, (0.35, 0.65), (0.35, 0.65)), (sets, (1.0, 1.0), (0.35, 0.65))):
        ranked = {0: [], 1: []}
        for r in range(n):
            at = (data.sample == r) & (data.step == 0)
            for s in range(K):
                left, right = at & (data.position == 3 * s), at & (data.position == 3 * s + 1)
                conf = (float(data.X[left, 0]), float(data.X[right, 0]))
                order = (left, right) if conf[0] >= conf[1] else (right, left)
                ranked[0].append(float(data.y[order[0]]))
                ranked[1].append(float(data.y[order[1]]))
        assert first_rate[0] <= sum(ranked[0]) / len(ranked[0]) <= first_rate[1]
        assert second_rate[0] <= sum(ranked[1]) / len(ranked[1]) <= second_rate[1]


def test_set_labels_come_from_the_states_the_controller_visits():
    """Two tokens a step (LLaDA's top-2): its second state has G − 2 eligible positions (the
    sequential trajectory's has G − 1); at that step it commits both words of slot 0 ("New
    Francisco"), so the states after it cannot end correct and give no rows."""
    toy, n = pairs_toy(), 4
    cfg = DecodeConfig(gen_length=G, block_length=G)
    sets = collect_set_labelled(toy, [[5]] * n, build_controller("llada", steps=G // 2), cfg, [check] * n,
                                seeds=torch.arange(n))
    res = decode(toy, [[5]] * n, build_controller("llada", steps=G // 2), cfg, seeds=torch.arange(n))
    assert res.nfe.tolist() == [4] * n and not any(check(r, [True] * G) for r in res.generated.tolist())
    for r in range(n):
        steps = sets.step[sets.sample == r]
        assert int((steps == 1).sum()) == G - 2 and sorted(set(steps.tolist())) == [0, 1]
        second = (sets.sample == r) & (sets.step == 1)  # the first word of each slot, not its partner
        assert sets.y[second].tolist() == [float(p % 3 == 0) for p in sets.position[second].tolist()]


def test_a_policy_trained_on_set_labels_commits_one_word_per_pair(tmp_path):
    toy, n = pairs_toy(), 16
    cfg = DecodeConfig(gen_length=G, block_length=G)
    data = collect_set_labelled(toy, [[5]] * n, build_controller("sequential"), cfg, [check] * n,
                                seeds=torch.arange(n))
    path = save_policy(train_logreg(data), tmp_path / "logreg.pt", kind="logreg", threshold=0.5)
    res = decode(toy, [[5]] * 4, build_controller("logreg", policy=str(path)), cfg)
    assert res.nfe.tolist() == [2] * 4  # the first words (and commas), then their partners
    assert all(check(row, [True] * G) for row in res.generated.tolist())
    greedy = decode(toy, [[5]] * 4, build_controller("fast_dllm", threshold=0.4), cfg)
    assert greedy.nfe.tolist() == [1] * 4 and not any(check(r, [True] * G) for r in greedy.generated.tolist())


class _FeatureRecorder(StepRecorder):
    def record(self, f, state, rows, decision):
        b, i = f.eligible.nonzero(as_tuple=True)
        return (f.position[b, i], rows[b], feature_matrix(f, self.gen_length)[b, i])


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_dependence_features_equal_their_no_cache_values_under_every_cache_mode(cache):
    """Blocks of 4 over the pairs (slot 1 straddles the block edge): the features of every step."""
    toy = CachedToy(pairs_toy())
    runs = {}
    for mode in ("none", cache):
        rec = _FeatureRecorder(build_controller("fast_dllm", threshold=0.9), G)
        decode(toy, [[5], [5]], rec, DecodeConfig(gen_length=G, block_length=4, cache=mode), seeds=torch.arange(2))
        runs[mode] = [torch.cat([r[k] for r in rec.records]) for k in range(3)]
    for a, b in zip(runs["none"], runs[cache]):
        assert torch.equal(a, b)
    dep = [FEATURE_NAMES.index(n) for n in ("left_uncertain", "right_uncertain", "nearest_uncertain_confidence")]
    assert runs["none"][2][:, dep].abs().sum() > 0  # the features are not all zero here


def test_which_of_two_guesses_leads_is_a_column_of_its_own():
    """The nearest other uncertain position (confidence < 0.9) and who leads: 1 ahead, 0 behind, 0.5
    on a tie, 1 with no other uncertain position; a gap of 0.05 reads the same as one of 0.59."""
    from types import SimpleNamespace

    from adaptive_decoding.framework.learning.features import dependence_columns

    conf = torch.tensor([[0.99, 0.40, 0.35, 0.99, 0.30, 0.30], [0.99, 0.50, 0.99, 0.99, 0.99, 0.99]])
    f = SimpleNamespace(eligible=torch.ones_like(conf, dtype=torch.bool), confidence=conf,
                        position=torch.arange(6).expand(2, 6))
    cols = dict(zip(DEPENDENCE_FEATURES, dependence_columns(f)))
    assert cols["nearest_uncertain_leads"].tolist() == [[1.0, 1.0, 0.0, 1.0, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]
    assert torch.allclose(cols["nearest_uncertain_gap"][0], torch.tensor([0.59, 0.05, -0.05, 0.64, 0.0, 0.0]))
    assert torch.allclose(cols["nearest_uncertain_distance"][1], torch.tensor([1, 6, 1, 2, 3, 4]) / 6.0)


def test_the_tasks_verifiers_of_partial_answers():
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.tasks.pairs import PAIR_GROUPS

    phrases = get_task("phrases")
    ex = phrases.examples("test", 1)[0]
    ids, tok = phrases.target_ids(ex), phrases.tokenizer
    assert phrases.completable(ex, ids, [True] * len(ids))
    first = tok.decode([ids[0]], stop_at_eos=False)
    other = next(p for p in PAIR_GROUPS[phrases.groups_of(ex)[0]] if p[0] != first)
    mixed = [tok.encode(other[0])[0]] + ids[1:]
    one = [True] + [False] * (len(ids) - 1)
    assert phrases.completable(ex, mixed, one)  # the other phrase's first word alone can still end right
    assert not phrases.completable(ex, mixed, [True, True] + [False] * (len(ids) - 2))  # "New Francisco"
    comma = list(ids)
    comma[2] = ids[0]
    assert not phrases.completable(ex, comma, [False, False, True] + [False] * (len(ids) - 3))
    sudoku = get_task("sudoku9")
    ex = sudoku.examples("test", 1)[0]
    ids = sudoku.target_ids(ex)
    wrong = [ids[1] if ids[1] != ids[0] else ids[2]] + ids[1:]
    assert sudoku.completable(ex, ids, [True] * 81) and not sudoku.completable(ex, wrong, [True] + [False] * 80)
    assert get_task("addition").completable(*(lambda t, e: (e, t.target_ids(e), [True] * t.gen_length))(
        get_task("addition"), get_task("addition").examples("test", 1)[0]))
    text = get_task("text")
    assert text.completable(text.examples("test", 1)[0], [0], [True]) is None  # no verifier: cannot tell


def test_the_set_bound_commits_one_word_per_slot_then_the_rest():
    """experiments/studies/set_bound.py's hindsight controller on the pairs toy: the commas and one
    word of each slot in the first forward, their partners in the second, every answer coherent."""
    from adaptive_decoding.experiments.studies.set_bound import HindsightSet

    res = decode(pairs_toy(), [[5]] * 3, HindsightSet([check] * 3), DecodeConfig(gen_length=G, block_length=G))
    assert res.nfe.tolist() == [2] * 3 and all(check(r, [True] * G) for r in res.generated.tolist())
    assert res.generated[:, 0].tolist() == [MODES[0][0]] * 3  # the first-ranked word is the model's own x0
