"""Metrics as plugins: exact values on known strings, perplexity under designed and trained causal LMs."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from adaptive_decoding.experiments.metrics import METRICS, MetricContext, MetricUnavailable, build_metric
from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.tasks.text import TextTask, repeated_ngram_rate


def test_exact_match_normalises_whitespace():
    r = build_metric("exact_match").compute(["a b", "  a   b ", "c"], ["a b", "a b", "d"])
    assert r.per_sample == [1.0, 1.0, 0.0]
    assert r.value == pytest.approx(2 / 3)


def test_bleu_exact_on_known_strings():
    bleu = build_metric("bleu")
    # 7 tokens each, one substitution at the end: p1..p4 = 6/7, 5/6, 4/5, 3/4, brevity penalty 1
    hyp, ref = "the cat sat on the mat today", "the cat sat on the mat yesterday"
    expected = (6 / 7 * 5 / 6 * 4 / 5 * 3 / 4) ** 0.25
    r = bleu.compute([hyp], [ref])
    assert r.value == pytest.approx(expected, abs=1e-4)
    assert r.per_sample[0] == pytest.approx(expected, abs=1e-4)
    assert bleu.compute([ref], [ref]).value == pytest.approx(1.0)


def test_rouge_l_exact_on_known_strings():
    # LCS("the cat sat on the mat", "the cat is on the mat") = "the cat on the mat": P = R = 5/6
    r = build_metric("rouge_l").compute(["the cat sat on the mat"], ["the cat is on the mat"])
    assert r.value == pytest.approx(5 / 6)
    assert build_metric("rouge_l").compute(["x y"], ["a b"]).value == 0.0


def test_repetition_counts_repeated_ngrams():
    assert repeated_ngram_rate("the the the the".split(), 2) == pytest.approx(2 / 3)
    assert repeated_ngram_rate("a b c d".split(), 2) == 0.0
    r = build_metric("repetition", n=1).compute(["a a b", "a b c"])
    assert r.per_sample == pytest.approx([1 / 3, 0.0])
    task = TextTask()  # unit=token: n-grams of the tokenizer's tokens (characters here)
    r = build_metric("repetition", n=2, unit="token").compute(["abab"], context=MetricContext(task=task))
    assert r.per_sample == pytest.approx([1 / 3])  # ab, ba, ab
    assert METRICS.get("repetition").higher_is_better is False


class UniformLM(nn.Module):
    """A causal LM whose next-token distribution is uniform: perplexity = vocabulary size."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.w = nn.Parameter(torch.zeros(1))
        self.config = type("C", (), {"max_len": 64})()

    def forward(self, ids, attention_mask=None):
        return torch.zeros(*ids.shape, self.vocab_size) + 0 * self.w


def test_gen_perplexity_of_a_uniform_lm_is_the_vocabulary_size():
    task = TextTask(prompt_length=16, gen_length=16)
    V = task.tokenizer.vocab_size
    ctx = MetricContext(task=task, causal_lm=UniformLM(V))
    ex = task.examples("test", 3)
    r = build_metric("gen_perplexity").compute([e.answer for e in ex], [e.answer for e in ex],
                                               [e.prompt for e in ex], ctx)
    assert r.value == pytest.approx(V, rel=1e-4)
    assert all(p == pytest.approx(V, rel=1e-4) for p in r.per_sample)


def test_gen_perplexity_is_lower_on_in_distribution_text(tmp_path):
    from adaptive_decoding.framework.training.causal_lm import load_causal_lm_folder, train_causal_lm

    torch.set_num_threads(1)
    task = TextTask(prompt_length=16, gen_length=16)
    res = train_causal_lm(task, max_steps=40, out_dir=tmp_path / "lm", wandb_mode="disabled", progress=False,
                          d_model=32, n_layers=1, n_heads=2, d_ff=64, batch_size=64, val_size=0, n_test=0,
                          warmup_steps=5, lr=5e-3, corrupt=0.0)
    lm = load_causal_lm_folder(res.path)
    ctx = MetricContext(task=task, causal_lm=lm)
    ex = task.examples("test", 40)
    chars = task.tokenizer.vocab[4:]
    rng = random.Random(0)
    noise = ["".join(rng.choice(chars) for _ in e.answer) for e in ex]  # random characters, same lengths
    m = build_metric("gen_perplexity")
    real = m.compute([e.answer for e in ex], None, [e.prompt for e in ex], ctx).value
    fake = m.compute(noise, None, [e.prompt for e in ex], ctx).value
    assert math.isfinite(real) and math.isfinite(fake)
    assert real < 0.5 * fake, (real, fake)


def test_unknown_metric_and_bad_params_name_the_choices():
    with pytest.raises(UnknownNameError, match="bleu"):
        build_metric("bluu")
    with pytest.raises(Exception, match="tokenize"):
        build_metric("bleu", tokenize="spaces")


def test_mauve_without_its_package_fails_saying_which():
    if METRICS.get("mauve").available():
        pytest.skip("mauve-text is installed here")
    with pytest.raises(MetricUnavailable, match="mauve-text"):
        build_metric("mauve")


# ---------------------------------------------------------------------- the real-text corpus and task
def test_corpus_splits_by_paragraph_and_tokenizer_round_trips():
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.tasks.text import (
        corpus_stats,
        load_corpus,
        normalise,
        split_of_paragraph,
    )

    paras = load_corpus()
    assert len(paras) > 500 and all(len(p.split()) >= 8 and p == normalise(p) for p in paras)
    stats = corpus_stats()
    assert stats["train"]["characters"] > 100_000 and stats["test"]["paragraphs"] > 20
    task = get_task("text")
    tok = task.tokenizer
    test_paras = [p for p in paras if split_of_paragraph(p) == "test"]
    train_text = " ".join(p for p in paras if split_of_paragraph(p) == "train")
    for ex in task.examples("test", 30):
        para = test_paras[ex.meta["paragraph"]]
        assert para[ex.meta["start"]:].startswith(ex.prompt + ex.answer)  # a window of one test paragraph
        assert ex.prompt + ex.answer not in train_text  # held out: the model never trained on it
        assert ex.meta["start"] == 0 or para[ex.meta["start"] - 1] == " "  # starting at a word
        ids = task.prompt_ids(ex) + task.target_ids(ex)
        assert len(task.prompt_ids(ex)) == task.prompt_length and len(ids) == task.canvas_length
        assert tok.encode(tok.decode(ids, stop_at_eos=False)) == ids
    assert tok.decode(tok.encode('It\'s a "list" (of items).')) == "it's a list (of items)."
    assert tok.encode("a_[EOS]") == [tok.vocab.index("a"), tok.mask_token_id, tok.eos_token_id]
    assert task.score(ex, "is is is is") == pytest.approx(1 / 3) and task.score(ex, "word") == 0.0
    assert task.default_block_length == 8


def test_text_denoiser_trains_with_the_lightning_module_and_decodes(tmp_path):
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import evaluate
    from adaptive_decoding.framework.tasks.text import TextTask
    from adaptive_decoding.framework.training.text_model import load_text_folder, train_text_model

    torch.set_num_threads(1)
    folder = train_text_model(tmp_path / "tiny-text", max_minutes=1.0, max_steps=5, model_size="tiny",
                              progress=False, batch_size=32, n_test=4, val_size=0, warmup_steps=1)
    loaded = load_text_folder(folder)
    assert loaded.task == "text" and loaded.tokenizer.vocab_size == loaded.denoiser.vocab_size
    task = TextTask()
    res = evaluate(loaded, task, build_controller("fast_dllm", threshold=0.9),
                   DecodeConfig(gen_length=task.gen_length), n=4, batch_size=4)
    assert res.n == 4 and all(1 <= s.nfe <= task.gen_length for s in res.samples)
    assert all(isinstance(s.output, str) for s in res.samples)
