"""Block-causal decoding (LLaDA2.x's canvas) against LLaDA2.0's published ``generate``.

The reference below is LLaDA2.0's ``generate`` (inclusionAI's hub ``modeling_llada2_moe.py``, as
copied in ZHZisZZ/dllm ``dllm/pipelines/llada2/models/modeling_llada2_moe.py``; docs/models.md
writes it out), re-written here with its defects fixed:

* greedy is the argmax (dFactory's copy samples at T = 1 when temperature is 0);
* the block mask is boolean in the model's dtype (the published code casts it to bfloat16, which
  a float32 model's attention refuses);
* the mask id is never a prediction (the published softmax includes it: a model that predicts the
  mask commits the mask, the position stays masked and the step is wasted).

It runs on the reference network re-written from the published modeling code
(``tests/fixtures/real_format/modeling_llada2_moe.py``) of a tiny checkpoint in the real on-disk
format (blocks of 4); the framework decodes the same checkpoint with its own architecture.
"""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode

BS, MASK, EOS, V = 4, 310, 300, 320
HEAD_SCALE = 40.0  # a random tiny model is near uniform; a sharper head makes its decisions threshold-bound


@pytest.fixture(scope="module")
def models(tiny_llada2):
    """(the framework's denoiser, the reference network) of one tiny LLaDA2-MoE checkpoint."""
    return tiny_llada2(block_size=BS, mask=MASK, eos=EOS, vocab=V, head_scale=HEAD_SCALE)


def schedule(block_length: int, steps: int) -> list[int]:
    """``_get_num_transfer_tokens``: ``block_length // steps`` each step, the remainder first."""
    return [block_length // steps + (1 if j < block_length % steps else 0) for j in range(steps)]


def block_predictions(ref, x: torch.Tensor, tril: torch.Tensor, end: int, block_length: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the published generate over ``x[:, :end]`` with its block mask: the last block's
    argmax x0 and its probability p (the mask id never predicted)."""
    logits = ref(x[:, :end], attention_mask=tril[:end, :end].bool()[None, None],
                 position_ids=torch.arange(end)[None]).logits[0, -block_length:].float()
    logits[:, MASK] = float("-inf")
    probs = torch.softmax(logits, -1)
    x0 = probs.argmax(-1)
    return x0, probs.gather(-1, x0[:, None])[:, 0]


@torch.no_grad()
def llada2_generate(ref, prompt: list[int], *, gen_length: int, block_length: int = BS, steps: int = BS,
                    threshold: float = 0.95, minimal_topk: int = 1) -> tuple[list[int], int]:
    """LLaDA2.0's ``generate`` at temperature 0 (batch 1), defects fixed (module docstring): the
    generated tokens ``x[P : P + G]`` and the number of forwards."""
    steps = min(steps, gen_length // minimal_topk)
    P = len(prompt)
    nb = -(-(P + gen_length) // block_length)
    total = nb * block_length
    tril = torch.tril(torch.ones(nb, nb)).repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    x = torch.full((1, total), MASK, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    counts, nfe = schedule(block_length, steps), 0
    for k in range(P // block_length, nb):
        end = (k + 1) * block_length
        for step in range(steps):
            active = x[0, end - block_length:end] == MASK
            if not active.any():
                break
            x0, p = block_predictions(ref, x, tril, end, block_length)
            nfe += 1
            conf = torch.where(active, p, torch.tensor(float("-inf")))
            high = conf > threshold
            if int(high.sum()) >= counts[step]:
                transfer = high
            else:
                transfer = torch.zeros_like(active)
                transfer[torch.topk(conf, k=min(counts[step], int(active.sum()))).indices] = True
            block = x[0, end - block_length:end]
            block[transfer] = x0[transfer]
        if (x[0, P:end] == EOS).any():
            break
    return x[0, P:P + gen_length].tolist(), nfe


def answer(tokens: list[int]) -> list[int]:
    """Up to and including the first end-of-text (what both decoders' answers are)."""
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


# prompts shorter than, as long as and longer than a block, each with P + G a multiple of it
CASES = [([5, 6, 7], 13), ([8, 9, 10, 11], 12), ([12, 13, 14, 15, 16, 17], 10), ([20, 21, 22, 23, 24], 11)]


@pytest.mark.parametrize("threshold, steps", [(0.95, BS), (0.6, BS), (0.6, 2), (0.3, 3)])
@pytest.mark.parametrize("cache", ["none", "block"])
def test_token_and_nfe_identical_to_llada2_generate(models, threshold, steps, cache):
    den, ref = models
    ctrl = build_controller("llada2", threshold=threshold, steps=steps)
    for prompt, G in CASES:
        want, nfe = llada2_generate(ref, prompt, gen_length=G, steps=steps, threshold=threshold)
        res = decode(den, [prompt], ctrl, DecodeConfig(gen_length=G, cache=cache))
        got = res.generated[0].tolist()
        assert answer(got) == answer(want), (prompt, threshold, steps)
        assert int(res.nfe[0]) == nfe, (prompt, threshold, steps)
        assert int(res.answer_tokens[0]) == len(answer(want))


def test_the_cases_exercise_the_threshold_the_fallback_and_the_end_of_text_stop(models):
    """The designed cases are not all one path: some steps commit several positions above the
    threshold, some fall back to the schedule, and some rows stop at an end-of-text block."""
    den, ref = models
    multi = fallback = stopped = 0
    for prompt, G in CASES:
        res = decode(den, [prompt], build_controller("llada2", threshold=0.6), DecodeConfig(gen_length=G), trace=True)
        per_step = [int(r["commits"][0]) for r in res.trace]
        multi += sum(n > 1 for n in per_step)
        fallback += sum(n == 1 for n in per_step)
        stopped += int(EOS in res.generated[0].tolist() and int(res.nfe[0]) < G)
    assert multi and fallback and stopped


@pytest.mark.parametrize("cache", ["none", "block"])
def test_a_batch_of_ragged_prompts_equals_each_alone(models, cache):
    """Prompts of different lengths sit differently in their blocks; each row decodes as alone."""
    den, _ = models
    ctrl = build_controller("llada2", threshold=0.6)
    prompts = [p for p, _ in CASES] + [[30] * 9]
    config = DecodeConfig(gen_length=11, cache=cache)
    batch = decode(den, prompts, ctrl, config)
    for i, p in enumerate(prompts):
        alone = decode(den, [p], ctrl, config)
        assert batch.generated[i].tolist() == alone.generated[0].tolist()
        assert int(batch.nfe[i]) == int(alone.nfe[0])


def test_the_exact_block_cache_stores_a_finished_block_without_an_extra_forward(models):
    """cache='block' gives cache='none''s tokens and the same forwards: the next block's first
    forward re-runs the finished block and stores its final keys (dInfer and SGLang spend one more
    forward per block on that)."""
    den, _ = models
    ctrl = build_controller("llada2", threshold=0.6)
    prompts = [p for p, _ in CASES]
    none = decode(den, prompts, ctrl, DecodeConfig(gen_length=15, cache="none", eos_stop=False))
    block = decode(den, prompts, ctrl, DecodeConfig(gen_length=15, cache="block", eos_stop=False))
    assert torch.equal(none.generated, block.generated) and torch.equal(none.nfe, block.nfe)


def test_eos_stop_is_the_block_causal_default_and_can_be_turned_off(models):
    den, _ = models
    ctrl = build_controller("llada2", threshold=0.6)
    prompt, G = CASES[1]
    on = decode(den, [prompt], ctrl, DecodeConfig(gen_length=G))
    off = decode(den, [prompt], ctrl, DecodeConfig(gen_length=G, eos_stop=False))
    assert answer(on.generated[0].tolist()) == answer(off.generated[0].tolist())
    assert int(on.nfe[0]) <= int(off.nfe[0])
    assert int(on.answer_tokens[0]) == int(off.answer_tokens[0])


@pytest.mark.parametrize("settings, match", [
    (dict(block_length=2), r"block_length=2 is not the block size this block-causal model was trained with; "
                           r"allowed: 4"),
    (dict(cache="dual"), r"cache='dual' does not apply to a block-causal model.*allowed: none, block"),
    (dict(cache="prefix"), r"cache='prefix' does not apply to a block-causal model"),
])
def test_a_setting_the_model_has_no_meaning_for_fails_before_any_work(models, settings, match):
    den, _ = models
    calls = []
    den.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ParameterError, match=match):
        decode(den, [[5, 6, 7]], build_controller("llada2"), DecodeConfig(gen_length=12, **settings))
    assert not calls


def test_the_block_cache_is_refused_on_a_full_attention_model():
    from adaptive_decoding.framework.testing.toys import ContextToyDenoiser

    with pytest.raises(ParameterError, match=r"cache='block' does not apply to a full model.*allowed: none, "
                                             r"prefix, dual"):
        decode(ContextToyDenoiser(vocab_size=16), [[1, 2]], build_controller("sequential"),
               DecodeConfig(gen_length=4, cache="block"))


@torch.no_grad()
def llada21_generate(ref, prompt: list[int], *, gen_length: int, block_length: int = BS, threshold: float = 0.95,
                     editing_threshold: float = 0.9, max_post_steps: int = 16,
                     num_to_transfer: int = 1) -> tuple[list[int], int, int]:
    """LLaDA2.1's ``generate`` (joint threshold with token-to-token editing; dllm's
    ``dllm/pipelines/llada21/models/modeling_llada21_moe.py``) at temperature 0, batch 1, without
    ``eos_early_stop`` (its default), defects fixed as above: the generated tokens, forwards, edits."""
    P = len(prompt)
    nb = -(-(P + gen_length) // block_length)
    tril = torch.tril(torch.ones(nb, nb)).repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    x = torch.full((1, nb * block_length), MASK, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    nfe = edits = 0
    for k in range(P // block_length, nb):
        start, end = k * block_length, (k + 1) * block_length
        prompt_in_block = torch.arange(start, end) < P
        post = 0
        while True:
            old = x[0, start:end].clone()
            active = old == MASK
            if not active.any():
                post += 1
                if post > max_post_steps:
                    break
            x0, p = block_predictions(ref, x, tril, end, block_length)
            nfe += 1
            transfer = torch.zeros_like(active)
            if active.any():
                high = (p > threshold) & active
                if int(high.sum()) >= num_to_transfer:
                    transfer = high
                else:
                    conf = torch.where(active, p, torch.tensor(float("-inf")))
                    transfer[torch.topk(conf, k=min(num_to_transfer, int(active.sum()))).indices] = True
            edit = ~active & ~prompt_in_block & (p > editing_threshold) & (x0 != old)
            x[0, start:end][transfer | edit] = x0[transfer | edit]
            edits += int(edit.sum())
            if not active.any() and not edit.any():
                break
    return x[0, P:P + gen_length].tolist(), nfe, edits


@pytest.mark.parametrize("threshold, editing_threshold, max_post_steps", [(0.95, 0.9, 16), (0.6, 0.5, 3),
                                                                          (0.3, 0.2, 1), (0.3, 0.2, 0)])
@pytest.mark.parametrize("cache", ["none", "block"])
def test_joint_threshold_is_token_nfe_and_edit_identical_to_llada21_generate(models, threshold, editing_threshold,
                                                                           max_post_steps, cache):
    den, ref = models
    ctrl = build_controller("llada21", threshold=threshold, editing_threshold=editing_threshold,
                            max_post_steps=max_post_steps)
    for prompt, G in CASES:
        want, nfe, edits = llada21_generate(ref, prompt, gen_length=G, threshold=threshold,
                                            editing_threshold=editing_threshold, max_post_steps=max_post_steps)
        res = decode(den, [prompt], ctrl, DecodeConfig(gen_length=G, cache=cache, eos_stop=False))
        assert res.generated[0].tolist() == want, (prompt, threshold)
        assert (int(res.nfe[0]), int(res.edits[0])) == (nfe, edits), (prompt, threshold)


def test_the_joint_threshold_cases_edit_and_use_post_steps(models):
    """The designed cases are not all one path: tokens are edited, and blocks take forwards after
    their masks are gone (more forwards than the masked positions' steps)."""
    den, ref = models
    edits = post = 0
    for prompt, G in CASES:
        _, nfe, e = llada21_generate(ref, prompt, gen_length=G, threshold=0.3, editing_threshold=0.2,
                                     max_post_steps=3)
        edits += e
        post += nfe > G // 2
    assert edits > 0 and post > 0
