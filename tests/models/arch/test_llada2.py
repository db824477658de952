"""The framework's own LLaDA2-MoE against the reference written from the published code
(``tests/fixtures/real_format/modeling_llada2_moe.py``) on a tiny checkpoint in the real on-disk
format (``model_type`` ``llada2_moe``, real keys, sharded safetensors + index): full and block-causal
logits, left padding, the exact block cache, the router, loading and its errors."""

import json

import pytest
import torch

from adaptive_decoding.framework.models.arch import (
    CheckpointFormatError,
    LLaDA2ArchConfig,
    LLaDA2MoeModel,
    UnsupportedArchitectureError,
    block_causal_mask,
    detect_architecture,
    load_architecture,
    moe_route,
)

ATOL = 2e-5
BS = 4  # block size of the tiny tests


def _tril_mask(L, bs, B=1):
    """The published generate's mask as a boolean ``[B, 1, L, L]``: ``tril(ones(nb, nb))`` repeated by bs."""
    nb = -(-L // bs)
    m = torch.tril(torch.ones(nb, nb)).repeat_interleave(bs, 0).repeat_interleave(bs, 1)[:L, :L].bool()
    return m[None, None].expand(B, 1, L, L)


def _tokens(seed, B, L, vocab=300):
    return torch.randint(0, vocab, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pair(checkpoint, reference):
    return load_architecture(checkpoint("llada2")), reference("llada2")


def test_loads_the_real_format_with_its_special_ids(checkpoint, pair):
    own, _ = pair
    folder = checkpoint("llada2")
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) == 3
    assert isinstance(own, LLaDA2MoeModel) and own.block_causal and own.block_size == 32
    assert (own.mask_token_id, own.eos_token_id, own.vocab_size) == (310, 300, 320)
    assert own.rotary_dim == 8 and own.head_dim == 16
    assert not own.config.is_sparse(0) and own.config.is_sparse(1)
    assert not any(p.requires_grad for p in own.parameters()) and not own.training


def test_block_causal_mask_is_the_published_tril():
    L = 3 * BS
    pos = torch.arange(L)[None]
    assert torch.equal(block_causal_mask(pos, pos, BS), _tril_mask(L, BS)[:, 0])
    with pytest.raises(ValueError, match="block_size"):
        block_causal_mask(pos, pos, 0)


def test_full_and_block_causal_logits_match_reference(pair):
    own, ref = pair
    x = _tokens(0, 2, 3 * BS + 2)  # a partial last block too
    with torch.no_grad():
        got, cache = own(x)
        assert cache is None and got.dtype == torch.float32
        torch.testing.assert_close(got, ref(x).logits, atol=ATOL, rtol=0)
        got, _ = own(x, block_size=BS)
        want = ref(x, attention_mask=_tril_mask(x.shape[1], BS, 2)).logits
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        additive = _tril_mask(x.shape[1], BS, 2).float().log()  # the published mask: log(tril), here float32
        torch.testing.assert_close(ref(x, attention_mask=additive).logits, want, atol=0, rtol=0)
        assert (got - own(x)[0]).abs().max() > 1e-3  # the block mask matters


def test_left_padded_batch_equals_rows_alone(pair):
    own, ref = pair
    L = 3 * BS + 1
    x = _tokens(1, 3, L)
    lengths = torch.tensor([L, L - 5, L - 9])
    real = torch.arange(L)[None] >= (L - lengths)[:, None]
    pos = (real.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got, _ = own(x, block_size=BS, key_mask=real, position_ids=pos)
        assert torch.isfinite(got).all()
        for b in range(3):
            row = x[b:b + 1, real[b]]
            alone, _ = own(row, block_size=BS)
            torch.testing.assert_close(got[b, real[b]], alone[0], atol=ATOL, rtol=0)
            want = ref(row, attention_mask=_tril_mask(row.shape[1], BS)).logits
            torch.testing.assert_close(alone, want, atol=ATOL, rtol=0)


def _full_rows(own, x, s, e):
    logits, _ = own(x[:, :e], block_size=BS)
    return logits[:, s:e]


def test_cached_block_steps_equal_the_full_forward(pair):
    """Exact block cache: prefill, steps on a block whose tokens change, the block's final write
    folded into the next block's first forward; every row equals the uncached forward's."""
    own, ref = pair
    torch.manual_seed(0)
    L = 4 * BS
    x = _tokens(2, 2, L)
    x[:, 2 * BS:] = own.mask_token_id
    cache = own.new_cache(2, L)
    with torch.no_grad():
        own(x[:, :2 * BS], block_size=BS, cache=cache, write_positions=torch.arange(2 * BS).expand(2, -1))
        s, e = 2 * BS, 3 * BS
        for step in range(3):  # commit a token per step in block [s, e)
            got, _ = own(x[:, s:e], block_size=BS, cache=cache, write_positions=torch.arange(s, e).expand(2, -1))
            torch.testing.assert_close(got, _full_rows(own, x, s, e), atol=ATOL, rtol=0)
            x[:, s + step] = got[:, step].argmax(-1)
        got, _ = own(x[:, s:L], block_size=BS, cache=cache, write_positions=torch.arange(s, L).expand(2, -1))
        torch.testing.assert_close(got, _full_rows(own, x, s, L), atol=ATOL, rtol=0)
        # the reference's own prefix cache (concatenated keys) agrees
        past = ref(x[:, :e], attention_mask=_tril_mask(e, BS, 2), use_cache=True).past_key_values
        want = ref(x[:, e:L], past_key_values=past).logits
        got, _ = own(x[:, e:L], block_size=BS, cache=cache, write_positions=torch.arange(e, L).expand(2, -1))
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        torch.testing.assert_close(cache.keys[1][:, :, :e], past[1][0], atol=ATOL, rtol=0)


def test_cached_rows_in_different_blocks_equal_rows_alone(pair):
    """Batch > 1 whose rows sit in different blocks (prompts of different lengths): per-row slots."""
    own, _ = pair
    L = 4 * BS
    x = _tokens(3, 2, L)
    cache = own.new_cache(2, L)
    starts = [2 * BS, BS]
    with torch.no_grad():
        for b, s in enumerate(starts):
            one = cache.select(torch.tensor([b]))
            own(x[b:b + 1, :s], block_size=BS, cache=one, write_positions=torch.arange(s)[None])
            cache.update_rows(torch.tensor([b]), one)
        cols = torch.stack([torch.arange(s, s + BS) for s in starts])
        got, _ = own(x.gather(1, cols), block_size=BS, cache=cache, write_positions=cols)
        for b, s in enumerate(starts):
            torch.testing.assert_close(got[b], _full_rows(own, x[b:b + 1], s, s + BS)[0], atol=ATOL, rtol=0)


def test_query_chunks_equal_one_pass(pair):
    own, _ = pair
    x = _tokens(4, 2, 3 * BS)
    with torch.no_grad():
        whole, _ = own(x, block_size=BS)
        own.query_chunk = 5
        try:
            chunked, _ = own(x, block_size=BS)
        finally:
            own.query_chunk = None
    torch.testing.assert_close(chunked, whole, atol=ATOL, rtol=0)


def _logit(p):
    p = torch.as_tensor(p, dtype=torch.float32)
    return torch.log(p) - torch.log1p(-p)


def test_router_group_limit_bias_and_weights():
    """4 experts in 2 groups, keep 1 group, top-2. Scores (0.9, 0.1 | 0.8, 0.7): the two best experts
    overall (0, 2) are in different groups; group 2's top-2 sum (1.5) beats group 1's (1.0), so
    experts 2, 3 are chosen. A bias (+0.6 on expert 1) makes group 1 win (0.9 + 0.7 = 1.6): experts
    0, 1 are chosen, weighted by their UNBIASED scores 0.9, 0.1 renormalised and scaled."""
    logits = _logit([[0.9, 0.1, 0.8, 0.7]])
    kw = dict(top_k=2, n_group=2, topk_group=1, scale=2.5)
    experts, weights = moe_route(logits, None, **kw)
    assert sorted(experts[0].tolist()) == [2, 3]
    torch.testing.assert_close(weights[0], torch.tensor([0.8, 0.7]) / 1.5 * 2.5)
    experts, weights = moe_route(logits, torch.tensor([0.0, 0.6, 0.0, 0.0]), **kw)
    assert experts[0].tolist() == [0, 1]  # 0.9 then 0.1 + 0.6
    torch.testing.assert_close(weights[0], torch.tensor([0.9, 0.1]) / 1.0 * 2.5)
    experts, _ = moe_route(logits, None, **{**kw, "topk_group": 2})
    assert experts[0].tolist() == [0, 2]  # no group limit in effect: the global top-2


def test_moe_routes_per_token_independently(pair):
    own, _ = pair
    moe = own.layers[1].mlp
    h = torch.randn(7, own.config.hidden_size, generator=torch.Generator().manual_seed(5))
    experts, _ = moe.route(h)
    assert len(set(map(tuple, experts.sort(-1).values.tolist()))) > 1  # not every token picks the same pair
    unbiased, _ = moe_route(moe.gate(h), None, top_k=2, n_group=2, topk_group=1, scale=2.5)
    assert not torch.equal(unbiased, experts)  # the checkpoint's expert_bias changes some choices
    with torch.no_grad():
        together = moe(h[None])[0]
        alone = torch.cat([moe(h[i:i + 1][None])[0] for i in range(7)])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=0)


def test_bfloat16_keeps_the_router_float32(checkpoint, pair):
    own32, _ = pair
    own = load_architecture(checkpoint("llada2"), dtype=torch.bfloat16, device="cpu")
    gate = own.layers[1].mlp.gate
    assert gate.weight.dtype == torch.float32 and gate.expert_bias.dtype == torch.float32
    assert own.embed.weight.dtype == torch.bfloat16 and own.layers[1].mlp.experts[0].up_proj.weight.dtype == torch.bfloat16
    x = _tokens(6, 2, 2 * BS)
    logits, _ = own(x, block_size=BS)
    want, _ = own32(x, block_size=BS)
    assert logits.dtype == torch.bfloat16
    assert (logits.float() - want).abs().max() < 0.05 * want.abs().max()


def _drop_key(folder, key):
    from safetensors.torch import load_file, save_file

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / index["weight_map"].pop(key)
    state = load_file(str(shard))
    del state[key]
    save_file(state, str(shard), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_missing_expert_weight_is_named(build, tmp_path):
    folder = build.build_llada2(tmp_path / "ckpt", seed=8)
    _drop_key(folder, "model.layers.1.mlp.experts.3.down_proj.weight")
    with pytest.raises(CheckpointFormatError, match=r"missing .*model\.layers\.1\.mlp\.experts\.3\.down_proj\.weight"):
        load_architecture(folder)


def test_unexpected_weight_is_named(build, tmp_path):
    folder = build.build_llada2(tmp_path / "ckpt", seed=8, first_k_dense_replace=2)  # layer 1 dense in config
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                    "first_k_dense_replace": 1}))
    with pytest.raises(CheckpointFormatError, match=r"unexpected .*model\.layers\.1\.mlp\.(down|gate|up)_proj"):
        load_architecture(folder)


def test_unknown_model_type_lists_llada2_moe():
    with pytest.raises(UnsupportedArchitectureError, match="llada2_moe"):
        detect_architecture({"model_type": "bert", "architectures": ["BertForMaskedLM"]})
    with pytest.raises(UnsupportedArchitectureError, match="llada2_moe"):  # dFactory's fused-expert format
        detect_architecture({"model_type": "llada2_moe_veomni"})
    assert detect_architecture({"architectures": ["LLaDA2MoeModelLM"]}) == "llada2_moe"


@pytest.mark.parametrize("key,value", [("norm_head", True), ("score_function", "softmax"), ("use_bias", True),
                                       ("rotary_dim", 16), ("norm_topk_prob", False)])
def test_unsupported_options_are_named(build, key, value):
    with pytest.raises(UnsupportedArchitectureError, match=key):
        LLaDA2ArchConfig.from_hf_config(build.llada2_config(**{key: value}))


def test_bad_groups_are_named(build):
    with pytest.raises(CheckpointFormatError, match="n_group=3"):
        LLaDA2ArchConfig.from_hf_config(build.llada2_config(n_group=3))


def test_real_config_defaults_give_the_released_ids(build):
    cfg = build.llada2_config(vocab_size=157184, pad_token_id=156892, hidden_size=2048, num_attention_heads=16,
                              head_dim=128, rotary_dim=64)
    del cfg["mask_token_id"], cfg["eos_token_id"]
    arch = LLaDA2ArchConfig.from_hf_config(cfg)
    assert (arch.mask_token_id, arch.eos_token_id, arch.vocab_size, arch.rotary_dim) == (156895, 156892, 157184, 64)
