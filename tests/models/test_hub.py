"""Hub adapters (adaptive_decoding.framework.models.hub_adapters): tiny models built from configs and saved to tmp_path, loaded back
through load_hub_model and decoded end to end. Nothing is downloaded.

The LLaDA and Dream checkpoints are remote-code folders (config.json with an auto_map to the
designed modeling files in tests/fixtures/hub_*), so the trust_remote_code loading path, LLaDA's
fixed mask id and Dream's logit shift are exercised exactly as with the real checkpoints.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.models.hub_adapters import (
    HUB_ADAPTERS,
    LLADA_MASK_TOKEN_ID,
    DreamDenoiser,
    HubModelError,
    ModelNotCachedError,
)
from adaptive_decoding.framework.models.hub_loading import HFTokenizer, detect_kind, load_hub_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WORDS = [f"w{i}" for i in range(8)]  # ids 4..11: the designed models' answers
VOCAB = ["[PAD]", "[UNK]", "[EOS]", "[MASK]", *WORDS, "hello", "world", "user", "assistant"]
WORD_OFFSET, N_WORDS = 4, 8


def word_tokenizer(folder: Path, *, mask: bool = True, chat_template: str | None = None):
    """A word-level fast tokenizer over VOCAB, saved into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "eos_token": "[EOS]"}
    if mask:
        specials["mask_token"] = "[MASK]"
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **specials)
    if chat_template:
        tok.chat_template = chat_template
    tok.save_pretrained(folder)
    return tok


def remote_code_folder(folder: Path, fixture: str, module: str, config_cls: str, model_cls: str,
                       model_type: str, **config) -> Path:
    """Save a designed fixture model as a trust_remote_code checkpoint (config.json + auto_map)."""
    src = FIXTURES / fixture / f"{module}.py"
    spec = importlib.util.spec_from_file_location(f"_fixture_{module}", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = getattr(mod, model_cls)(getattr(mod, config_cls)(**config))
    model.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type=model_type, architectures=[model_cls],
               auto_map={"AutoConfig": f"{module}.{config_cls}", "AutoModel": f"{module}.{model_cls}"})
    (folder / "config.json").write_text(json.dumps(cfg))
    shutil.copy(src, folder / src.name)
    return folder


def llada_folder(tmp_path: Path, **config) -> Path:
    folder = remote_code_folder(tmp_path / "tiny-llada", "hub_llada", "modeling_tiny_llada",
                                "TinyLLaDAConfig", "TinyLLaDAModelLM", "llada", **config)
    word_tokenizer(folder, mask=False)  # LLaDA's tokenizer does not name its mask token
    return folder


def dream_folder(tmp_path: Path) -> Path:
    folder = remote_code_folder(tmp_path / "tiny-dream", "hub_dream", "modeling_tiny_dream",
                                "TinyDreamConfig", "TinyDreamModel", "Dream", vocab_size=len(VOCAB), mask_token_id=3)
    word_tokenizer(folder)
    return folder


def designed_answer(prompt: list[int], gen_length: int) -> list[int]:
    """What both designed models must produce: position i of a row starting with a -> w[(a+i) % 8]."""
    a, n = prompt[0], len(prompt)
    return [WORD_OFFSET + (a + n + j) % N_WORDS for j in range(gen_length)]


def check_invariants(res, prompts: list[list[int]], mask_id: int, gen_length: int) -> None:
    assert res.generated.shape == (len(prompts), gen_length)
    for b, p in enumerate(prompts):
        assert res.tokens[b, : len(p)].tolist() == p, "a prompt token was rewritten"
    assert not (res.generated == mask_id).any(), "a generated position is still masked"


# ----------------------------------------------------------------------------- masked LM (BERT)
@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory) -> Path:
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "hello", "world"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer.from_pretrained(str(folder), local_files_only=True).save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(cfg).save_pretrained(folder)
    return folder


def test_masked_lm_loads_by_detection_and_decodes_end_to_end(bert_folder):
    loaded = load_hub_model(str(bert_folder))
    den, tok = loaded.denoiser, loaded.tokenizer
    assert loaded.info["kind"] == "masked_lm" and loaded.info["class"] == "BertForMaskedLM"
    assert den.mask_token_id == tok.mask_token_id == 4 and den.vocab_size == 15
    assert den.eos_token_id == 3  # BERT has no EOS: [SEP] ends the text
    prompts = [tok.encode("hello world w1"), tok.encode("world")]
    assert prompts[1] == [2, 14, 3]  # [CLS] world [SEP]
    # threshold > 1: exactly one token per step -> NFE = G
    res = decode(den, prompts, build_controller("fast_dllm", threshold=1.5), DecodeConfig(gen_length=6))
    check_invariants(res, prompts, den.mask_token_id, 6)
    assert res.nfe.tolist() == [6, 6]
    # LLaDA with 3 steps over one block of 6: exactly 3 forward passes, 2 tokens each
    res = decode(den, prompts, build_controller("llada", steps=3), DecodeConfig(gen_length=6), trace=True)
    check_invariants(res, prompts, den.mask_token_id, 6)
    assert res.nfe.tolist() == [3, 3]
    assert [r["commits"].tolist() for r in res.trace] == [[2, 2]] * 3
    assert isinstance(tok.decode(res.generated[0]), str)


def test_masked_lm_batch_equals_single_runs(bert_folder):
    """Right padding + attention mask: a row's output never depends on the other rows."""
    loaded = load_hub_model(str(bert_folder))
    den, tok = loaded.denoiser, loaded.tokenizer
    prompts = [tok.encode("hello world w1 w2 w3"), tok.encode("w5")]
    ctrl, cfg = build_controller("llada", steps=4), DecodeConfig(gen_length=8, block_length=4)
    batch = decode(den, prompts, ctrl, cfg)
    for b, p in enumerate(prompts):
        single = decode(den, [p], ctrl, cfg)
        assert single.generated[0].tolist() == batch.generated[b].tolist()
        assert int(single.nfe[0]) == int(batch.nfe[b]) == 4


# ----------------------------------------------------------------------------- LLaDA (remote code)
def test_llada_remote_code_fixed_mask_id_and_designed_answer(tmp_path):
    folder = llada_folder(tmp_path, vocab_size=126464)  # LLaDA-8B's vocabulary; no mask id in config
    loaded = load_hub_model(str(folder))
    den, tok = loaded.denoiser, loaded.tokenizer
    assert loaded.info["kind"] == "llada" and loaded.info["class"] == "TinyLLaDAModelLM"
    assert den.mask_token_id == tok.mask_token_id == LLADA_MASK_TOKEN_ID == 126336
    assert den.vocab_size == 126464
    prompts = [tok.encode("w3 hello world"), tok.encode("w6")]  # ragged: exercises the [B, L] mask
    cfg = DecodeConfig(gen_length=8, block_length=4)
    for name, params, nfe in [("llada", {"steps": 4}, 4), ("fast_dllm", {"threshold": 0.9}, 2)]:
        res = decode(den, prompts, build_controller(name, **params), cfg)
        check_invariants(res, prompts, LLADA_MASK_TOKEN_ID, 8)
        assert res.nfe.tolist() == [nfe, nfe]  # all confident: Fast-dLLM takes a block per step
        assert [res.generated[b].tolist() for b in range(2)] == [designed_answer(p, 8) for p in prompts]
    assert tok.decode(res.generated[1]) == " ".join(VOCAB[i] for i in designed_answer(prompts[1], 8))


def test_llada_mask_id_from_config_wins(tmp_path):
    loaded = load_hub_model(str(llada_folder(tmp_path, vocab_size=len(VOCAB), mask_token_id=3)), kind="llada")
    assert loaded.denoiser.mask_token_id == loaded.tokenizer.mask_token_id == 3
    prompts = [loaded.tokenizer.encode("w2 w0")]
    res = decode(loaded.denoiser, prompts, build_controller("sequential"), DecodeConfig(gen_length=4))
    assert res.generated[0].tolist() == designed_answer(prompts[0], 4) and res.nfe.tolist() == [4]


def test_adapter_never_predicts_the_mask_token(tmp_path):
    """A checkpoint whose mask id is one of its designed answers (w0 = 4): the adapter suppresses it."""
    loaded = load_hub_model(str(llada_folder(tmp_path, vocab_size=len(VOCAB), mask_token_id=4)))
    den = loaded.denoiser
    x = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 11, 12]])  # first token 4: position 4 predicts w0 = 4
    assert (den.model(x).logits.argmax(-1) == 4).nonzero()[:, 1].tolist() == [4]
    assert not (den(x).argmax(-1) == 4).any()


# ----------------------------------------------------------------------------- Dream (remote code)
def test_dream_shifted_logits_are_needed_for_the_designed_answer(tmp_path):
    loaded = load_hub_model(str(dream_folder(tmp_path)))
    den, tok = loaded.denoiser, loaded.tokenizer
    assert isinstance(den, DreamDenoiser) and loaded.info["kind"] == "dream"
    assert den.mask_token_id == tok.mask_token_id == 3  # from config.json (and its tokenizer)
    prompts = [tok.encode("w1 hello"), tok.encode("w4 world w2 w7")]  # ragged: 4-D mask + tok_idx path
    cfg = DecodeConfig(gen_length=6)
    res = decode(den, prompts, build_controller("dream_confidence", steps=6), cfg)
    check_invariants(res, prompts, 3, 6)
    assert [res.generated[b].tolist() for b in range(2)] == [designed_answer(p, 6) for p in prompts]
    single = decode(den, prompts[:1], build_controller("fast_dllm"), cfg)  # no padding: "full" path
    assert single.generated[0].tolist() == designed_answer(prompts[0], 6) and single.nfe.tolist() == [1]
    # the same checkpoint without Dream's shift reads hidden state i as position i: off by one
    unshifted = DreamDenoiser(den.model, shift_logits=False, mask_token_id=3, vocab_size=den.vocab_size,
                              eos_token_id=den.eos_token_id, pad_token_id=den.pad_token_id)
    wrong = decode(unshifted, prompts[:1], build_controller("fast_dllm"), cfg)
    a, n = prompts[0][0], len(prompts[0])
    assert wrong.generated[0].tolist() == [WORD_OFFSET + (a + n + j + 1) % N_WORDS for j in range(6)]
    assert wrong.generated[0].tolist() != designed_answer(prompts[0], 6)


def test_remote_code_needs_trust(tmp_path):
    with pytest.raises(HubModelError, match="trust_remote_code=True"):
        load_hub_model(str(dream_folder(tmp_path)), trust_remote_code=False)


# ----------------------------------------------------------------------------- DiffusionGemma
def test_diffusion_gemma_canvas_adapter(tmp_path):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    folder = tmp_path / "tiny-diffusion-gemma"
    text = dict(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
                max_position_embeddings=64, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                num_experts=2, top_k_experts=1, moe_intermediate_size=16,
                pad_token_id=0, eos_token_id=2, bos_token_id=1)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, position_embedding_size=64, patch_size=4)
    cfg = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=6,
                               boi_token_id=13, eoi_token_id=14, image_token_id=15)
    torch.manual_seed(0)
    DiffusionGemmaForBlockDiffusion(cfg).save_pretrained(folder)
    word_tokenizer(folder, mask=False)
    loaded = load_hub_model(str(folder))
    den, tok = loaded.denoiser, loaded.tokenizer
    assert loaded.info["kind"] == "diffusion_gemma" and den.canvas_length == 6
    assert den.mask_token_id == den.vocab_size == len(VOCAB)  # out-of-vocabulary sentinel
    prompts = [tok.encode("hello world w1"), tok.encode("w4 w5 w6 w7 w0")]
    ctrl, dcfg = build_controller("fast_dllm", threshold=0.5), DecodeConfig(gen_length=6)
    res = decode(den, prompts, ctrl, dcfg)
    check_invariants(res, prompts, den.mask_token_id, 6)
    assert bool((res.generated < den.vocab_size).all()) and bool((res.nfe <= 6).all())
    for b, p in enumerate(prompts):  # re-noising is drawn from each row's own tokens
        single = decode(den, [p], ctrl, dcfg)
        assert single.generated[0].tolist() == res.generated[b].tolist()
    with pytest.raises(HubModelError, match="gen_length=6"):
        decode(den, prompts, ctrl, DecodeConfig(gen_length=12, block_length=6))


# ----------------------------------------------------------------------------- selection and errors
@pytest.mark.parametrize("config, kind", [
    ({"model_type": "bert", "architectures": ["BertForMaskedLM"]}, "masked_lm"),
    ({"model_type": "roberta"}, "masked_lm"),
    ({"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"]}, "masked_lm"),
    ({"model_type": "llada", "architectures": ["LLaDAModelLM"],
      "auto_map": {"AutoModel": "modeling_llada.LLaDAModelLM"}}, "llada"),
    ({"model_type": "Dream", "architectures": ["DreamModel"]}, "dream"),
    ({"model_type": "diffusion_gemma", "architectures": ["DiffusionGemmaForBlockDiffusion"]}, "diffusion_gemma"),
])
def test_detect_kind(config, kind):
    assert detect_kind(config) == kind


def test_selection_errors_name_the_choices(tmp_path):
    with pytest.raises(HubModelError, match="model_type='gpt2'.*masked_lm"):
        detect_kind({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(UnknownNameError, match="dream"):
        HUB_ADAPTERS.get("dreamm")
    with pytest.raises(HubModelError, match="not a folder"):
        load_hub_model(str(tmp_path / "no" / "such" / "model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(HubModelError, match="no config.json"):
        load_hub_model(str(tmp_path / "empty"))


def test_uncached_hub_name_fails_with_how_to_download():
    name = "adaptive-decoding-tests/not-a-cached-model"
    with pytest.raises(ModelNotCachedError, match=f"huggingface-cli download {name}"):
        load_hub_model(name)


# ----------------------------------------------------------------------------- tokenizer wrapper
def test_hf_tokenizer_stop_at_eos_and_chat_template(tmp_path):
    template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}assistant{% endif %}")
    raw = word_tokenizer(tmp_path, chat_template=template)
    tok = HFTokenizer(raw, mask_token_id=3, eos_token_id=2, pad_token_id=0, chat=True)
    assert tok.encode("hello w1") == [VOCAB.index(w) for w in ("user", "hello", "w1", "assistant")]
    plain = HFTokenizer(raw, mask_token_id=3, eos_token_id=2)
    assert plain.encode("hello w1") == [12, 5] and plain.vocab_size == len(VOCAB)
    ids = [4, 5, 2, 6, 3, 99]  # w0 w1 [EOS] w2 [MASK] out-of-vocabulary
    assert plain.decode(ids) == "w0 w1"
    assert plain.decode(torch.tensor(ids), stop_at_eos=False) == "w0 w1 w2"
    with pytest.raises(HubModelError, match="no chat template"):
        HFTokenizer(word_tokenizer(tmp_path / "nochat"), mask_token_id=3, chat=True)


def test_load_hub_model_chat_flag(tmp_path):
    loaded = load_hub_model(str(dream_folder(tmp_path)), chat=False)
    assert loaded.tokenizer.chat is False and loaded.tokenizer.encode("w1") == [5]
