"""``query_chunk``: a forward over more query rows than the chunk runs each layer chunk by chunk
(keys and values of every row first, then queries, attention and MLP per chunk). The numbers must
equal the one-pass forward in every call shape the engine makes: a plain full forward (ragged,
left-padded, with a refresh cache), a refresh that rewrites an existing cache in place, a prefix
step with padded query rows (``write_valid``), WINO's shadow block (per-query key mask,
``ephemeral`` keys), and a whole decode under each cache mode."""

import pytest
import torch

from adaptive_decoding.framework.models.arch import load_architecture
from adaptive_decoding.framework.models.arch.layers import Block

ATOL = 1e-4


def _canvas(model, B=3, L=21, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 300, (B, L), generator=g)
    ids[:, L // 2:] = model.mask_token_id
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, :4] = False  # row 1 left-padded
    ids[1, :4] = model.pad_token_id or 0
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def _both(model, chunk, fn):
    """``fn()`` in one pass and with ``query_chunk = chunk``, counting the chunked layer calls."""
    calls = []
    real = Block.forward_chunked

    def spy(self, *a, **k):
        calls.append(a[0].shape[1])
        return real(self, *a, **k)

    with torch.no_grad():
        model.query_chunk = None
        want = fn()
        model.query_chunk = chunk
        Block.forward_chunked = spy
        try:
            got = fn()
        finally:
            Block.forward_chunked = real
            model.query_chunk = None
    return want, got, calls


def _close_cache(a, b):
    for x, y in zip(a.keys + a.values, b.keys + b.values):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["llada_gqa_sharded", "dream"])
@pytest.mark.parametrize("chunk", [1, 4, 8])
def test_chunked_full_forward_equals_one_pass(name, chunk, checkpoint):
    own = load_architecture(checkpoint(name))
    ids, mask, pos = _canvas(own)
    want, got, calls = _both(own, chunk, lambda: own(ids, key_mask=mask, position_ids=pos, use_cache=True))
    assert calls == [ids.shape[1]] * len(own.layers)  # the chunked path ran, once per layer
    torch.testing.assert_close(got[0], want[0], atol=ATOL, rtol=0)
    _close_cache(got[1], want[1])
    assert all(k.is_contiguous() for k in got[1].keys + got[1].values)  # later in-place writes stay strided


@pytest.mark.parametrize("name", ["llada_gqa_sharded", "dream"])
def test_chunked_in_place_refresh_and_prefix_step_equal_one_pass(name, checkpoint):
    own = load_architecture(checkpoint(name))
    ids, mask, pos = _canvas(own, seed=1)
    B, L = ids.shape
    with torch.no_grad():
        _, cache = own(ids, key_mask=mask, position_ids=pos, use_cache=True)
    new = ids.clone()
    new[:, L // 2] = 7
    slots = torch.arange(L).expand(B, L)

    c1, c2 = cache.clone(), cache.clone()
    caches = [c1, c2]  # every column a written query against the existing cache (the engine's refresh)
    want, got, calls = _both(own, 5, lambda: own(new, cache=caches.pop(0), write_positions=slots, position_ids=pos,
                                                  key_mask=mask))
    assert calls == [L] * len(own.layers)
    torch.testing.assert_close(got[0], want[0], atol=ATOL, rtol=0)
    _close_cache(c2, c1)
    # a prefix step whose query rows are ragged: row 0 writes 9 slots, the others 6 (padded, not written)
    start = L // 2
    span = L - start
    valid = torch.ones(B, span, dtype=torch.bool)
    valid[1:, 6:] = False
    wpos = torch.where(valid, torch.arange(start, L).expand(B, -1), torch.full((B, span), L - 1))
    c3, c4 = c1.clone(), c1.clone()
    caches = [c3, c4]
    want, got, calls = _both(own, 4, lambda: own(new.gather(1, wpos), cache=caches.pop(0), write_positions=wpos,
                                                  write_valid=valid, position_ids=pos.gather(1, wpos), key_mask=mask))
    assert calls == [span] * len(own.layers)
    torch.testing.assert_close(got[0][valid], want[0][valid], atol=ATOL, rtol=0)
    _close_cache(c4, c3)


def test_chunked_shadow_block_equals_one_pass(checkpoint):
    from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

    own = load_architecture(checkpoint("llada_gqa_sharded"))
    den = OwnArchitectureDenoiser(own, mask_token_id=own.mask_token_id, vocab_size=own.vocab_size, pad_token_id=0)
    ids, mask, _ = _canvas(own, seed=2)
    ids[1, :4], mask[1, :4] = 300, True  # the shadow helper takes real, unpadded rows here
    cols = torch.arange(10, 14).expand(ids.shape[0], -1)
    want, got, calls = _both(own, 3, lambda: den.shadow_logits(ids, mask, cols))
    assert calls  # the forward over canvas + shadow slots was chunked
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    with torch.no_grad():
        _, cache = den.window_logits(ids, mask, cols, use_cache=True)
    query = torch.arange(10, ids.shape[1]).expand(ids.shape[0], -1)
    caches = [cache.clone(), cache.clone()]
    want, got, calls = _both(own, 2, lambda: den.shadow_window_logits(ids, mask, cols, cache=caches.pop(0),
                                                                        query_cols=query)[:2])
    assert calls
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_no_chunking_when_gradients_are_recorded(checkpoint):
    own = load_architecture(checkpoint("llada"))
    own.query_chunk = 2
    calls = []
    real = Block.forward_chunked
    Block.forward_chunked = lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    try:
        with torch.enable_grad():
            own(torch.randint(0, 300, (1, 9)))
    finally:
        Block.forward_chunked = real
        own.query_chunk = None
    assert not calls  # chunks update activations in place: never under autograd
