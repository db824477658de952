"""SDAR and Fast-dLLM v2 on the block-causal engine against their published ``generate``.

The references below are re-written from the published code (docs/models.md writes both out step
by step) with the defects fixed that docs/models.md lists:

* SDAR's ``block_diffusion_generate`` (JetAstra/SDAR ``generate.py``): greedy is the argmax (the
  published sampler divides by zero at temperature 0); the top-k fallback picks masked columns
  only (the published one re-picks decided ones, the prompt's included, once fewer masks remain
  than the quota); the canvas ends at ``P + G`` (the cases keep ``P + G`` a multiple of the block).
* Fast-dLLM v2's ``generate`` (hub ``modeling.py``), without its approximate sub-block cache: a
  prompt of one whole block is prefilled too (the published code prefills only longer prompts);
  the block mask is the checkpoint's block size in every forward (the published decoding forwards
  use 32); blocks are decoded until the canvas covers ``P + G`` (the published count is
  ``G // block``).

In both, the mask id is never a prediction: its logit is removed before the softmax (the engine's
zero-masking; the published argmax may pick it, and Fast-dLLM v2 then loops forever).

What the engine does differently, by design, is in the NFE only (docs/models.md, "SDAR on the
engine" and "Fast-dLLM v2 on the engine"): it stores a finished block in the next block's first
forward and builds the prompt's cache in the first decoding forward, so

* SDAR: NFE = reference NFE − blocks decoded − [P ≥ b] (the reference's store and prefill forwards);
* Fast-dLLM v2: the reference takes a block's first token from the forward that stores the block
  before it; the engine's first forward in a block gives the same logits there (block-causal
  attention) and commits that token alone, so NFE = reference NFE − [P > b and P mod b ≠ 0] (the
  prefill, which the engine does not need when the prompt's last block is shared) − [no
  end-of-text] (the store forward after the last block, whose logits nothing reads).

Each runs on the compact reference network (``tests/fixtures/real_format/families.py``) of a tiny
checkpoint in the real on-disk format, the framework on the same checkpoint with its own
architecture; the final norm's weight is scaled on both so that decisions are threshold-bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import _adec_real_format_families as real_format_families  # loaded by tests/conftest.py
import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import DecodeResult, decode
from adaptive_decoding.framework.models.arch import load_architecture
from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

MASK, V = 310, 320
SDAR_BS, SDAR_EOS = 4, 194  # an id this checkpoint predicts in some answers, so that some rows stop
FAST_BS, FAST_EOS = 8, 81
HEAD_SCALE = 40.0  # a random tiny model is near uniform; a sharper head makes its decisions threshold-bound


FAM = real_format_families


def _pair(folder: Path, eos: int) -> tuple[OwnArchitectureDenoiser, torch.nn.Module]:
    """(the framework's denoiser, the reference network) of one checkpoint, both sharpened alike."""
    own, ref = load_architecture(folder, dtype=torch.float32), FAM.reference_model(folder)
    with torch.no_grad():
        own.norm.weight.mul_(HEAD_SCALE)
        ref.model.norm.weight.mul_(HEAD_SCALE)
    return OwnArchitectureDenoiser(own, mask_token_id=MASK, vocab_size=V, eos_token_id=eos), ref


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sdar") / "ckpt"
    FAM.build(folder, FAM.sdar_config(block_size=SDAR_BS, mask_token_id=MASK, eos_token_id=SDAR_EOS), seed=5)
    return _pair(folder, SDAR_EOS)


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fast") / "ckpt"
    FAM.build(folder, FAM.fast_dllm_v2_config(bd_size=FAST_BS, mask_token_id=MASK, eos_token_id=FAST_EOS), seed=7)
    return _pair(folder, FAST_EOS)


@dataclass
class Reference:
    """A reference run: the tokens after the prompt (cut after the first end-of-text), its forwards,
    and the blocks it decoded."""

    tokens: list[int]
    nfe: int
    blocks: int


def answer(tokens: list[int], eos: int) -> list[int]:
    """Up to and including the first end-of-text (what both decoders' answers are)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """argmax and its probability per row of ``logits`` ``[n, V]``, the mask id never predicted."""
    z = logits.float().clone()
    z[:, MASK] = float("-inf")
    p = torch.softmax(z, -1)
    x0 = p.argmax(-1)
    return x0, p.gather(-1, x0[:, None])[:, 0]


# ---------------------------------------------------------------------------------------- SDAR
def quotas(block_length: int, steps: int) -> list[int]:
    """``get_num_transfer_tokens``: ``block_length // steps`` each, the remainder first."""
    return [block_length // steps + (1 if j < block_length % steps else 0) for j in range(steps)]


def sdar_step(logits: torch.Tensor, cur: torch.Tensor, quota: int, threshold: float, published: bool = False) -> None:
    """One ``low_confidence_dynamic`` step on the block ``cur`` ``[b]`` (in place), the fallback fixed
    (``published``: as published, ``topk(confidence, quota)`` with −inf at decided columns)."""
    active = cur == MASK
    x0, p = greedy(logits)
    conf = torch.where(active, p, torch.tensor(float("-inf")))
    high = conf > threshold
    if int(high.sum()) >= quota:
        transfer = high
    else:  # fixed: the min(quota, #masked) most confident masked columns, never a decided one
        transfer = torch.zeros_like(active)
        k = quota if published else min(quota, int(active.sum()))
        transfer[torch.topk(conf, k=k).indices] = True
    cur[transfer] = x0[transfer]


@torch.no_grad()
def sdar_generate(ref, prompt: list[int], *, gen_length: int, block_length: int = SDAR_BS,
                  steps: int = SDAR_BS, threshold: float = 0.85, published_fallback: bool = False) -> Reference:
    """SDAR's ``block_diffusion_generate`` at temperature 0 (batch 1), defects fixed (module docstring)."""
    P, total, B = len(prompt), len(prompt) + gen_length, block_length
    assert total % B == 0, "the cases keep P + G a multiple of the block"
    nb = total // B
    cols = torch.arange(total)
    mask = (cols[:, None] // B >= cols[None, :] // B).float()  # tril(ones(nb, nb)) repeated B times
    x = torch.full((1, total), MASK, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    past: list = []
    pre, nfe, blocks = (P // B) * B, 0, 0
    if pre:  # prefill: store the prompt's whole blocks
        FAM.sdar_forward(ref, x[:, :pre], mask[None, :pre, :pre], cols[None, :pre], past, store_kv=True)
        nfe += 1
    counts = quotas(B, steps)
    for k in range(P // B, nb):
        s, e = k * B, (k + 1) * B
        cur, blocks = x[:, s:e].clone(), blocks + 1
        for step in range(steps + 1):
            if not (cur == MASK).any():  # store the finished block: one more forward
                FAM.sdar_forward(ref, cur, mask[None, s:e, :e], cols[None, s:e], past, store_kv=True)
                nfe += 1
                break
            assert step < steps, "the fixed fallback finishes a block within its steps"
            logits = FAM.sdar_forward(ref, cur, mask[None, s:e, :e], cols[None, s:e], past, store_kv=False)[0]
            nfe += 1
            sdar_step(logits, cur[0], counts[step], threshold, published_fallback)
        x[:, s:e] = cur
        if (x[0, P:] == SDAR_EOS).any():
            break
    if published_fallback:
        return Reference(x[0].tolist(), nfe, blocks)  # the whole canvas: the prompt may be rewritten
    return Reference(answer(x[0, P:].tolist(), SDAR_EOS), nfe, blocks)


# prompts shorter than, as long as and longer than a block (a multiple of it, and not), P + G a multiple
SDAR_CASES = [([5, 6, 7], 13), ([8, 9, 10, 11], 12), ([12, 13, 14, 15, 16, 17], 10),
              ([20, 21, 22, 23, 24, 25, 26, 27], 12), ([40, 41, 42, 43, 44], 15)]


def run(den, prompts: list[list[int]], controller: str, G: int, cache: str = "none", trace: bool = False,
        sub_block_cache: int | None = None, **params) -> DecodeResult:
    """``decode`` with the named controller built from ``params``."""
    config = DecodeConfig(gen_length=G, cache=cache, sub_block_cache=sub_block_cache)
    return decode(den, prompts, build_controller(controller, **params), config, trace=trace)


@pytest.mark.parametrize("threshold, steps", [(0.85, SDAR_BS), (0.6, SDAR_BS), (0.6, 2), (0.3, 3), (0.99, 1)])
@pytest.mark.parametrize("cache", ["none", "block"])
def test_sdar_is_token_identical_to_block_diffusion_generate(sdar, threshold, steps, cache):
    den, ref = sdar
    for prompt, G in SDAR_CASES:
        want = sdar_generate(ref, prompt, gen_length=G, steps=steps, threshold=threshold)
        res = run(den, [prompt], "sdar", G, cache, threshold=threshold, steps=steps)
        got = res.generated[0].tolist()
        assert answer(got, SDAR_EOS) == want.tokens, (prompt, threshold, steps)
        assert int(res.answer_tokens[0]) == len(want.tokens)
        # the engine stores a block in the next block's first forward and needs no prefill forward
        assert int(res.nfe[0]) == want.nfe - want.blocks - int(len(prompt) >= SDAR_BS), (prompt, threshold, steps)


def test_sdar_cases_exercise_the_threshold_the_fallback_and_the_end_of_text_stop(sdar):
    den, _ = sdar
    multi = fallback = stopped = 0
    for steps in (SDAR_BS, 2):
        for prompt, G in SDAR_CASES:
            res = run(den, [prompt], "sdar", G, trace=True, threshold=0.6, steps=steps)
            for r in res.trace:
                multi += int(not bool(r["fallback"][0]) and int(r["commits"][0]) > 1)
                fallback += int(bool(r["fallback"][0]))
            stopped += int(SDAR_EOS in res.generated[0].tolist())
    assert multi and fallback and stopped


def test_the_published_sdar_fallback_rewrites_the_prompt_where_the_fixed_one_does_not(sdar):
    """With fewer steps than block positions, a quota can exceed the masks left (the first block holds
    the prompt's tail); the published top-k then re-picks decided columns, here a prompt token."""
    _, ref = sdar
    prompt, G = SDAR_CASES[0]
    published = sdar_generate(ref, prompt, gen_length=G, steps=2, threshold=0.99, published_fallback=True)
    assert published.tokens[: len(prompt)] != prompt
    fixed = sdar_generate(ref, prompt, gen_length=G, steps=2, threshold=0.99)
    assert MASK not in fixed.tokens


# ---------------------------------------------------------------------------------------- Fast-dLLM v2
def stopped_in_block(x: torch.Tensor, start: int) -> bool:
    """The published in-block stop: an end-of-text in ``x[start:]`` with no mask before its first one."""
    tail = x[0, start:]
    hits = (tail == FAST_EOS).nonzero()
    return bool(hits.numel()) and not bool((tail[: int(hits[0, 0])] == MASK).any())


def fast_logits(ref, x: torch.Tensor, past: list, s: int, lo: int, hi: int, frozen) -> torch.Tensor:
    """The shifted logits of offsets ``[lo, hi)`` of the block at ``s``: from a forward over the whole
    block; with ``use_block_cache`` (``frozen``: the block's ``block_past_key_values``, a dict, emptied
    at the block's start), a whole-block forward that (re)fills it while the block has none or the
    sub-block's first position is masked, else the sub-block alone against it (``replace_position``)."""
    B = x.shape[1] - s
    if frozen is not None and frozen.get("kv") and x[0, s + lo] != MASK:
        logits = FAM.fast_forward(ref, x[:, s + lo:s + hi], past, update_past_key_values=False, block_size=B,
                                  block_cache=frozen, replace_position=lo)[0]
        return torch.cat([logits[:1], logits[:-1]])  # the token shift (row lo is its own: decided, unread)
    if frozen is not None:
        frozen["kv"] = []
    logits = FAM.fast_forward(ref, x[:, s:], past, update_past_key_values=False, block_size=B, block_cache=frozen)[0]
    return torch.cat([logits[:1], logits[:-1]])[lo:hi]  # the token shift


def fast_sub_block(ref, x: torch.Tensor, past: list, s: int, lo: int, hi: int, threshold: float, start: int,
                   frozen=None) -> int:
    """Decode window offsets ``[lo, hi)`` of the block at ``s`` (in place) until they are decided or the
    in-block stop (checked from ``start``) ends the block; returns the forwards."""
    nfe = 0
    while (x[0, s + lo:s + hi] == MASK).any() and not stopped_in_block(x, start):
        logits = fast_logits(ref, x, past, s, lo, hi, frozen)
        nfe += 1
        x1, p = greedy(logits)
        masked = x[0, s + lo:s + hi] == MASK
        conf = torch.where(masked, p, torch.tensor(float("-inf")))
        unmask = conf > threshold
        unmask[int(conf.argmax())] = True
        unmask &= masked
        x[0, s + lo:s + hi][unmask] = x1[unmask]
    return nfe


def fast_block(ref, x: torch.Tensor, past: list, block: int, small: int, threshold: float,
               use_block_cache: bool = False) -> tuple[torch.Tensor, int]:
    """One block of Fast-dLLM v2's ``generate``: masks up to the block's end, its sub-blocks, then the
    store forward (and the next block's first token) unless the in-block stop ends it."""
    L0 = x.shape[1]  # the published ``prompt_length``: the stop is checked from here
    x = torch.cat([x, torch.full((1, block - L0 % block), MASK, dtype=torch.long)], 1)
    s, nfe = x.shape[1] - block, 0
    frozen = {} if use_block_cache else None  # block_past_key_values = None at each block's start
    while not stopped_in_block(x, L0):
        if not (x[0, s:] == MASK).any():
            logits = FAM.fast_forward(ref, x[:, s:], past, update_past_key_values=True, block_size=block)[0]
            return torch.cat([x, greedy(logits[-1:])[0][None]], 1), nfe + 1
        for i in range(block // small):
            nfe += fast_sub_block(ref, x, past, s, i * small, (i + 1) * small, threshold, L0, frozen)
    return x, nfe


@torch.no_grad()
def fast_generate(ref, prompt: list[int], *, gen_length: int, block: int = FAST_BS, small: int = 8,
                  threshold: float = 0.9, use_block_cache: bool = False) -> Reference:
    """Fast-dLLM v2's ``generate`` at temperature 0 (batch 1), defects fixed (module docstring); with
    ``use_block_cache`` its approximate sub-block cache."""
    P, total = len(prompt), len(prompt) + gen_length
    assert total % block == 0, "the cases keep P + G a multiple of the block"
    x, past, nfe, blocks = torch.tensor([prompt]), [], 0, 0
    if P >= block:  # fixed: a prompt of exactly one block is prefilled too
        logits = FAM.fast_forward(ref, x[:, : P // block * block], past, update_past_key_values=True,
                                  block_size=block)[0]
        nfe += 1
        if P % block == 0:
            x = torch.cat([x, greedy(logits[-1:])[0][None]], 1)
    while x.shape[1] < total and not (x[0, P:] == FAST_EOS).any():
        x, spent = fast_block(ref, x, past, block, small, threshold, use_block_cache)
        nfe, blocks = nfe + spent, blocks + 1
    return Reference(answer(x[0, P:total].tolist(), FAST_EOS), nfe, blocks)


# prompts shorter than, as long as and longer than a block (not a multiple of it, and a multiple);
# some answers end with end-of-text and some do not, so both terms of the NFE relation occur
FAST_CASES = [([5, 6, 7, 8, 9], 19), ([30 + i for i in range(8)], 16), ([50 + i for i in range(11)], 13),
              ([70 + i for i in range(16)], 8), ([90, 91, 92], 13), ([120 + i for i in range(13)], 11)]


def fast_nfe_difference(prompt: list[int], want: Reference) -> int:
    """The reference's forwards the engine does not run: the prefill where the prompt's last block is
    shared, and the store forward after the last block (docs/models.md)."""
    P = len(prompt)
    return int(P > FAST_BS and P % FAST_BS != 0) + int(FAST_EOS not in want.tokens)


@pytest.mark.parametrize("threshold, small", [(0.9, 8), (0.9, 4), (0.6, 4), (0.3, 2), (1.0, 8)])
@pytest.mark.parametrize("cache", ["none", "block"])
def test_fast_dllm_v2_is_token_identical_to_its_generate(fast, threshold, small, cache):
    den, ref = fast
    for prompt, G in FAST_CASES:
        want = fast_generate(ref, prompt, gen_length=G, small=small, threshold=threshold)
        res = run(den, [prompt], "fast_dllm_v2", G, cache, threshold=threshold, small_block_size=small)
        got = res.generated[0].tolist()
        assert answer(got, FAST_EOS) == want.tokens, (prompt, threshold, small)
        assert int(res.answer_tokens[0]) == len(want.tokens)
        assert int(res.nfe[0]) == want.nfe - fast_nfe_difference(prompt, want), (prompt, threshold, small)


def test_fast_dllm_v2_cases_exercise_every_path(fast):
    """Steps that commit several positions above τ, steps that commit the argmax alone, first tokens
    taken alone, and blocks ended by the in-block end-of-text stop."""
    den, ref = fast
    multi = argmax_only = first = fill = 0
    for threshold, small in ((0.6, 4), (0.9, 8)):
        for prompt, G in FAST_CASES:
            res = run(den, [prompt], "fast_dllm_v2", G, trace=True, threshold=threshold, small_block_size=small)
            for r in res.trace:
                alone = bool(r["first_alone"][0])
                first += int(alone)
                multi += int(not alone and int(r["above"][0]) > 1)
                argmax_only += int(not alone and int(r["above"][0]) == 0)
                fill += int(int(r["end_fill"][0]) > 0)
    assert multi and argmax_only and first and fill
    differences = {fast_nfe_difference(p, fast_generate(ref, p, gen_length=G, small=4, threshold=0.6))
                   for p, G in FAST_CASES}
    assert differences == {0, 1, 2}, "each term of the NFE relation occurs alone and together"


# ------------------------------------------------------------------ Fast-dLLM v2's sub-block cache
SUB_BLOCK_SETTINGS = [(0.9, 8), (0.9, 4), (0.6, 4), (0.3, 2), (1.0, 4), (1.0, 2)]


@pytest.mark.parametrize("threshold, small", SUB_BLOCK_SETTINGS)
def test_the_sub_block_cache_is_token_identical_to_generate_with_use_block_cache(fast, threshold, small):
    """``cache='block', sub_block_cache=s``: the tokens of the published ``generate(use_block_cache=True)``
    and its forwards (the same relation as without it). With the option off (the tests above) the
    engine is the exact decode, unchanged."""
    den, ref = fast
    for prompt, G in FAST_CASES:
        want = fast_generate(ref, prompt, gen_length=G, small=small, threshold=threshold, use_block_cache=True)
        res = run(den, [prompt], "fast_dllm_v2", G, "block", sub_block_cache=small, threshold=threshold,
                  small_block_size=small)
        assert answer(res.generated[0].tolist(), FAST_EOS) == want.tokens, (prompt, threshold, small)
        assert int(res.nfe[0]) == want.nfe - fast_nfe_difference(prompt, want), (prompt, threshold, small)


def test_the_sub_block_cache_runs_sub_blocks_alone_and_is_approximate(fast):
    """The cases exercise the approximation: forwards of a sub-block alone (``cache_refreshes`` counts
    the whole-block ones, fewer than the forwards), and answers of the published cached ``generate`` that
    differ from its exact one, which the engine's sub-block cache reproduces (test above)."""
    den, ref = fast
    alone = differ = 0
    for threshold, small in ((0.9, 4), (0.6, 4)):
        for prompt, G in FAST_CASES:
            res = run(den, [prompt], "fast_dllm_v2", G, "block", sub_block_cache=small, threshold=threshold,
                      small_block_size=small)
            alone += int(res.nfe[0] - res.cache_refreshes[0])
            cached = fast_generate(ref, prompt, gen_length=G, small=small, threshold=threshold, use_block_cache=True)
            exact = fast_generate(ref, prompt, gen_length=G, small=small, threshold=threshold)
            differ += int(cached.tokens != exact.tokens)
    assert alone > 0 and differ > 0


@pytest.mark.parametrize("cache, sub, small, named", [
    ("none", 8, 8, "sub_block_cache=8 needs cache='block'"),
    ("block", 3, 8, "sub_block_cache=3 does not divide the block size 8 this block-causal model was trained with; "
                    "allowed: 1, 2, 4, 8 (or null: off)"),
    ("block", 4, 8, "sub_block_cache=4 with fast_dllm_v2.small_block_size=8"),
])
def test_the_sub_block_cache_refuses_a_combination_before_any_forward(fast, monkeypatch, cache, sub, small, named):
    from adaptive_decoding.framework.core.params import ParameterError
    from adaptive_decoding.framework.models.arch import FastDLLMv2Model

    def boom(self, *a, **k):
        raise AssertionError("the model ran a forward")

    monkeypatch.setattr(FastDLLMv2Model, "forward", boom)
    with pytest.raises(ParameterError, match=re.escape(named)):
        run(fast[0], [[5, 6, 7]], "fast_dllm_v2", 13, cache, sub_block_cache=sub, small_block_size=small)


# ---------------------------------------------------------------------------------------- batches
@pytest.mark.parametrize("family, controller, cases, params", [
    ("sdar", "sdar", SDAR_CASES, dict(threshold=0.6, steps=2)),
    ("fast", "fast_dllm_v2", FAST_CASES, dict(threshold=0.6, small_block_size=4)),
])
@pytest.mark.parametrize("cache", ["none", "block", "block+sub"])
def test_a_batch_of_ragged_prompts_equals_each_alone(request, family, controller, cases, params, cache):
    den, _ = request.getfixturevalue(family)
    prompts = [p for p, _ in cases]
    sub = (params.get("small_block_size") or 2) if cache == "block+sub" else None  # SDAR's blocks of 4: s = 2
    cache = cache.split("+")[0]
    batch = run(den, prompts, controller, 13, cache, sub_block_cache=sub, **params)
    for i, p in enumerate(prompts):
        alone = run(den, [p], controller, 13, cache, sub_block_cache=sub, **params)
        assert batch.generated[i].tolist() == alone.generated[0].tolist()
        assert int(batch.nfe[i]) == int(alone.nfe[0])
