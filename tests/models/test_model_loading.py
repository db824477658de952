"""Loading real-checkpoint-shaped models without a download: the hub cache layout, dtype and device
choice, end-of-text ids (LLaDA's ``<|eot_id|>``), the remote-code gate and the place where the
framework's own architectures plug in. Every checkpoint is built from a config into tmp_path.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from adaptive_decoding.framework.models.hub_adapters import HubModelError, ModelNotCachedError
from adaptive_decoding.framework.models.hub_loading import (
    cached_snapshot,
    hub_cache_dir,
    load_hub_model,
    looks_like_hub_name,
    own_architecture,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
)
from adaptive_decoding.framework.training.zoo import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hub import VOCAB, remote_code_folder, word_tokenizer  # noqa: E402

LLADA_VOCAB = [*VOCAB, "<|endoftext|>", "<|eot_id|>"]
ENDOFTEXT, EOT = len(VOCAB), len(VOCAB) + 1


def llada_tokenizer(folder: Path, vocab=LLADA_VOCAB):
    """A word-level tokenizer whose EOS is <|endoftext|> and which also knows <|eot_id|>, as LLaDA's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    extra = {"additional_special_tokens": ["<|eot_id|>"]} if "<|eot_id|>" in vocab else {}
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                  eos_token="<|endoftext|>", **extra)
    tok.save_pretrained(folder)
    return tok


def llada_checkpoint(folder: Path, *, eot: bool = True) -> Path:
    vocab = LLADA_VOCAB if eot else LLADA_VOCAB[:-1]
    remote_code_folder(folder, "hub_llada", "modeling_tiny_llada", "TinyLLaDAConfig", "TinyLLaDAModelLM", "llada",
                       vocab_size=len(vocab), mask_token_id=3)
    llada_tokenizer(folder, vocab)
    return folder


def bert_checkpoint(folder: Path, chat_template: str | None = None) -> Path:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64)
    BertForMaskedLM(cfg).save_pretrained(folder)
    word_tokenizer(folder, chat_template=chat_template)
    return folder


def fake_hub_cache(cache: Path, name: str, build, *, ref: bool = True, commit: str = "0123abcd") -> Path:
    """Lay a checkpoint out as the hub cache does: models--ORG--NAME/snapshots/<commit>/ (+ refs/main)."""
    root = cache / ("models--" + name.replace("/", "--"))
    snap = build(root / "snapshots" / commit)
    if ref:
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(commit)
    return snap


# ----------------------------------------------------------------------------- end-of-text ids
def test_llada_adapter_exposes_eot_as_an_end_token(tmp_path):
    loaded = load_hub_model(str(llada_checkpoint(tmp_path / "llada")), trust_remote_code=True)
    den, tok = loaded.denoiser, loaded.tokenizer
    assert den.eos_token_id == ENDOFTEXT and den.eos_token_ids == (ENDOFTEXT, EOT)
    assert tok.eos_token_ids == (ENDOFTEXT, EOT) and loaded.info["eos_token_ids"] == [ENDOFTEXT, EOT]
    w = {t: i for i, t in enumerate(LLADA_VOCAB)}
    # the answer stops at whichever end token comes first
    assert tok.decode([w["w1"], w["w2"], EOT, w["w3"], ENDOFTEXT]) == "w1 w2"
    assert tok.decode([w["w1"], ENDOFTEXT, w["w3"], EOT]) == "w1"
    assert tok.decode([w["w1"], EOT, w["w3"]], stop_at_eos=False) == "w1 w3"


def test_llada_without_eot_in_its_tokenizer_has_one_end_token(tmp_path):
    loaded = load_hub_model(str(llada_checkpoint(tmp_path / "llada", eot=False)), trust_remote_code=True)
    assert loaded.denoiser.eos_token_ids == (ENDOFTEXT,)  # never the unknown token's id


def test_llada_eos_confidence_option_ranks_eot_last_through_the_adapter(tmp_path):
    """End to end on the adapter: confidence_eos_inf sees <|eot_id|> through eos_token_ids."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.loop import decode

    den = load_hub_model(str(llada_checkpoint(tmp_path / "llada")), trust_remote_code=True).denoiser
    base = den.compute_logits

    def logits(x, mask):  # the designed words, made unsure; the last position a sure <|eot_id|>
        out = base(x, mask) * 0.1
        out[:, -1, :] = -10.0
        out[:, -1, EOT] = 30.0
        return out

    den.compute_logits = logits
    ctrl = build_controller("llada", steps=4, confidence_eos_inf=True)
    res = decode(den, [[4, 5]], ctrl, DecodeConfig(gen_length=4), trace=True)
    assert res.generated[0, -1].item() == EOT
    assert res.trace[-1]["commit"][0, -1].item()  # committed last, although the most confident
    res = decode(den, [[4, 5]], build_controller("llada", steps=4), DecodeConfig(gen_length=4), trace=True)
    assert res.trace[0]["commit"][0, -1].item()  # without the option: first


# ----------------------------------------------------------------------------- hub cache
def test_hub_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_cache_dir() == tmp_path / "hub"


@pytest.mark.parametrize("ref", [True, False])
def test_hub_name_resolves_to_its_cached_snapshot(monkeypatch, tmp_path, ref):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = fake_hub_cache(tmp_path / "hub", "tiny-org/tiny-bert", bert_checkpoint, ref=ref)
    assert cached_snapshot("tiny-org/tiny-bert") == snap
    assert resolve_model_path("tiny-org/tiny-bert") == snap
    loaded = load_model("tiny-org/tiny-bert", device="auto")
    assert loaded.info["kind"] == "masked_lm" and loaded.info["path"] == str(snap)
    assert loaded.info["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert loaded.info["dtype"] == "torch.float32"  # no dtype asked: transformers' default


def test_missing_hub_name_says_how_to_fetch_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelNotCachedError) as err:
        load_model("GSAI-ML/LLaDA-8B-Instruct")
    msg = str(err.value)
    assert "huggingface-cli download GSAI-ML/LLaDA-8B-Instruct" in msg and "hf download" in msg
    assert str(tmp_path / "hub") in msg and "built-in model name" in msg
    # a snapshot folder without config.json (interrupted download) says so
    (tmp_path / "hub" / "models--a--b" / "snapshots" / "c0ffee").mkdir(parents=True)
    with pytest.raises(ModelNotCachedError, match="no config.json.*huggingface-cli download a/b"):
        resolve_model_path("a/b")


def test_names_that_are_nothing_list_what_was_tried(tmp_path):
    from adaptive_decoding.framework.core.registry import UnknownNameError
    from adaptive_decoding.framework.models.saved import CheckpointError

    tried = r"no such model folder\. Tried: a folder .*does not exist.*built-in model name \(known: tiny-addition"
    with pytest.raises(CheckpointError, match=tried + r".*not of the form org/name"):
        load_model(str(tmp_path / "a" / "b" / "c"))
    with pytest.raises(UnknownNameError, match=r"Tried: .*tiny-addition.*org/name"):
        load_model("tiny-multiplication")
    assert looks_like_hub_name("GSAI-ML/LLaDA-8B-Instruct") and looks_like_hub_name("Dream-org/Dream-v0-Instruct-7B")
    assert not any(map(looks_like_hub_name, ["./a/b", "/a/b", "~/a", "a/b/c", "tiny-addition", "a/../b"]))


# ----------------------------------------------------------------------------- dtype and device
def test_dtype_and_device_choices(tmp_path):
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("auto", "cuda:0") == torch.bfloat16
    assert resolve_dtype("float16") == torch.float16 and resolve_dtype(None) is None
    with pytest.raises(HubModelError, match=r"'int3'.*allowed: auto, float32, bfloat16, float16"):
        resolve_dtype("int3")
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(HubModelError, match=r"'tpu'.*allowed: auto, cpu, cuda, cuda:N"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(HubModelError, match="torch.cuda.is_available"):
            resolve_device("cuda:1")
    folder = bert_checkpoint(tmp_path / "bert")
    assert load_model(str(folder), dtype="bfloat16").info["dtype"] == "torch.bfloat16"
    assert next(load_model(str(folder), dtype="auto").denoiser.parameters()).dtype == torch.float32  # CPU


# ----------------------------------------------------------------------------- remote code, own architectures
def test_remote_code_is_refused_without_trust_naming_the_flag(tmp_path):
    folder = llada_checkpoint(tmp_path / "llada")
    with pytest.raises(HubModelError, match=r"--trust-remote-code"):
        load_model(str(folder))  # load_model (the CLI's loader) never trusts silently
    assert load_model(str(folder), trust_remote_code=True).info["kind"] == "llada"


def real_format(name: str, folder: Path) -> Path:
    """A tiny checkpoint in LLaDA's / Dream's real on-disk format (tests/fixtures/real_format), with
    a word-level tokenizer next to it."""
    spec = importlib.util.spec_from_file_location(
        "_adec_real_format_build", Path(__file__).resolve().parents[1] / "fixtures" / "real_format" / "build.py")
    build = sys.modules.get(spec.name)
    if build is None:
        build = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = build
        spec.loader.exec_module(build)
    getattr(build, f"build_{name}")(folder, seed=5)
    word_tokenizer(folder)
    return folder


def test_own_architecture_claims_only_the_reference_classes():
    llada = {"model_type": "llada", "architectures": ["LLaDAModelLM"],
             "auto_map": {"AutoConfig": "modeling_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"}}
    assert own_architecture(llada) and own_architecture({"model_type": "Dream", "architectures": ["DreamModel"]})
    assert own_architecture({"model_type": "llada"})  # nothing declared: the model type decides
    assert not own_architecture({"model_type": "bert", "architectures": ["BertForMaskedLM"]})
    assert not own_architecture({"model_type": "llada", "architectures": ["TinyLLaDAModelLM"]})  # a relative
    llada2 = {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"],
              "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                           "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"}}
    assert own_architecture(llada2) and not own_architecture({"model_type": "llada2_moe_veomni"})
    # LLaDA-MoE is implemented (adaptive_decoding.framework.models.arch.llada_moe), under either model_type its configs use
    assert own_architecture({"model_type": "llada", "architectures": ["LLaDAMoEModelLM"]})
    assert own_architecture({"model_type": "lladamoe", "architectures": ["LLaDAMoEModelLM"]})
    assert not own_architecture({"model_type": "llada", "architectures": ["LLaDAMoEFusedModelLM"]})  # a relative


def test_llada2_loads_as_its_own_architecture_with_its_ids(tmp_path):
    """LLaDA2-MoE: claimed by the llada2 adapter (not llada's substring match), run by the own
    implementation without remote code; the block-causal forward reaches the model through ``core``."""
    from adaptive_decoding.framework.models.arch import LLaDA2MoeModel
    from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

    loaded = load_model(str(real_format("llada2", tmp_path / "llada2")), dtype="float32")
    den = loaded.denoiser
    assert isinstance(den, OwnArchitectureDenoiser) and isinstance(den.model, LLaDA2MoeModel)
    assert loaded.info["kind"] == "llada2" and loaded.info["class"] == "LLaDA2MoeModel"
    assert (den.mask_token_id, den.eos_token_id, den.vocab_size) == (310, 300, 320)
    x = torch.tensor([loaded.tokenizer.encode("hello w1 w2")])
    logits, _ = den.core(x, block_size=2)
    assert logits.shape == (1, x.shape[1], 320) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name, cls", [("llada", "LLaDAModel"), ("dream", "DreamModel")])
def test_own_architecture_loads_without_remote_code(tmp_path, name, cls):
    """A checkpoint the framework implements itself loads without trust_remote_code (and decodes)."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.loop import decode
    from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

    loaded = load_model(str(real_format(name, tmp_path / name)), dtype="auto")  # trust_remote_code=False
    den = loaded.denoiser
    assert isinstance(den, OwnArchitectureDenoiser) and loaded.info["own_architecture"] is True
    assert loaded.info["class"] == cls and loaded.info["dtype"] == "torch.float32"
    assert den.mask_token_id == 310 and den.eos_token_id == 300  # from config.json, as the adapters read it
    res = decode(den, [loaded.tokenizer.encode("hello w1")], build_controller("fast_dllm"), DecodeConfig(gen_length=4))
    assert res.generated.shape == (1, 4) and not (res.generated == 310).any()


def test_a_relative_the_framework_does_not_implement_still_needs_trust(tmp_path):
    folder = llada_checkpoint(tmp_path / "tiny-llada")  # model_type llada, class TinyLLaDAModelLM
    with pytest.raises(HubModelError, match="--trust-remote-code"):
        load_model(str(folder))
    loaded = load_model(str(folder), trust_remote_code=True)
    assert loaded.info["own_architecture"] is False and loaded.info["class"] == "TinyLLaDAModelLM"


def test_query_chunk_reaches_the_own_architecture_and_is_refused_elsewhere(tmp_path):
    """``--query-chunk`` sets the own model's chunk (and changes no decision); a remote-code model,
    a model of this project's format and a chunk below 1 are refused naming the option."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.loop import decode

    folder = real_format("llada", tmp_path / "llada")
    plain, chunked = load_model(str(folder)), load_model(str(folder), query_chunk=2)
    assert chunked.denoiser.model.query_chunk == 2 and chunked.info["query_chunk"] == 2
    assert plain.denoiser.model.query_chunk is None
    ids = [plain.tokenizer.encode("hello w1 w2 w3")]
    a, b = (decode(m.denoiser, ids, build_controller("fast_dllm"), DecodeConfig(gen_length=6)) for m in (plain, chunked))
    assert torch.equal(a.generated, b.generated)
    with pytest.raises(HubModelError, match=r"query_chunk=0.*≥ 1"):
        load_model(str(folder), query_chunk=0)
    with pytest.raises(HubModelError, match=r"query_chunk=4.*own LLaDA and Dream.*its own modeling code"):
        load_model(str(llada_checkpoint(tmp_path / "tiny-llada")), trust_remote_code=True, query_chunk=4)
    with pytest.raises(HubModelError, match=r"query_chunk=4.*'tiny-sudoku' is a model of this project's own format"):
        load_model("tiny-sudoku", query_chunk=4)


def test_query_chunk_flag_is_checked_before_any_work(capsys):
    from adaptive_decoding.framework.cli.main import main

    assert main(["decode", "--model", "tiny-sudoku", "--query-chunk", "0", "--prompt", "1"]) != 0
    assert "--query-chunk=0 is out of range; allowed: ≥ 1" in capsys.readouterr().err


def _families():
    name = "_adec_real_format_families"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parents[1] / "fixtures" / "real_format" / "families.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.mark.parametrize("config_fn, kind, cls, block", [("sdar_config", "sdar", "SDARModel", 4),
                                                        ("fast_dllm_v2_config", "fast_dllm_v2", "FastDLLMv2Model", 8),
                                                        ("llada_moe_config", "lladamoe", "LLaDAMoEModel", None)])
def test_the_new_families_load_by_folder_as_their_own_architecture(tmp_path, config_fn, kind, cls, block):
    """SDAR, Fast-dLLM v2 and LLaDA-MoE (released as model_type 'llada': not LLaDA's adapter, whose mask
    id 126336 would be wrong) load through load_model with their own adapter's ids and decode."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.loop import decode
    from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

    fam = _families()
    overrides = {"sdar_config": {"block_size": 4, "mask_token_id": 310},
                 "fast_dllm_v2_config": {"bd_size": 8, "mask_token_id": 310}}.get(config_fn, {})
    cfg = getattr(fam, config_fn)(**overrides)
    folder = fam.build(tmp_path / kind, cfg, seed=1)
    word_tokenizer(folder)
    loaded = load_model(str(folder), dtype="float32")
    den = loaded.denoiser
    assert isinstance(den, OwnArchitectureDenoiser) and type(den.model).__name__ == cls
    assert loaded.info["kind"] == kind and den.mask_token_id == cfg["mask_token_id"]
    assert den.block_size == block
    res = decode(den, [loaded.tokenizer.encode("hello w1")], build_controller("sequential"), DecodeConfig(gen_length=8))
    assert int(res.nfe[0]) == 8 and not (res.generated == den.mask_token_id).any()
