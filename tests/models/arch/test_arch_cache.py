"""KV-cache semantics of the own LLaDA / Dream: refresh, Fast-dLLM prefix and dual steps (checked
against the reference called the way Fast-dLLM's generate_with_prefix_cache /
generate_with_dual_cache / Dream's _sample call it, batch 1), ragged left-padded batches, and the
cache utilities."""

import pytest
import torch

from adaptive_decoding.framework.models.arch import (
    KVCache,
    dream_shift,
    dream_window_logits,
    load_architecture,
)

ATOL = 1e-4
L, S, E = 16, 6, 10  # sequence length, block [S, E); the suffix [E, L) stays masked


def _xs(model, seed=0):
    """(x_old, x_new, x_new2): a prompt + masks, then one and two more committed block tokens."""
    g = torch.Generator().manual_seed(seed)
    m = model.mask_token_id
    x = torch.full((1, L), m, dtype=torch.long)
    x[0, :S] = torch.randint(0, 300, (S,), generator=g)
    x_new = x.clone()
    x_new[0, S + 1] = 17
    x_new2 = x_new.clone()
    x_new2[0, S + 3] = 42
    return x, x_new, x_new2


def _slots(a, b, B=1):
    return torch.arange(a, b)[None].expand(B, -1)


@pytest.mark.parametrize("name", ["llada", "llada_gqa_sharded"])
def test_llada_prefix_and_dual_steps_match_fast_dllm(name, checkpoint, reference):
    ref, own = reference(name), load_architecture(checkpoint(name))
    x, x_new, x_new2 = _xs(own)
    with torch.no_grad():
        # refresh: model(x, use_cache=True) in both
        out = ref(x, use_cache=True)
        logits, cache = own(x, use_cache=True)
        assert isinstance(cache, KVCache) and cache.length == L and cache.num_layers == len(own.layers)
        torch.testing.assert_close(logits, out.logits, atol=ATOL, rtol=0)
        # prefix cache: Fast-dLLM cuts the cache to [:start] and queries x[:, start:]; we write [start, L)
        prefix = [(k[:, :, :S], v[:, :, :S]) for k, v in out.past_key_values]
        pcache = cache.clone()
        for xs in (x_new, x_new2):
            want = ref(xs[:, S:], past_key_values=prefix, use_cache=True).logits
            got, same = own(xs[:, S:], cache=pcache, write_positions=_slots(S, L))
            assert same is pcache
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        # dual cache: replace_position marks [start, end); queries x[:, start:end]; suffix stays stale
        dual = ref(x, use_cache=True).past_key_values
        replace = torch.zeros(1, L, dtype=torch.bool)
        replace[:, S:E] = True
        for xs in (x_new, x_new2):
            want = ref(xs[:, S:E], past_key_values=dual, use_cache=True, replace_position=replace).logits
            got, _ = own(xs[:, S:E], cache=cache, write_positions=_slots(S, E))
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["dream", "dream_mha_sharded"])
def test_dream_prefix_and_dual_steps_match_fast_dllm(name, checkpoint, reference):
    ref, own = reference(name), load_architecture(checkpoint(name))
    x, x_new, x_new2 = _xs(own, 1)
    with torch.no_grad():
        out = ref(x, "full", None, use_cache=True)
        logits, cache = own(x, use_cache=True)
        torch.testing.assert_close(logits, out.logits, atol=ATOL, rtol=0)
        prefix = [(k[:, :S], v[:, :S]) for k, v in out.past_key_values]  # Fast-dLLM's Dream cache: [B, S, H_kv*D]
        pcache = cache.clone()
        for xs in (x_new, x_new2):
            want = ref(xs[:, S:], "full", None, past_key_values=prefix, use_cache=True).logits
            got, _ = own(xs[:, S:], cache=pcache, write_positions=_slots(S, L))
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        dual = ref(x, "full", None, use_cache=True).past_key_values
        replace = torch.zeros(1, L, dtype=torch.bool)
        replace[:, S:E] = True
        helper_cache = cache.clone()
        for xs in (x_new, x_new2):
            want = ref(xs[:, S:E], "full", None, past_key_values=dual, use_cache=True, dual_cache=True,
                       replace_position=replace).logits
            got, _ = own(xs[:, S:E], cache=cache, write_positions=_slots(S, E))
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
            # the exact window [S, E) needs hidden states [S-1, E-1): rows S+1.. equal Fast-dLLM's in-window shift
            shifted = dream_window_logits(own, xs, S, E, cache=helper_cache)
            assert shifted.shape == (1, E - S, own.vocab_size)
            torch.testing.assert_close(shifted[:, 1:], dream_shift(want)[:, 1:], atol=ATOL, rtol=0)
        torch.testing.assert_close(helper_cache.keys[0], cache.keys[0])  # slot S-1 was queried, not written


@pytest.mark.parametrize("name", ["dream", "dream_mha_sharded"])
def test_dream_window_logits_are_the_shifted_full_logits(name, checkpoint):
    own = load_architecture(checkpoint(name))
    x, x_new, _ = _xs(own, 2)
    with torch.no_grad():
        full, cache = own(x, use_cache=True)
        want = dream_shift(full)
        torch.testing.assert_close(dream_window_logits(own, x, S, E), want[:, S:E], atol=ATOL, rtol=0)
        torch.testing.assert_close(dream_window_logits(own, x, 0, 3), want[:, 0:3], atol=ATOL, rtol=0)
        # right after a refresh the cached window is exact (dual: query_end=E; prefix: query_end=L)
        for q_end in (E, L):
            got = dream_window_logits(own, x, S, E, cache=cache.clone(), query_end=q_end)
            torch.testing.assert_close(got, want[:, S:E], atol=ATOL, rtol=0)
        # writing every slot again reproduces the no-cache forward on new tokens
        got = dream_window_logits(own, x_new, 0, L, cache=cache.clone())
        torch.testing.assert_close(got, dream_shift(own(x_new)[0]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["llada_gqa_sharded", "dream"])
def test_refresh_then_rewriting_all_positions_equals_no_cache(name, checkpoint):
    own = load_architecture(checkpoint(name))
    x, x_new, _ = _xs(own, 3)
    x, x_new = x.repeat(2, 1), x_new.repeat(2, 1)
    x_new[1, 2] = 9
    with torch.no_grad():
        _, cache = own(x, use_cache=True)
        got, _ = own(x_new, cache=cache, write_positions=_slots(0, L, 2))
        torch.testing.assert_close(got, own(x_new)[0], atol=ATOL, rtol=0)


def _ragged(own, seed):
    """Rows alone (prompt + 8 masks) and the left-padded batch of them."""
    g = torch.Generator().manual_seed(seed)
    gen = 8
    rows = [torch.cat([torch.randint(0, 300, (p,), generator=g), torch.full((gen,), own.mask_token_id)])
            for p in (3, 7, 5)]
    total = max(len(r) for r in rows)
    ids = torch.full((3, total), own.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros(3, total, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, total - len(r):], mask[i, total - len(r):] = r, True
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return rows, ids, mask, pos, total - gen  # padded block starts where every prompt ends


@pytest.mark.parametrize("name", ["llada", "llada_gqa_sharded", "dream", "dream_mha_sharded"])
def test_ragged_left_padded_batch_equals_rows_alone(name, checkpoint):
    own = load_architecture(checkpoint(name))
    rows, ids, mask, pos, bs = _ragged(own, 4)
    be = bs + 4
    with torch.no_grad():
        batch, cache = own(ids, key_mask=mask, position_ids=pos, use_cache=True)
        new = ids.clone()
        new[:, bs + 1] = 23  # commit one block token in every row
        dual, _ = own(new[:, bs:be], cache=cache, write_positions=_slots(bs, be, 3), position_ids=pos[:, bs:be],
                      key_mask=mask)
        for i, r in enumerate(rows):
            alone, c = own(r[None], use_cache=True)
            torch.testing.assert_close(batch[i][mask[i]], alone[0], atol=ATOL, rtol=0)
            p = len(r) - 8
            r_new = r.clone()
            r_new[p + 1] = 23
            alone_dual, _ = own(r_new[None, p:p + 4], cache=c, write_positions=_slots(p, p + 4))
            torch.testing.assert_close(dual[i], alone_dual[0], atol=ATOL, rtol=0)


def test_write_valid_skips_padded_query_rows(checkpoint):
    own = load_architecture(checkpoint("llada"))
    x, x_new, _ = _xs(own, 5)
    x, x_new = x.repeat(2, 1), x_new.repeat(2, 1)
    with torch.no_grad():
        _, cache = own(x, use_cache=True)
        before = [k.clone() for k in cache.keys]
        # row 1 has only 2 real query tokens; its padded entries point at slot 0 and must not touch it
        slots = torch.tensor([[S, S + 1, S + 2, S + 3], [S, S + 1, 0, 0]])
        valid = torch.tensor([[True] * 4, [True, True, False, False]])
        got, _ = own(x_new[:, S:E], cache=cache, write_positions=slots, write_valid=valid)
        for k, k0 in zip(cache.keys, before):
            assert torch.equal(k[1, :, 0], k0[1, :, 0]) and torch.equal(k[1, :, S + 2:], k0[1, :, S + 2:])
            assert not torch.equal(k[0, :, S:E], k0[0, :, S:E])
        _, ref_cache = own(x[1:], use_cache=True)
        alone, _ = own(x_new[1:, S:S + 2], cache=ref_cache, write_positions=_slots(S, S + 2))
        torch.testing.assert_close(got[1, :2], alone[0], atol=ATOL, rtol=0)


def test_select_and_update_rows(checkpoint):
    own = load_architecture(checkpoint("dream"))
    x, x_new, _ = _xs(own, 6)
    x, x_new = x.repeat(3, 1), x_new.repeat(3, 1)
    x_new[2, S] = 11
    with torch.no_grad():
        _, cache = own(x, use_cache=True)
        full = cache.clone()
        want, _ = own(x_new[:, S:E], cache=full, write_positions=_slots(S, E, 3))
        rows = torch.tensor([2, 0])
        part = cache.select(rows)
        assert part.batch_size == 2 and part.keys[0].data_ptr() != cache.keys[0].data_ptr()
        got, _ = own(x_new[rows, S:E], cache=part, write_positions=_slots(S, E, 2))
        torch.testing.assert_close(got, want[rows], atol=ATOL, rtol=0)
        untouched = cache.keys[0][1].clone()
        cache.update_rows(rows, part)
        for a, b in zip(cache.keys + cache.values, full.keys + full.values):
            torch.testing.assert_close(a[rows], b[rows], atol=0, rtol=0)
        assert torch.equal(cache.keys[0][1], untouched)


def test_rows_without_real_keys_stay_finite(checkpoint):
    own = load_architecture(checkpoint("llada"))
    x = torch.randint(0, 300, (2, 5))
    key_mask = torch.tensor([[True] * 5, [False] * 5])
    logits, cache = own(x, key_mask=key_mask, use_cache=True)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[1], own(x[1:])[0][0], atol=ATOL, rtol=0)  # such a row attends everywhere
    step, _ = own(x[:, 1:3], cache=cache, write_positions=_slots(1, 3, 2), key_mask=key_mask)
    assert torch.isfinite(step).all()
