"""The KV cache as a loop option (``DecodeConfig.cache``): equal to no cache when refreshed every
step, equal to Fast-dLLM's own cached loops with block refreshes, batch-invariant, counted.

The Fast-dLLM reference below is written from NVlabs/Fast-dLLM ``llada/generate.py``
(``generate_with_prefix_cache``, ``generate_with_dual_cache``, ``get_transfer_index``): at each
block start one full forward with ``use_cache=True`` serves the step and fills the cache; the
prefix mode then keeps the cache up to the block start and runs ``x[:, start:]`` against it, the
dual mode runs ``x[:, start:end]`` with ``replace_position`` on the block. A step commits the
``num_transfer_tokens[:, i]`` most confident masked positions of the block (fixed steps, LLaDA's
``get_num_transfer_tokens``) or, with a threshold, the most confident one plus every other with
confidence ≥ threshold. It runs on the remote-code re-implementation in
``tests/fixtures/real_format/modeling_llada.py`` (Fast-dLLM's cache interface), our decoder on the
framework's own LLaDA loaded from the same folder.
"""

from __future__ import annotations

import _adec_real_format_build as real_format_build  # loaded by tests/conftest.py
import pytest
import torch
import torch.nn.functional as F

from adaptive_decoding.framework import DecodeConfig, ParameterError, build_controller, decode
from adaptive_decoding.framework.models.arch import load_architecture
from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.testing.toys import ToyDenoiser


@pytest.fixture(scope="module")
def llada_folder(tmp_path_factory):
    return real_format_build.build_llada(tmp_path_factory.mktemp("llada") / "ckpt", seed=5, n_kv_heads=2,
                                        init_std=0.3)  # peaked enough that thresholds commit several tokens


@pytest.fixture(scope="module")
def own_llada(llada_folder):
    arch = load_architecture(llada_folder)
    return OwnArchitectureDenoiser(arch, mask_token_id=arch.mask_token_id, vocab_size=arch.vocab_size,
                                   eos_token_id=arch.eos_token_id, pad_token_id=arch.pad_token_id)


@pytest.fixture(scope="module")
def own_dream(tmp_path_factory):
    folder = real_format_build.build_dream(tmp_path_factory.mktemp("dream") / "ckpt", seed=6)
    arch = load_architecture(folder)
    return OwnArchitectureDenoiser(arch, mask_token_id=arch.mask_token_id if arch.mask_token_id is not None else 310,
                                   vocab_size=arch.vocab_size, eos_token_id=arch.eos_token_id,
                                   pad_token_id=arch.pad_token_id)


def tiny():
    torch.manual_seed(0)
    cfg = TinyConfig(vocab_size=30, mask_token_id=1, pad_token_id=0, eos_token_id=2, max_len=64, d_model=32,
                     n_layers=2, n_heads=2, d_ff=64)
    return TinyDenoiser(cfg).eval()


PROMPTS_TINY = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
PROMPTS_LLADA = [[3, 40, 7, 99, 12], [250, 8], [17, 17, 60, 61, 2, 90, 33]]
CONTROLLERS = [("fast_dllm", {"threshold": 0.2}), ("llada", {"steps": 8}), ("margin_topk", {}),
               ("llada_random", {"steps": 8})]


def run(model, prompts, name, params, **cfg):
    return decode(model, prompts, build_controller(name, **params), DecodeConfig(**cfg), seeds=[3, 4, 5][:len(prompts)])


# ---------------------------------------------------------------------- refresh every step == no cache
@pytest.mark.parametrize("which", ["tiny", "llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_refreshing_every_step_equals_no_cache(which, cache, own_llada, own_dream):
    model = {"tiny": tiny(), "llada": own_llada, "dream": own_dream}[which]
    prompts = PROMPTS_TINY if which == "tiny" else PROMPTS_LLADA
    for name, params in CONTROLLERS:
        for temperature in (0.0, 1.0):
            base = dict(gen_length=16, block_length=4, temperature=temperature)
            plain = run(model, prompts, name, params, **base)
            cached = run(model, prompts, name, params, cache=cache, cache_refresh=1, **base)
            assert torch.equal(cached.generated, plain.generated), (name, temperature)
            assert torch.equal(cached.nfe, plain.nfe)
            assert cached.cache_refreshes.tolist() == plain.nfe.tolist()  # every forward was a refresh


@pytest.mark.parametrize("which", ["llada", "dream"])
def test_chunked_full_forwards_decode_the_same_tokens(which, own_llada, own_dream):
    """``query_chunk`` (the model's full forwards taken a few query rows at a time, for memory)
    changes no decision, under every cache mode, greedy and sampled."""
    model = {"llada": own_llada, "dream": own_dream}[which]
    for cache in ("none", "prefix", "dual"):
        for name, params in CONTROLLERS[:2]:
            for temperature in (0.0, 1.0):
                cfg = dict(gen_length=16, block_length=4, temperature=temperature, cache=cache)
                plain = run(model, PROMPTS_LLADA, name, params, **cfg)
                model.model.query_chunk = 3
                try:
                    chunked = run(model, PROMPTS_LLADA, name, params, **cfg)
                finally:
                    model.model.query_chunk = None
                assert torch.equal(chunked.generated, plain.generated), (cache, name, temperature)
                assert torch.equal(chunked.nfe, plain.nfe)


@pytest.mark.parametrize("which", ["tiny", "llada", "dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_ragged_batch_equals_its_rows_one_by_one_with_the_cache(which, cache, own_llada, own_dream):
    model = {"tiny": tiny(), "llada": own_llada, "dream": own_dream}[which]
    prompts = PROMPTS_TINY if which == "tiny" else PROMPTS_LLADA
    for name, params in CONTROLLERS[:2]:
        batch = run(model, prompts, name, params, gen_length=16, block_length=4, cache=cache)
        for i, p in enumerate(prompts):
            one = decode(model, [p], build_controller(name, **params),
                         DecodeConfig(gen_length=16, block_length=4, cache=cache), seeds=[[3, 4, 5][i]])
            assert torch.equal(one.generated[0], batch.generated[i]), (name, i)
            assert int(one.nfe[0]) == int(batch.nfe[i])
        assert batch.cache_refreshes.tolist() == [4, 4, 4]  # one per block, counted in nfe
        assert (batch.nfe >= batch.cache_refreshes).all()


@pytest.mark.parametrize("which", ["tiny", "llada", "dream"])
def test_a_refresh_rewrites_the_cache_in_place_with_a_fresh_forwards_numbers(which, own_llada, own_dream):
    # the second and later refreshes write every column into the existing cache (never two caches at once)
    from adaptive_decoding.framework.engine.denoise import CacheSession
    from adaptive_decoding.framework.engine.loop import layout

    model = {"tiny": tiny(), "llada": own_llada, "dream": own_dream}[which]
    prompts = PROMPTS_TINY if which == "tiny" else PROMPTS_LLADA
    x, attn, gen_start = layout(prompts, 8, model.mask_token_id, model.pad_token_id or 0, torch.device("cpu"))
    b = x.shape[0]
    rows, lengths = torch.arange(b), gen_start + 8
    cols = gen_start[:, None] + torch.arange(4)[None, :]
    valid = torch.ones_like(cols, dtype=torch.bool)
    with torch.no_grad():
        session = CacheSession(model, "dual", None, b, torch.device("cpu"))
        first = session.serve(x, attn, rows, cols, valid, torch.zeros(b, dtype=torch.long), lengths)  # a refresh
        keys = [k.data_ptr() for k in session.cache.keys]
        x[:, -3:] = 7  # the canvas moved on (tokens committed in the second block)
        cols2 = cols + 4
        second = session.serve(x, attn, rows, cols2, valid, torch.ones(b, dtype=torch.long), lengths)
        got = second.logits
        want, fresh = model.window_logits(x, attn, cols2, use_cache=True)
    assert [k.data_ptr() for k in session.cache.keys] == keys  # the same buffers, rewritten
    assert first.refreshed.tolist() == second.refreshed.tolist() == [True] * b
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for mine, theirs in zip(session.cache.keys + session.cache.values, fresh.keys + fresh.values):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------- Fast-dLLM's own loops
def _transfer_counts(block_masked: torch.Tensor, steps: int) -> torch.Tensor:
    n = block_masked.sum(dim=1, keepdim=True)
    counts = torch.zeros(n.shape[0], steps, dtype=torch.long) + n // steps
    for j in range(n.shape[0]):
        counts[j, : int(n[j] % steps)] += 1
    return counts


def _transfer(logits, mask_index, x, k, threshold):
    x0 = logits.argmax(-1)
    p = F.softmax(logits.to(torch.float64), dim=-1).gather(-1, x0[..., None]).squeeze(-1)
    x0 = torch.where(mask_index, x0, x)
    conf = torch.where(mask_index, p, torch.full_like(p, float("-inf")))
    n = int(mask_index.sum()) if threshold is not None else int(k)
    chosen = torch.zeros_like(x0, dtype=torch.bool)
    _, idx = torch.topk(conf[0], k=n)
    chosen[0, idx] = True
    if threshold is not None:
        for j in range(1, n):
            if conf[0, idx[j]] < threshold:
                chosen[0, idx[j]] = False
    return x0, chosen


@torch.no_grad()
def fast_dllm_reference(model, prompt, *, mode, gen_length, block_length, steps=None, threshold=None, mask_id):
    """Fast-dLLM's ``generate_with_{prefix,dual}_cache`` at batch 1, temperature 0 (see module doc)."""
    x = torch.full((1, len(prompt) + gen_length), mask_id, dtype=torch.long)
    x[0, : len(prompt)] = torch.tensor(prompt)
    n_blocks = gen_length // block_length
    per_block = (steps // n_blocks) if steps else 1
    nfe = 0
    for b in range(n_blocks):
        start = len(prompt) + b * block_length
        end = start + block_length
        counts = _transfer_counts(x[:, start:end] == mask_id, per_block)
        out = model(x, use_cache=True)
        past = out.past_key_values
        mask_index = x == mask_id
        mask_index[:, end:] = False
        x0, chosen = _transfer(out.logits, mask_index, x, counts[0, 0], threshold)
        x[chosen] = x0[chosen]
        nfe += 1
        if mode == "prefix":
            past = [tuple(t[:, :, :start] for t in layer) for layer in past]
        replace = torch.zeros_like(x, dtype=torch.bool)
        replace[:, start:end] = True
        i = 1
        while (x[:, start:end] == mask_id).any():
            nfe += 1
            if mode == "prefix":
                region = x[:, start:]
                logits = model(region, past_key_values=past, use_cache=True).logits
                mask_index = region == mask_id
                mask_index[:, block_length:] = False
            else:
                region = x[:, start:end]
                logits = model(region, past_key_values=past, use_cache=True, replace_position=replace).logits
                mask_index = region == mask_id
            x0, chosen = _transfer(logits, mask_index, region, counts[0, i] if steps else None, threshold)
            region[chosen] = x0[chosen]
            i += 1
    return x[0, len(prompt):], nfe


@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("rule", ["threshold", "steps"])
def test_block_refresh_equals_fast_dllms_cached_generate(mode, rule, llada_folder, own_llada):
    reference = real_format_build.reference_model(llada_folder)
    mask_id = own_llada.mask_token_id
    gen_length, block_length = 16, 4
    nfes = []
    for prompt in PROMPTS_LLADA:
        if rule == "threshold":
            want, want_nfe = fast_dllm_reference(reference, prompt, mode=mode, gen_length=gen_length,
                                                 block_length=block_length, threshold=0.5, mask_id=mask_id)
            ctrl = build_controller("fast_dllm", threshold=0.5)
        else:
            want, want_nfe = fast_dllm_reference(reference, prompt, mode=mode, gen_length=gen_length,
                                                 block_length=block_length, steps=8, mask_id=mask_id)
            ctrl = build_controller("llada", steps=8)
        got = decode(own_llada, [prompt], ctrl, DecodeConfig(gen_length=gen_length, block_length=block_length,
                                                             cache=mode))
        assert got.generated[0].tolist() == want.tolist()
        assert int(got.nfe[0]) == want_nfe
        assert int(got.cache_refreshes[0]) == gen_length // block_length
        nfes.append(want_nfe)
    assert min(nfes) < gen_length  # several tokens per step somewhere: the parallel path is exercised


def test_the_cache_changes_what_a_stale_suffix_shows_so_the_test_above_can_fail(llada_folder, own_llada):
    """Prefix and dual decoding with block refreshes are approximations: on this checkpoint they do
    not both equal the uncached decode, which is what makes the comparison with Fast-dLLM's own
    cached loops (rather than with the uncached decode) a real test."""
    runs = {c: run(own_llada, PROMPTS_LLADA, "llada", {"steps": 16}, gen_length=16, block_length=4, cache=c)
            for c in ("none", "prefix", "dual")}
    assert not (torch.equal(runs["none"].generated, runs["prefix"].generated)
                and torch.equal(runs["none"].generated, runs["dual"].generated))


# ---------------------------------------------------------------------- bad values, before any work
def test_bad_cache_values_fail_before_any_work():
    with pytest.raises(ParameterError, match=r"cache='triple' is not allowed; allowed: one of 'none', 'prefix', 'dual'"):
        DecodeConfig(cache="triple").validate()
    with pytest.raises(ParameterError, match=r"cache_refresh=0 is out of range; allowed: integer in \[1, inf\) or null"):
        DecodeConfig(cache="dual", cache_refresh=0).validate()
    toy = ToyDenoiser([3, 4, 5, 6], [0.9] * 4, vocab_size=16, prompt_length=1)
    with pytest.raises(ParameterError, match=r"cache='dual' needs a denoiser with a KV cache.*ToyDenoiser"):
        decode(toy, [[1]], build_controller("sequential"), DecodeConfig(gen_length=4, cache="dual"))
    assert toy.calls == 0 if hasattr(toy, "calls") else True


def test_cache_refresh_without_a_cache_warns():
    with pytest.warns(UserWarning, match="cache_refresh"):
        DecodeConfig(cache_refresh=2).validate()
