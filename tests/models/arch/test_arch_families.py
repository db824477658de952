"""The own SDAR, Fast-dLLM v2 and LLaDA-MoE against compact references of their published modeling
code (``tests/fixtures/real_format/families.py``), on tiny checkpoints in the real on-disk format:
logits in float32, left-padded batches equal to single rows, the block-causal cache equal to the
full forward and to the published cache calls, MoE routing, and loading errors."""

import json
from pathlib import Path

import _adec_real_format_families as real_format_families  # loaded by tests/conftest.py
import pytest
import torch

from adaptive_decoding.framework.models.arch import (
    CheckpointFormatError,
    FastDLLMv2Model,
    KVCache,
    LLaDAMoEModel,
    SDARModel,
    UnsupportedArchitectureError,
    block_columns,
    detect_architecture,
    load_architecture,
)
from adaptive_decoding.framework.models.arch.variants import MoEFeedForward

ATOL = 1e-4
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "real_format" / "families.py"


FAM = real_format_families
CASES = {
    "sdar": (FAM.sdar_config, dict(), 11),
    "sdar_tied_b8": (FAM.sdar_config, dict(tie_word_embeddings=True, block_size=8, num_key_value_heads=4), 12),
    "fast": (FAM.fast_dllm_v2_config, dict(), 13),
    "fast_untied": (FAM.fast_dllm_v2_config, dict(tie_word_embeddings=False, bd_size=4), 14),
    "moe": (FAM.llada_moe_config, dict(), 15),
    "moe_shared": (FAM.llada_moe_config, dict(model_type="lladamoe", shared_expert_intermediate_size=20,
                                              moe_router_enable_expert_bias=True, clip_qkv=0.5,
                                              partial_rotary_factor=0.5, num_key_value_heads=2), 16),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            fn, over, seed = CASES[name]
            made[name] = FAM.build(tmp_path_factory.mktemp(name) / "ckpt", fn(**over), seed=seed)
        return made[name]

    return get


def _ids(seed, B, L, vocab=300):
    return torch.randint(0, vocab, (B, L), generator=torch.Generator().manual_seed(seed))


def _sdar_mask(L, bs):
    """``block_diffusion_generate``'s ``block_diffusion_attention_mask`` (0/1, ``[1, L, L]``)."""
    n = -(-L // bs)
    m = torch.tril(torch.ones(n, n)).repeat_interleave(bs, 0).repeat_interleave(bs, 1)[None]
    return m[:, :L, :L]


# ------------------------------------------------------------------------------------- detection
def test_detection_and_classes(folder):
    for name, cls in (("sdar", SDARModel), ("fast", FastDLLMv2Model), ("moe", LLaDAMoEModel),
                      ("moe_shared", LLaDAMoEModel)):
        model = load_architecture(folder(name))
        assert type(model) is cls, name
    assert (SDARModel.logits_shift, FastDLLMv2Model.logits_shift, LLaDAMoEModel.logits_shift) == (0, 1, 0)
    sdar, fast = load_architecture(folder("sdar")), load_architecture(folder("fast"))
    assert (sdar.block_size, sdar.mask_token_id, fast.block_size, fast.mask_token_id) == (4, 310, 8, 151665)
    # the released LLaDA-MoE config says model_type 'llada': the MoE keys or the class name decide
    assert detect_architecture(FAM.llada_moe_config()) == "lladamoe"
    assert detect_architecture({"architectures": ["LLaDAMoEModelLM"]}) == "lladamoe"
    assert detect_architecture({"model_type": "llada", "d_model": 8}) == "llada"
    assert detect_architecture({"architectures": ["Fast_dLLM_QwenForCausalLM"]}) == "fast_dllm_qwen"


def test_unsupported_modes_fail_clearly(folder):
    sdar = load_architecture(folder("sdar"))
    sdar.check_block_length(4)
    with pytest.raises(UnsupportedArchitectureError, match="trained with blocks of 4"):
        sdar.check_block_length(32)
    with pytest.raises(UnsupportedArchitectureError, match="'dual'"):
        sdar.check_cache_mode("dual")
    moe = load_architecture(folder("moe"))
    moe.check_cache_mode("dual")
    with pytest.raises(UnsupportedArchitectureError, match="'block'"):
        moe.check_cache_mode("block")


# --------------------------------------------------------------------------- full forward parity
@pytest.mark.parametrize("name", ["sdar", "sdar_tied_b8"])
def test_sdar_logits_match_reference(name, folder):
    own, ref = load_architecture(folder(name)), FAM.reference_model(folder(name))
    x = _ids(0, 1, 14)
    with torch.no_grad():
        want = FAM.sdar_forward(ref, x, _sdar_mask(14, own.block_size), torch.arange(14)[None])
        torch.testing.assert_close(own.forward_full(x), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["fast", "fast_untied"])
def test_fast_dllm_v2_logits_match_reference(name, folder):
    own, ref = load_architecture(folder(name)), FAM.reference_model(folder(name))
    x = _ids(1, 1, 19)
    with torch.no_grad():
        want = FAM.fast_forward(ref, x, block_size=own.block_size)
        torch.testing.assert_close(own.forward_full(x), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["moe", "moe_shared"])
def test_llada_moe_logits_match_reference(name, folder):
    own, ref = load_architecture(folder(name)), FAM.reference_model(folder(name))
    x = _ids(2, 3, 13)
    valid = torch.arange(13)[None] >= torch.tensor([0, 4, 9])[:, None]  # left padding
    with torch.no_grad():
        got, _ = own(x)
        torch.testing.assert_close(got, FAM.moe_forward(ref, x), atol=ATOL, rtol=0)
        want = FAM.moe_forward(ref, x, valid.long())  # the hub call: positions arange, padding bias
        got, _ = own(x, key_mask=valid, position_ids=(valid.long().cumsum(-1) - 1).clamp(min=0))
        torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------ padding == single rows
@pytest.mark.parametrize("name", ["sdar", "fast", "moe_shared"])
def test_left_padded_batch_equals_single_rows(name, folder):
    own = load_architecture(folder(name))
    x = _ids(3, 3, 15)
    pads = torch.tensor([0, 3, 7])
    valid = torch.arange(15)[None] >= pads[:, None]
    with torch.no_grad():
        if isinstance(own, LLaDAMoEModel):
            batch, _ = own(x, key_mask=valid, position_ids=(valid.long().cumsum(-1) - 1).clamp(min=0))
        else:
            batch = own.forward_full(x, key_valid=valid)
        for b, p in enumerate(pads.tolist()):
            single = own(x[b:b + 1, p:])[0] if isinstance(own, LLaDAMoEModel) else own.forward_full(x[b:b + 1, p:])
            torch.testing.assert_close(batch[b, p:], single[0], atol=ATOL, rtol=0)


def test_block_mask_matters(folder):
    """Guard against a vacuous parity: the bidirectional forward of the same ids differs."""
    own = load_architecture(folder("sdar"))
    x = _ids(4, 1, 12)
    with torch.no_grad():
        assert not torch.allclose(own.forward_full(x)[:, :8], own(x)[0][:, :8], atol=1e-3)


# --------------------------------------------------------------------------- the block cache
def _sdar_generate_calls(own, ref, x, prompt_len):
    """Run SDAR's ``block_diffusion_generate`` call sequence (prefill of whole prompt blocks with
    ``store_kv``; per block a denoising forward, then a storing one) on the fixed canvas ``x`` in
    both implementations, comparing each forward's logits; returns our cache."""
    bs, L = own.block_size, x.shape[1]
    mask, pos = _sdar_mask(L, bs), torch.arange(L)[None]
    past, cache = [], own.new_cache(1, L)
    pre = prompt_len // bs * bs
    FAM.sdar_forward(ref, x[:, :pre], mask[:, :pre, :pre], pos[:, :pre], past, True)
    own.forward_cached(x[:, :pre], torch.arange(pre)[None], cache)
    for s in range(pre, L, bs):
        e = s + bs
        for store in (False, True):
            want = FAM.sdar_forward(ref, x[:, s:e], mask[:, s:e, :e], pos[:, s:e], past, store)
            got = own.forward_cached(x[:, s:e], torch.arange(s, e)[None], cache)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    return cache


def test_sdar_block_cache_matches_published_calls_and_full_forward(folder):
    own, ref = load_architecture(folder("sdar")), FAM.reference_model(folder("sdar"))
    x = _ids(5, 1, 16)
    with torch.no_grad():
        cache = _sdar_generate_calls(own, ref, x, prompt_len=6)
        full = own.forward_full(x)
        for s in range(0, 16, 4):  # every block forwarded against the filled cache = the full forward's rows
            got = own.forward_cached(x[:, s:s + 4], torch.arange(s, s + 4)[None], cache)
            torch.testing.assert_close(got, full[:, s:s + 4], atol=ATOL, rtol=0)


def test_fast_dllm_v2_block_cache_and_shifted_window(folder):
    own, ref = load_architecture(folder("fast")), FAM.reference_model(folder("fast"))
    bs, L = own.block_size, 32
    x = _ids(6, 1, L)
    with torch.no_grad():
        past, cache = [], own.new_cache(1, L)
        want = FAM.fast_forward(ref, x[:, :16], past, True, block_size=bs)  # generate()'s prefill
        got = own.forward_cached(x[:, :16], torch.arange(16)[None], cache)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        for s in (16, 24):
            for update in (False, True):
                want = FAM.fast_forward(ref, x[:, s:s + bs], past, update, block_size=bs)
                got = own.forward_cached(x[:, s:s + bs], torch.arange(s, s + bs)[None], cache)
                torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        # shifted logits of block [24, 32): query [23, 32), column 23 queried but not written
        full = own.forward_full(x)
        valid = torch.ones(1, 9, dtype=torch.bool)
        valid[:, 0] = False
        got = own.forward_cached(x[:, 23:], torch.arange(23, 32)[None], cache, write_valid=valid)
        torch.testing.assert_close(got[:, :-1], full[:, 23:31], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["sdar", "fast_untied"])
def test_block_cache_left_padded_batch_equals_single_rows(name, folder):
    """Rows with different left pads: row b's block k lives at columns pads[b] + k*bs (block_columns)."""
    own = load_architecture(folder(name))
    bs, n_blocks = own.block_size, 4
    pads = torch.tensor([0, 3])
    S = int(pads.max()) + n_blocks * bs
    x = _ids(7, 2, S)
    cols = torch.arange(S)[None]
    valid = (cols >= pads[:, None]) & (cols < pads[:, None] + n_blocks * bs)
    with torch.no_grad():
        cache = own.new_cache(2, S)
        singles = [own.new_cache(1, n_blocks * bs) for _ in pads]
        for k in range(n_blocks):
            c = block_columns(pads, k, bs)
            for _ in range(2):  # a denoising step, then the storing one
                got = own.forward_cached(x.gather(1, c), c, cache, key_valid=valid)
                for b, p in enumerate(pads.tolist()):
                    row = x[b:b + 1, p:p + n_blocks * bs]
                    one = own.forward_cached(row[:, k * bs:(k + 1) * bs], torch.arange(k * bs, (k + 1) * bs)[None],
                                             singles[b])
                    torch.testing.assert_close(got[b:b + 1], one, atol=ATOL, rtol=0)


def test_llada_moe_prefix_and_dual_cache_steps(folder):
    """LLaDA's cache protocol on the MoE model (batch 2): a refresh, then prefix / dual steps over an
    unchanged canvas give the full forward's rows (the cache then holds exactly those keys)."""
    own = load_architecture(folder("moe_shared"))
    x = _ids(8, 2, 12)
    with torch.no_grad():
        want, _ = own(x)
        full, cache = own(x, use_cache=True)
        assert isinstance(cache, KVCache) and cache.length == 12
        torch.testing.assert_close(full, want, atol=ATOL, rtol=0)
        got, _ = own(x[:, 4:], cache=cache.clone(), write_positions=torch.arange(4, 12).expand(2, -1))  # prefix
        torch.testing.assert_close(got, want[:, 4:], atol=ATOL, rtol=0)
        got, _ = own(x[:, 4:10], cache=cache, write_positions=torch.arange(4, 10).expand(2, -1))  # dual [4, 10)
        torch.testing.assert_close(got, want[:, 4:10], atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------- MoE routing
def _designed_moe(expert_bias=False):
    """4 experts over C = 4: the router's logits are 4 * x (so a one-hot-ish token prefers the
    expert of its largest channel), expert e's down_proj writes only channel e."""
    torch.manual_seed(0)
    moe = MoEFeedForward(4, 4, 2, 3, None, expert_bias)
    with torch.no_grad():
        moe.gate.weight.copy_(4 * torch.eye(4))
        for e, ex in enumerate(moe.experts):
            ex.gate_proj.weight.fill_(1.0)
            ex.up_proj.weight.fill_(1.0)
            ex.down_proj.weight.zero_()
            ex.down_proj.weight[e].fill_(1.0)
    return moe


def test_moe_routing_designed_case():
    moe = _designed_moe()
    x = torch.tensor([[[1.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.2, 1.0], [0.0, 0.0, 0.0, 0.0]]])
    with torch.no_grad():
        w, ids = moe.route(x[0])
        p = torch.softmax(4 * x[0], -1)
        assert ids[:2].tolist() == [[0, 1], [3, 2]]
        torch.testing.assert_close(w, p.gather(1, ids))  # softmax weights, not renormalised over the top 2
        assert w.sum(-1).max() < 1
        out = moe(x)[0]
        s = x[0].sum(-1)
        act = torch.nn.functional.silu(s) * s * 3  # each expert's SwiGLU output on its channel
        for t in range(3):
            want = torch.zeros(4)
            want[ids[t]] = w[t] * act[t]
            torch.testing.assert_close(out[t], want)


def test_moe_expert_bias_changes_the_choice_and_the_weights():
    moe = _designed_moe(expert_bias=True)
    x = torch.tensor([[1.0, 0.5, 0.0, 0.0]])
    with torch.no_grad():
        moe.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 1.0]))
        w, ids = moe.route(x)
        p = torch.softmax(4 * x, -1)[0]
        assert ids[0].tolist() == [3, 0]  # the published block adds the bias to the probabilities ...
        torch.testing.assert_close(w[0], torch.stack([p[3] + 1, p[0]]))  # ... and keeps it in the weights


def test_moe_matches_published_block_at_batch_with_padding_rows():
    torch.manual_seed(3)
    cfg = FAM.llada_moe_config(num_experts=5, num_experts_per_tok=3, moe_router_enable_expert_bias=True)
    ref = FAM.SparseMoeBlock(cfg)
    ours = MoEFeedForward(32, 5, 3, cfg["expert_intermediate_size"], None, True)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
        ref.expert_bias.normal_(0, 0.05)
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(3, 7, 32)
        x[1, :4] = 0.0  # "padding" rows: no effect on the others
        torch.testing.assert_close(ours(x), ref(x), atol=1e-6, rtol=0)
        torch.testing.assert_close(ours(x[2:3]), ref(x)[2:3], atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------- loading errors
def _rename_key(folder, old, new):
    """Rename tensor ``old`` to ``new`` inside its shard and in ``model.safetensors.index.json``."""
    from safetensors.torch import load_file, save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = index["weight_map"].pop(old)
    state = load_file(str(folder / shard))
    state[new] = state.pop(old)
    save_file(state, str(folder / shard), metadata={"format": "pt"})
    index["weight_map"][new] = shard
    index_path.write_text(json.dumps(index))


@pytest.mark.parametrize("fn, old, new", [
    (FAM.sdar_config, "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.query_norm.weight"),
    (FAM.llada_moe_config, "model.layers.2.mlp.experts.5.up_proj.weight", "model.layers.2.mlp.w1"),
    (FAM.fast_dllm_v2_config, "model.layers.0.self_attn.k_proj.bias", "model.layers.0.self_attn.k_bias"),
])
def test_loading_errors_name_the_bad_keys(fn, old, new, tmp_path):
    folder = FAM.build(tmp_path / "ckpt", fn(), seed=1)
    _rename_key(folder, old, new)
    with pytest.raises(CheckpointFormatError) as info:
        load_architecture(folder)
    assert old in str(info.value) and new in str(info.value)


@pytest.mark.parametrize("fn, change, needle", [
    (FAM.sdar_config, {"block_size": None}, "'block_size'"),
    (FAM.llada_moe_config, {"moe_layer_freq": [1, 1]}, "moe_layer_freq"),
    (FAM.fast_dllm_v2_config, {"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
    (FAM.sdar_config, {"use_sliding_window": True}, "use_sliding_window"),
])
def test_config_errors_are_clear(fn, change, needle, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(fn(**change)))
    with pytest.raises(CheckpointFormatError, match=needle):
        load_architecture(folder)
