"""Checkpoint loading of the own LLaDA / Dream: every weight layout, dtypes, optional parameters,
``output_positions``, and the error messages for folders that cannot be loaded."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from adaptive_decoding.framework.models.arch import (
    CheckpointFormatError,
    DreamModel,
    LLaDAModel,
    MissingCheckpointError,
    UnsupportedArchitectureError,
    detect_architecture,
    load_architecture,
)

ATOL = 1e-4
X = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82, 84, 59, 4]])


def _logits(ref, x):
    with torch.no_grad():
        if type(ref).__name__ == "LLaDAModelLM":
            return ref(x, use_cache=False).logits
        return ref(x, "full", None).logits


@pytest.mark.parametrize("builder,kwargs", [
    ("build_llada", dict(fmt="bin")),
    ("build_llada", dict(fmt="bin", shards=2, n_kv_heads=1, multi_query_attention=True)),
    ("build_llada", dict(weight_tying=True)),
    ("build_llada", dict(include_bias=True, shards=4)),
    ("build_llada", dict(include_qkv_bias=True, mlp_hidden_size=None, mlp_ratio=2)),
    ("build_dream", dict(fmt="bin", shards=3)),
    ("build_dream", dict(tie_word_embeddings=True, num_key_value_heads=1)),
])
def test_layouts_and_options_match_reference(build, tmp_path, builder, kwargs):
    folder = getattr(build, builder)(tmp_path / "ckpt", seed=7, **kwargs)
    own = load_architecture(folder)
    assert not any(p.requires_grad for p in own.parameters()) and not own.training
    got, _ = own(X)
    torch.testing.assert_close(got, _logits(build.reference_model(folder), X), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["llada_gqa_sharded", "dream"])
def test_bfloat16_and_output_positions(name, checkpoint):
    full32 = load_architecture(checkpoint(name))
    own = load_architecture(checkpoint(name), dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in own.parameters()} == {torch.bfloat16}
    logits, cache = own(X, use_cache=True)
    assert logits.dtype == torch.bfloat16 and cache.keys[0].dtype == torch.bfloat16
    want = full32(X)[0]
    assert (logits.float() - want).abs().max() < 0.05 * want.abs().max()
    step, _ = own(X[:, 2:5], cache=cache, write_positions=torch.arange(2, 5).expand(2, -1))
    assert step.dtype == torch.bfloat16 and torch.isfinite(step.float()).all()
    rows = torch.tensor([[7, 0, 3], [1, 1, 6]])
    few, _ = full32(X, output_positions=rows)
    assert few.shape == (2, 3, full32.vocab_size)
    torch.testing.assert_close(few, want.gather(1, rows[..., None].expand(-1, -1, want.shape[-1])), atol=ATOL, rtol=0)


def test_stored_bfloat16_is_kept_by_default(build, tmp_path):
    folder = build.build_dream(tmp_path / "bf16", seed=8, dtype=torch.bfloat16)
    own = load_architecture(folder)
    assert own.dtype == torch.bfloat16 and isinstance(own, DreamModel)
    assert load_architecture(folder, dtype=torch.float32).dtype == torch.float32


def test_class_from_pretrained_and_special_ids(checkpoint):
    llada = LLaDAModel.from_pretrained(checkpoint("llada"))
    assert (llada.mask_token_id, llada.eos_token_id, llada.pad_token_id, llada.vocab_size) == (310, 300, 300, 320)
    dream = DreamModel.from_pretrained(checkpoint("dream"))
    assert (dream.mask_token_id, dream.eos_token_id, dream.logits_shift) == (310, 300, 1)
    with pytest.raises(UnsupportedArchitectureError, match="Dream.*load_architecture"):
        LLaDAModel.from_pretrained(checkpoint("dream"))


# ---------------------------------------------------------------------------------------- errors
def test_missing_folder(tmp_path):
    with pytest.raises(MissingCheckpointError, match="does not exist") as info:
        load_architecture(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value) and isinstance(info.value, FileNotFoundError)


def test_folder_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(MissingCheckpointError, match=r"config\.json is missing.*model\.safetensors"):
        load_architecture(tmp_path)


def test_config_without_weights(build, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(build.llada_config()))
    with pytest.raises(MissingCheckpointError) as info:
        load_architecture(tmp_path)
    msg = str(info.value)
    assert str(tmp_path) in msg and "model.safetensors" in msg and "pytorch_model.bin" in msg and "config.json" in msg


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    with pytest.raises(UnsupportedArchitectureError) as info:
        load_architecture(tmp_path)
    msg = str(info.value)
    assert "'bert'" in msg and "BertForMaskedLM" in msg and "LLaDA" in msg and "Dream" in msg
    # auto_map alone is enough to recognise a checkpoint whose model_type was renamed
    assert detect_architecture({"model_type": "x", "auto_map": {"AutoModel": "modeling_llada.LLaDAModelLM"}}) == "llada"
    # a relative with other classes is refused, not guessed from a substring; the message lists LLaDA2-MoE
    with pytest.raises(UnsupportedArchitectureError, match=r"LLaDAMoEFusedModelLM.*llada2_moe"):
        detect_architecture({"model_type": "llada_moe", "architectures": ["LLaDAMoEFusedModelLM"]})
    assert detect_architecture({"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"]}) == "llada2_moe"


def test_unsupported_option_is_named(build, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(build.llada_config(block_type="sequential")))
    with pytest.raises(UnsupportedArchitectureError, match="block_type='sequential'.*block_type='llama'"):
        load_architecture(tmp_path)


def _rewrite(folder, drop=(), add=None):
    path = folder / "model.safetensors"
    state = load_file(str(path))
    for key in drop:
        del state[key]
    state.update(add or {})
    save_file(state, str(path))


def test_missing_weight_is_named(build, tmp_path):
    folder = build.build_llada(tmp_path / "ckpt")
    _rewrite(folder, drop=["model.transformer.blocks.1.up_proj.weight"])
    with pytest.raises(CheckpointFormatError, match=r"missing weights.*model\.transformer\.blocks\.1\.up_proj\.weight"):
        load_architecture(folder)


def test_unexpected_weight_is_named(build, tmp_path):
    folder = build.build_dream(tmp_path / "ckpt")
    _rewrite(folder, add={"model.layers.0.self_attn.q_norm.weight": torch.ones(16),
                          "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})  # the latter is tolerated
    with pytest.raises(CheckpointFormatError, match="unexpected weights") as info:
        load_architecture(folder)
    assert "model.layers.0.self_attn.q_norm.weight" in str(info.value) and "inv_freq" not in str(info.value)


def test_config_asking_for_more_layers_names_them(build, tmp_path):
    folder = build.build_llada(tmp_path / "ckpt")
    (folder / "config.json").write_text(json.dumps(build.llada_config(n_layers=3)))
    with pytest.raises(CheckpointFormatError, match=r"model\.transformer\.blocks\.2\."):
        load_architecture(folder)


def test_shape_mismatch_is_named(build, tmp_path):
    folder = build.build_dream(tmp_path / "ckpt")
    (folder / "config.json").write_text(json.dumps(build.dream_config(intermediate_size=96)))
    with pytest.raises(CheckpointFormatError, match=r"mlp\.\w+_proj\.weight in model\.safetensors has shape") as info:
        load_architecture(folder)
    assert "160" in str(info.value) and "implies" in str(info.value) and "96" in str(info.value)


def test_index_naming_a_missing_shard(build, tmp_path):
    folder = build.build_llada(tmp_path / "ckpt", shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(MissingCheckpointError, match="model-00002-of-00002.safetensors"):
        load_architecture(folder)


def test_unreadable_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointFormatError, match="not readable JSON"):
        load_architecture(tmp_path)


def test_tied_head_stored_anyway_is_ignored(build, tmp_path):
    folder = build.build_llada(tmp_path / "ckpt", weight_tying=True)
    want = _logits(build.reference_model(folder), X)
    _rewrite(folder, add={"model.transformer.ff_out.weight": torch.zeros(320, 64)})
    own = load_architecture(folder)
    assert own.lm_head is None
    torch.testing.assert_close(own(X)[0], want, atol=ATOL, rtol=0)


def test_arch_package_imports_only_torch_safetensors_and_stdlib():
    """framework/models/arch is self-contained: relative imports, torch, safetensors, stdlib."""
    import ast
    import sys
    from pathlib import Path

    import adaptive_decoding.framework.models.arch as arch

    allowed = {"torch", "safetensors"} | set(sys.stdlib_module_names)
    for path in Path(arch.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                roots = [] if node.level else [node.module.split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"
