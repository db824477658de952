"""The decoding loop's invariants and the baselines' exact decisions on designed toys."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import token_statistics
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.testing.toys import ToyDenoiser

ANSWER = [1, 2, 3, 4, 5, 6, 7, 8]
CONF = [0.95, 0.5, 0.99, 0.45, 0.92, 0.6, 0.7, 0.8]
PROMPT = [0, 0]


def toy():
    return ToyDenoiser(answer=ANSWER, conf=CONF, vocab_size=16, prompt_length=2)


def commit_positions(result, row=0, prompt_len=2):
    """Per step, the sorted generation positions committed in ``row``."""
    out = []
    for rec in result.trace:
        rows = rec["rows"].tolist()
        if row in rows:
            mask = rec["commit"][rows.index(row)]
            out.append(sorted((mask.nonzero().squeeze(1) - prompt_len).tolist()))
    return out


def run(name, gen_length=8, block_length=None, prompts=(PROMPT,), model=None, **params):
    ctrl = build_controller(name, **params)
    cfg = DecodeConfig(gen_length=gen_length, block_length=block_length)
    return decode(model or toy(), [list(p) for p in prompts], ctrl, cfg, trace=True)


def random_tiny(seed=0, vocab=12, max_len=40):
    torch.manual_seed(seed)
    m = TinyDenoiser(TinyConfig(vocab_size=vocab, mask_token_id=vocab - 1, pad_token_id=vocab - 2,
                                eos_token_id=vocab - 3, max_len=max_len, d_model=32, n_layers=2,
                                n_heads=2, d_ff=64))
    with torch.no_grad():  # peaky, context-dependent predictions
        m.head.weight.mul_(60.0)
    return m.eval()


# ----------------------------------------------------------------------------- exact decisions
def test_sequential_commits_most_confident_first():
    r = run("sequential")
    assert commit_positions(r) == [[2], [0], [4], [7], [6], [5], [1], [3]]
    assert r.generated[0].tolist() == ANSWER
    assert r.nfe.tolist() == [8]


def test_fast_dllm_threshold_commits_all_above_then_best():
    r = run("fast_dllm", threshold=0.9)
    assert commit_positions(r) == [[0, 2, 4], [7], [6], [5], [1], [3]]
    assert r.nfe.tolist() == [6]


def test_llada_splits_block_tokens_over_steps():
    r = run("llada", block_length=4, steps=4)
    assert commit_positions(r) == [[0, 2], [1, 3], [4, 7], [5, 6]]
    # 5 tokens per block over 2 steps: LLaDA's split gives 3 then 2
    r = run("llada", gen_length=10, block_length=5, steps=4, model=ToyDenoiser(
        answer=list(range(1, 11)), conf=[0.9, 0.8, 0.7, 0.6, 0.5, 0.91, 0.81, 0.71, 0.61, 0.51], prompt_length=2))
    assert [len(c) for c in commit_positions(r)] == [3, 2, 3, 2]
    assert commit_positions(r)[0] == [0, 1, 2]


def test_dream_schedule_counts_follow_timesteps():
    # t_i = 1 - i(1-ε)/4: commits floor(n(1 - s/t)) = 1, 2, 2, then all 3 remaining
    r = run("dream_confidence", steps=4)
    assert [len(c) for c in commit_positions(r)] == [1, 2, 2, 3]
    assert commit_positions(r)[:2] == [[2], [0, 4]]


def test_dream_margin_confidence_entropy_rank_differently():
    # confidences [.5, .9, .46, .55] with runners-up [.05, .05, .44, .4]:
    # by confidence 1, 3, 0, 2; by margin (.45, .85, .02, .15) 1, 0, 3, 2
    model = ToyDenoiser(answer=[1, 2, 3, 4], conf=[0.5, 0.9, 0.46, 0.55], second=[0.05, 0.05, 0.44, 0.4],
                        prompt_length=2)
    # with G = steps = 4 Dream's floor(n(1 - s/t)) is 0 at every step but the last: one per step
    assert commit_positions(run("dream_confidence", gen_length=4, steps=4, model=model)) == [[1], [3], [0], [2]]
    assert commit_positions(run("dream_margin", gen_length=4, steps=4, model=model)) == [[1], [0], [3], [2]]
    ent = run("dream_entropy", gen_length=4, steps=4, model=model)
    h = token_statistics(model(torch.tensor([[0, 0, 15, 15, 15, 15]]))[0, 2:])["entropy"]
    assert [p for step in commit_positions(ent) for p in step] == torch.argsort(h).tolist()
    assert ent.forced.sum() == 0


def test_dream_origin_reveals_by_probability_and_finishes_on_last_step():
    one = run("dream_origin", steps=1)
    assert one.nfe.tolist() == [1] and one.generated[0].tolist() == ANSWER
    model = random_tiny(7)
    r = decode(model, [[1, 2]] * 64, build_controller("dream_origin", steps=4), DecodeConfig(gen_length=16),
               seeds=torch.arange(64), trace=True)
    assert (r.nfe <= 4).all() and (r.generated != model.mask_token_id).all()
    # first step reveals each position with probability 1 - s/t ≈ 0.25: about 4 of 16 per row
    first = r.trace[0]["commits"].float().mean().item()
    assert 2.5 < first < 5.5


def test_eb_prefix_rule_against_entropies():
    model = toy()
    logits = model(torch.tensor([PROMPT + [15] * 8]))[0, 2:]
    h = token_statistics(logits)["entropy"]
    order = torch.argsort(h).tolist()
    hs = h[order]
    gamma = float(hs[0] + hs[1]) + 1e-4  # admits the first three: h1 + h2 + h3 - h3 <= γ
    r = run("eb", gamma=gamma)
    assert commit_positions(r)[0] == sorted(order[:3])
    gamma = float(hs[0]) + 1e-5  # admits exactly two
    r = run("eb", gamma=gamma)
    assert commit_positions(r)[0] == sorted(order[:2])


# ----------------------------------------------------------------------------- equivalences
@pytest.mark.parametrize("name,params", [
    ("fast_dllm", {"threshold": 1.01}),
    ("llada", {"steps": 8}),
    ("eb", {"gamma": 0.0, "order": "confidence"}),
    ("dream_confidence", {"steps": 8}),
])
def test_one_token_per_step_equivalences(name, params):
    model = random_tiny(3)
    prompts = [[1, 2, 3], [4, 5], [6]]
    ref = run("sequential", prompts=prompts, model=model)
    got = run(name, prompts=prompts, model=model, **params)
    assert torch.equal(got.generated, ref.generated)
    assert got.nfe.tolist() == [8, 8, 8]
    for row in range(3):
        assert commit_positions(got, row, len(prompts[row])) == commit_positions(ref, row, len(prompts[row]))


def test_eb_gamma_zero_is_one_token_per_step_in_entropy_order():
    model = random_tiny(3)
    r = run("eb", gamma=0.0, prompts=[[1, 2, 3], [4, 5]], model=model)
    assert r.nfe.tolist() == [8, 8]
    assert all(c.tolist() == [1, 1] for c in (rec["commits"] for rec in r.trace))


def test_llada_with_blocks_steps_equal_length_is_blockwise_sequential():
    model = random_tiny(4)
    got = run("llada", block_length=4, steps=8, prompts=[[1, 2]], model=model)
    ref = run("sequential", block_length=4, prompts=[[1, 2]], model=model)
    assert commit_positions(got) == commit_positions(ref)
    assert all(max(c) < 4 for c in commit_positions(got)[:4])
    assert all(min(c) >= 4 for c in commit_positions(got)[4:])


# ----------------------------------------------------------------------------- loop invariants
ALL_BASELINES = [
    ("sequential", {}), ("llada", {"steps": 4}), ("llada_random", {"steps": 4}),
    ("dream_confidence", {"steps": 4}), ("dream_margin", {"steps": 4}), ("dream_entropy", {"steps": 4}),
    ("dream_entropy", {"steps": 4, "alg_temp": 0.5}), ("fast_dllm", {"threshold": 0.5}), ("eb", {"gamma": 0.5}),
]


@pytest.mark.parametrize("name,params", ALL_BASELINES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_invariants_and_batch_equals_singles(name, params, temperature):
    model = random_tiny(5)
    prompts = [[1, 2, 3, 4], [5], [6, 7], [8, 9, 1]]
    cfg = DecodeConfig(gen_length=8, block_length=4, temperature=temperature)
    seeds = torch.tensor([11, 12, 13, 14])
    batch = decode(model, prompts, build_controller(name, **params), cfg, seeds=seeds, trace=True)
    for b, p in enumerate(prompts):
        # prompt untouched, every generated position decided, once
        assert batch.tokens[b, : len(p)].tolist() == p
        assert (batch.generated[b] != model.mask_token_id).all()
        per_step = commit_positions(batch, b, len(p))
        flat = [q for step in per_step for q in step]
        assert sorted(flat) == list(range(8)), "each position committed exactly once"
        assert all(len(step) >= 1 for step in per_step), "progress every step"
        assert batch.nfe[b] == len(per_step) == batch.steps[b]
        single = decode(model, [p], build_controller(name, **params), cfg, seeds=seeds[b : b + 1])
        assert torch.equal(single.generated[0], batch.generated[b])
        assert single.nfe[0] == batch.nfe[b]
    assert batch.forced.sum() == 0


def test_temperature_sampling_depends_on_seed_only():
    model = random_tiny(6)
    cfg = DecodeConfig(gen_length=8, temperature=2.0)
    a = decode(model, [[1, 2]] * 4, build_controller("fast_dllm"), cfg, seeds=torch.arange(4))
    b = decode(model, [[1, 2]] * 4, build_controller("fast_dllm"), cfg, seeds=torch.arange(4))
    assert torch.equal(a.generated, b.generated)
    assert len({tuple(r) for r in a.generated.tolist()}) > 1, "different seeds sample differently"


def test_all_confident_and_none_confident_batches():
    sure = ToyDenoiser(answer=ANSWER, conf=[0.99] * 8, prompt_length=2)
    unsure = ToyDenoiser(answer=ANSWER, conf=[0.3] * 8, prompt_length=2)
    for name, params in ALL_BASELINES:
        r = run(name, model=sure, **params)
        assert r.generated[0].tolist() == ANSWER
        r = run(name, model=unsure, **params)
        assert (r.generated[0] != 15).all()
    assert run("fast_dllm", model=sure).nfe.tolist() == [1]
    assert run("fast_dllm", model=unsure).nfe.tolist() == [8]


def test_bad_config_values_are_refused_with_allowed_range():
    with pytest.raises(ParameterError, match=r"block_length=3 does not divide gen_length=8"):
        DecodeConfig(gen_length=8, block_length=3).validate()
    with pytest.raises(ParameterError, match=r"temperature=-1.0 is out of range; allowed: number in \[0, inf\)"):
        DecodeConfig(temperature=-1.0).validate()
    with pytest.raises(ParameterError, match=r"llada.steps=3 must be a multiple of the number of blocks"):
        run("llada", block_length=4, steps=3)
    with pytest.raises(ParameterError, match=r"eb.gamma=-0.1 is out of range"):
        build_controller("eb", gamma=-0.1)
