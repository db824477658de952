"""The framework's own LLaDA / Dream give the remote-code reference's logits on the same checkpoint
folder, and load where transformers' ``from_pretrained`` of the remote code fails."""

import pytest
import torch

from adaptive_decoding.framework.models.arch import DreamModel, LLaDAModel, dream_shift, load_architecture

LLADA = ["llada", "llada_gqa_sharded"]
DREAM = ["dream", "dream_mha_sharded"]
ATOL = 1e-4


def test_framework_resolves_into_this_checkout():
    import pathlib

    import adaptive_decoding.framework as framework

    assert pathlib.Path(framework.__file__).resolve().parents[1] == pathlib.Path(__file__).resolve().parents[3]


def _batch(seed=0, B=3, L=14, vocab=300):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (B, L), generator=g)
    lengths = torch.tensor([L, L - 4, L - 9])[:B]
    mask = torch.arange(L)[None, :] >= (L - lengths)[:, None]  # left padding
    return x, mask


@pytest.mark.parametrize("name", LLADA)
def test_llada_logits_match_reference(name, checkpoint, reference):
    ref, own = reference(name), load_architecture(checkpoint(name))
    assert isinstance(own, LLaDAModel)
    x, mask = _batch()
    with torch.no_grad():
        want = ref(x, use_cache=False).logits
        got, cache = own(x)
        assert cache is None and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        # LLaDA's padding mask: an additive key bias, positions 0..L-1; ours: key_mask + cumsum positions
        want = ref(x, attention_mask=mask.long(), use_cache=False).logits
        got, _ = own(x, key_mask=mask, position_ids=mask.long().cumsum(-1) - 1)
        torch.testing.assert_close(got[mask], want[mask], atol=ATOL, rtol=0)
        got_arange, _ = own(x, key_mask=mask)  # the hub code's positions: same up to rounding (RoPE is relative)
        torch.testing.assert_close(got_arange[mask], want[mask], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", DREAM)
def test_dream_logits_match_reference(name, checkpoint, reference):
    ref, own = reference(name), load_architecture(checkpoint(name))
    assert isinstance(own, DreamModel) and own.logits_shift == 1
    x, mask = _batch(1)
    with torch.no_grad():
        want = ref(x, "full", None).logits  # as diffusion_generate calls it without padding
        got, _ = own(x)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        torch.testing.assert_close(dream_shift(got), dream_shift(want), atol=ATOL, rtol=0)
        # with padding, exactly as Dream's _sample builds tok_idx and the [B, 1, N, N] mask
        tok_idx = mask.long().cumsum(-1) - 1
        tok_idx.masked_fill_(~mask, 1)
        mask4 = torch.logical_and(mask[:, None, None, :], mask[:, None, :, None])
        want = ref(x, mask4, tok_idx).logits
        got, _ = own(x, key_mask=mask, position_ids=tok_idx)
        torch.testing.assert_close(got[mask], want[mask], atol=ATOL, rtol=0)
        assert torch.isfinite(got).all()  # pad query rows too (they attend to the real keys)


def test_llada_remote_code_fails_under_this_transformers_but_ours_loads(checkpoint):
    """Why the framework carries its own LLaDA: the hub class never calls ``post_init()``, which
    transformers 5's ``from_pretrained`` relies on (``all_tied_weights_keys``)."""
    transformers = pytest.importorskip("transformers")
    folder = checkpoint("llada")
    with pytest.raises(Exception) as info:
        transformers.AutoModel.from_pretrained(str(folder), trust_remote_code=True)
    assert "all_tied_weights_keys" in str(info.value) or isinstance(info.value, AttributeError), info.value
    model = load_architecture(folder)
    logits, _ = model(torch.tensor([[1, 2, model.mask_token_id, 4]]))
    assert logits.shape == (1, 4, model.vocab_size) and torch.isfinite(logits).all()


def test_real_llada_vocabulary(build, tmp_path):
    """LLaDA's real vocabulary (126464 ids, mask 126336) with a tiny body; LM head only where asked."""
    folder = build.build_llada(tmp_path / "llada_real_vocab", seed=5, d_model=32, n_heads=2, n_kv_heads=2,
                               n_layers=1, mlp_hidden_size=64, real_vocab=True)
    model = load_architecture(folder)
    assert (model.vocab_size, model.mask_token_id, model.eos_token_id) == (126464, 126336, 126081)
    x = torch.tensor([[126080, 5, 126336, 126336]])
    logits, _ = model(x, output_positions=torch.tensor([[2, 3]]))
    assert logits.shape == (1, 2, 126464)
    ref = build.reference_model(folder)
    with torch.no_grad():
        torch.testing.assert_close(logits, ref(x, use_cache=False).logits[:, 2:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["llada_gqa_sharded", "dream"])
def test_bfloat16_matches_reference_in_bfloat16(name, build, checkpoint):
    """Same rounding steps as the hub code in bf16 (RMS norm in fp32, LLaDA's RoPE in fp32, Dream's
    RoPE tables cast to bf16). The reference keeps its RoPE ``inv_freq`` in float32, as
    ``from_pretrained(torch_dtype=bfloat16)`` does (``.to(bfloat16)`` would round that buffer too)."""
    ref = build.reference_model(checkpoint(name))
    keep = {n: b.clone() for n, b in ref.named_buffers()}
    ref = ref.to(torch.bfloat16)
    for n, b in keep.items():
        module = ref.get_submodule(n.rsplit(".", 1)[0])
        setattr(module, n.rsplit(".", 1)[1], b)
    own = load_architecture(checkpoint(name), dtype=torch.bfloat16)
    x, mask = _batch(2)
    with torch.no_grad():
        want = ref(x, use_cache=False).logits if name.startswith("llada") else ref(x, "full", None).logits
        got, _ = own(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=2e-2, rtol=0)
