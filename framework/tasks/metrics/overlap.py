"""Graded n-gram overlap with the answer: ``bleu`` (sacrebleu) and ``rouge`` (rouge-score)."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics.base import METRICS, Metric


@METRICS.register("bleu")
class SentenceBLEU(Metric):
    """Sentence BLEU of sacrebleu (Papineni et al. 2002) against the answer, divided by 100."""

    figures = ("bleu",)
    requires = ("sacrebleu",)
    params: ClassVar[dict[str, Param]] = {
        "tokenize": Param(str, choices=("13a", "intl", "char", "none", "zh"), doc="sacrebleu tokenizer"),
        "lowercase": Param(bool, doc="lower-case both sides first"),
    }

    def __init__(self, tokenize: str = "13a", lowercase: bool = False) -> None:
        self.tokenize = tokenize
        self.lowercase = lowercase

    def score(self, output: str, example: Example) -> float:
        import sacrebleu

        bleu = sacrebleu.sentence_bleu(output, [example.answer], tokenize=self.tokenize, lowercase=self.lowercase)
        return bleu.score / 100.0


@functools.lru_cache(maxsize=16)
def rouge_scorer(rouge_type: str, use_stemmer: bool) -> Any:
    """One cached ``rouge_score.rouge_scorer.RougeScorer`` per (type, stemmer)."""
    from rouge_score import rouge_scorer as rs

    return rs.RougeScorer([rouge_type], use_stemmer=use_stemmer)


@METRICS.register("rouge")
class Rouge(Metric):
    """ROUGE of rouge-score (Lin 2004) against the answer: ROUGE-L F-measure by default."""

    figures = ("rouge",)
    requires = ("rouge_score",)
    params: ClassVar[dict[str, Param]] = {
        "type": Param(str, choices=("rougeL", "rouge1", "rouge2", "rougeLsum"), doc="which ROUGE"),
        "measure": Param(str, choices=("fmeasure", "precision", "recall"), doc="which side of it"),
        "use_stemmer": Param(bool, doc="Porter-stem words before matching"),
    }

    def __init__(self, type: str = "rougeL", measure: str = "fmeasure", use_stemmer: bool = False) -> None:
        self.type = type
        self.measure = measure
        self.use_stemmer = use_stemmer

    def score(self, output: str, example: Example) -> float:
        result = rouge_scorer(self.type, self.use_stemmer).score(example.answer, output)[self.type]
        return float(getattr(result, self.measure))
