"""Tiny real-format LLaDA and Dream checkpoints with real tokenizers (BERT's WordPiece, a trained
byte-level BPE) load through ``load_model`` and decode text end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from adaptive_decoding.framework import DecodeConfig, decode, load_model
from adaptive_decoding.framework.engine.controller_io import build_controller

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "real_format" / "tokenizers.py"


def fixtures():
    spec = importlib.util.spec_from_file_location("_adec_real_tokenizers", HERE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind,tokenizer", [("llada", "wordpiece"), ("dream", "bpe"), ("llada", "bpe")])
def test_real_tokenizer_checkpoint_decodes_text(tmp_path, kind, tokenizer):
    fx = fixtures()
    build = fx.llada_with_tokenizer if kind == "llada" else fx.dream_with_tokenizer
    folder = build(tmp_path / f"{kind}-{tokenizer}", tokenizer=tokenizer)
    loaded = load_model(str(folder))
    den, tok = loaded.denoiser, loaded.tokenizer
    assert loaded.info["kind"] == kind
    from transformers import AutoTokenizer
    raw = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert den.vocab_size == len(raw) and den.mask_token_id == raw.mask_token_id
    prompts = [tok.encode("Question: What is 12 times 7?"), tok.encode("def add(a, b):")]
    assert all(p and den.mask_token_id not in p for p in prompts)
    res = decode(den, prompts, build_controller("fast_dllm", threshold=0.9),
                 DecodeConfig(gen_length=16, block_length=8))
    assert not (res.generated == den.mask_token_id).any()
    assert all(2 <= int(n) <= 16 for n in res.nfe)  # ≥ 1 forward per block, ≤ one per token
    texts = [tok.decode(row, stop_at_eos=True) for row in res.generated.tolist()]
    assert all(isinstance(t, str) for t in texts)
    eos = den.eos_token_id
    for row, text in zip(res.generated.tolist(), texts):
        if eos in row:  # decoding stops at the first end of text
            assert text == tok.decode(row[: row.index(eos)], stop_at_eos=False)
