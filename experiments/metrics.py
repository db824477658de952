"""Quality metrics as plugins (``METRICS`` registry; third parties add theirs by entry point).

A metric is a :class:`Metric` (validated keyword parameters, like controllers and scorers) with
one method, ``compute(outputs, references, prompts, context) -> MetricResult``: a corpus-level
``value`` and, where it has one, a per-sample list (written into each cell's JSONL).

Built-ins:

* ``exact_match``     fraction of outputs equal to the reference (whitespace-normalised);
* ``bleu``            corpus BLEU of sacrebleu (Papineni et al. 2002), divided by 100 -> [0, 1];
* ``rouge_l``         mean ROUGE-L F-measure of rouge-score (Lin 2004): LCS-based, in [0, 1];
* ``gen_perplexity``  generative perplexity ``exp(−Σ log q(x_i | x_<i) / N)`` of the continuations
  (given their prompts) under a separately trained small causal LM q (``adaptive_decoding.framework.training.causal_lm``,
  trained on the task's train split: "Gen PPL" of MDLM / SEDD, with a tiny judge instead of GPT-2);
* ``repetition``      mean fraction of repeated n-grams of each continuation (lower is better);
* ``mauve``           MAUVE (Pillutla et al. 2021) of MiniLM embeddings, only where the optional
  ``mauve-text`` package is installed (otherwise it fails at validation, saying so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import Configurable, Param, ParameterError
from adaptive_decoding.framework.core.registry import Registry


class MetricUnavailable(ParameterError):
    """A metric whose optional dependency is not installed (the message names the package)."""


@dataclass
class MetricResult:
    value: float
    per_sample: Optional[list[float]] = None


@dataclass
class MetricContext:
    """What a metric may need besides the texts: the task (its tokenizer and name), the device, and
    optionally a ready causal LM (``causal_lm``) for ``gen_perplexity`` instead of the cached one."""

    task: Any = None
    device: str = "cpu"
    causal_lm: Any = None
    extras: dict = field(default_factory=dict)


class Metric(Configurable):
    """Base of every metric. ``higher_is_better`` orients plots and Pareto fronts."""

    higher_is_better: ClassVar[bool] = True
    needs_reference: ClassVar[bool] = False
    #: the optional package a metric needs (``None``: always available)
    requires: ClassVar[Optional[str]] = None

    @classmethod
    def available(cls) -> bool:
        return True

    def check_combination(self) -> None:
        if not self.available():
            raise MetricUnavailable(f"metric {self.display_name()!r} needs the optional package "
                                    f"{self.requires!r} (pip install {self.requires}); it is not installed")

    def compute(self, outputs: Sequence[str], references: Optional[Sequence[str]] = None,
                prompts: Optional[Sequence[str]] = None,
                context: Optional[MetricContext] = None) -> MetricResult:
        if self.needs_reference and (references is None or len(references) != len(outputs)):
            raise ValueError(f"metric {self.display_name()} needs one reference per output")
        return self._compute(list(outputs), list(references or []), list(prompts or []),
                             context or MetricContext())

    def _compute(self, outputs: list[str], references: list[str], prompts: list[str],
                 context: MetricContext) -> MetricResult:  # pragma: no cover
        raise NotImplementedError


METRICS: Registry[Metric] = Registry("metric", base=Metric, entry_point_group="adaptive_decoding.metrics")


def build_metric(name: str, **params: Any) -> Metric:
    """A validated metric by registered name (unknown names list the known ones)."""
    return METRICS.get(name).build(**params)  # type: ignore[return-value]


def _mean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def _norm(text: str) -> str:
    return " ".join(text.split())


def _tokens(text: str, context: MetricContext) -> list[str]:
    task = context.task
    tok = getattr(task, "tokenizer", None)
    if tok is not None and hasattr(tok, "encode"):
        try:
            return [str(i) for i in tok.encode(text)]
        except ValueError:
            pass
    return text.split()


@METRICS.register("exact_match", aliases=("em",))
class ExactMatch(Metric):
    """Fraction of outputs exactly equal to the reference (whitespace-normalised)."""

    needs_reference = True

    def _compute(self, outputs, references, prompts, context) -> MetricResult:
        per = [float(_norm(o) == _norm(r)) for o, r in zip(outputs, references)]
        return MetricResult(_mean(per) if per else float("nan"), per)


@METRICS.register("bleu", aliases=("sacrebleu",))
class BLEU(Metric):
    """Corpus BLEU (sacrebleu) / 100, in [0, 1]; per sample: sentence BLEU with effective order."""

    needs_reference = True
    requires = "sacrebleu"
    params = {
        "tokenize": Param(str, choices=("13a", "none", "char", "intl"), doc="sacrebleu tokenizer"),
        "lowercase": Param(bool, doc="case-insensitive BLEU"),
    }

    def __init__(self, tokenize: str = "13a", lowercase: bool = False) -> None:
        self.tokenize = tokenize
        self.lowercase = lowercase

    @classmethod
    def available(cls) -> bool:
        import importlib.util

        return importlib.util.find_spec("sacrebleu") is not None

    def _compute(self, outputs, references, prompts, context) -> MetricResult:
        import sacrebleu

        if not outputs:
            return MetricResult(float("nan"), [])
        corpus = sacrebleu.corpus_bleu(outputs, [references], tokenize=self.tokenize,
                                       lowercase=self.lowercase)
        per = [sacrebleu.sentence_bleu(o, [r], tokenize=self.tokenize, lowercase=self.lowercase,
                                       use_effective_order=True).score / 100.0 for o, r in zip(outputs,
                                                                                               references)]
        return MetricResult(corpus.score / 100.0, per)


@METRICS.register("rouge_l", aliases=("rougeL",))
class RougeL(Metric):
    """Mean ROUGE-L F-measure (rouge-score; longest common subsequence), in [0, 1]."""

    needs_reference = True
    requires = "rouge-score"
    params = {"use_stemmer": Param(bool, doc="Porter-stem words before matching")}

    def __init__(self, use_stemmer: bool = False) -> None:
        self.use_stemmer = use_stemmer

    @classmethod
    def available(cls) -> bool:
        import importlib.util

        return importlib.util.find_spec("rouge_score") is not None

    def _compute(self, outputs, references, prompts, context) -> MetricResult:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=self.use_stemmer)
        per = [scorer.score(r, o)["rougeL"].fmeasure for o, r in zip(outputs, references)]
        return MetricResult(_mean(per), per)


@METRICS.register("repetition", aliases=("repeated_ngrams",))
class Repetition(Metric):
    """Mean fraction of repeated word (or token) n-grams per continuation, in [0, 1] (lower is better)."""

    higher_is_better = False
    params = {
        "n": Param(int, low=1, high=8, doc="n-gram order"),
        "unit": Param(str, choices=("word", "token"),
                      doc="n-grams of words (whitespace) or of tokenizer tokens"),
    }

    def __init__(self, n: int = 2, unit: str = "word") -> None:
        self.n = n
        self.unit = unit

    def _compute(self, outputs, references, prompts, context) -> MetricResult:
        from adaptive_decoding.framework.tasks.text import repeated_ngram_rate

        split = (lambda o: o.split()) if self.unit == "word" else (lambda o: _tokens(o,
                                                                                     context))  # noqa: E731
        per = [repeated_ngram_rate(split(o), self.n) for o in outputs]
        return MetricResult(_mean(per), per)


@METRICS.register("gen_perplexity", aliases=("gen_ppl",))
class GenPerplexity(Metric):
    """Perplexity of the continuations under a small causal LM trained on the task (lower is better).

    ``exp(−Σ_samples Σ_i log q(y_i | prompt, y_<i) / Σ_samples |y|)`` over the generated tokens y
    (up to the first EOS), token-weighted over the corpus; per sample its own perplexity. With
    ``include_eos`` the EOS that ends a continuation shorter than the slot is scored too (so that
    stopping early is not free). Samples with no token are skipped.
    """

    higher_is_better = False
    params = {
        "lm": Param(str, nullable=True, doc="task whose causal LM judges (null = the evaluated task)"),
        "include_eos": Param(bool, doc="also score the EOS that ends a short continuation"),
    }

    def __init__(self, lm: Optional[str] = None, include_eos: bool = True) -> None:
        self.lm = lm
        self.include_eos = include_eos

    def _judge(self, context: MetricContext) -> Any:
        if context.causal_lm is not None:
            return context.causal_lm
        from adaptive_decoding.framework.training.causal_lm import load_causal_lm

        name = self.lm or getattr(context.task, "name", None)
        if not name:
            raise ValueError("gen_perplexity needs a task (or lm=TASK) to pick its causal LM")
        return load_causal_lm(name, device=context.device)

    @torch.no_grad()
    def _compute(self, outputs, references, prompts, context) -> MetricResult:
        from adaptive_decoding.framework.training.causal_lm import token_logprobs

        if context.task is None:
            raise ValueError("gen_perplexity needs the task (its tokenizer) in the metric context")
        tok = context.task.tokenizer
        lm = self._judge(context)
        if getattr(lm, "vocab_size", tok.vocab_size) != tok.vocab_size:
            raise ValueError(f"gen_perplexity: the causal LM has {lm.vocab_size} tokens, the task's "
                             f"tokenizer {tok.vocab_size}; retrain it (move its folder under the model "
                             f"cache away)")
        max_len = int(getattr(getattr(lm, "config", None), "max_len", 10**9))
        dev = next(lm.parameters()).device
        per: list[float] = []
        tot_nll, tot_n = 0.0, 0
        gen_length = getattr(context.task, "gen_length", None)
        for i, out in enumerate(outputs):
            p = tok.encode(prompts[i]) if i < len(prompts) else []
            y = tok.encode(out)
            if self.include_eos and tok.eos_token_id is not None and (gen_length is None
                                                                      or len(y) < gen_length):
                y = y + [tok.eos_token_id]
            ids = (p + y)[:max_len]
            n_y = len(ids) - len(p)
            if n_y <= 0 or len(ids) < 2:
                per.append(float("nan"))
                continue
            lp = token_logprobs(lm, torch.tensor([ids], device=dev))[0, len(p):]
            if len(p) == 0:
                lp = lp[1:]  # the first token has no context
                n_y -= 1
                if n_y <= 0:
                    per.append(float("nan"))
                    continue
            nll = -float(lp.sum())
            per.append(math.exp(nll / n_y))
            tot_nll += nll
            tot_n += n_y
        return MetricResult(math.exp(tot_nll / tot_n) if tot_n else float("nan"), per)


@METRICS.register("mauve")
class Mauve(Metric):
    """MAUVE between outputs and references on MiniLM embeddings (needs ``mauve-text``)."""

    needs_reference = True
    requires = "mauve-text"
    params = {"num_buckets": Param(int, low=2, nullable=True, doc="k-means clusters (null = auto)")}

    def __init__(self, num_buckets: Optional[int] = None) -> None:
        self.num_buckets = num_buckets

    @classmethod
    def available(cls) -> bool:
        import importlib.util

        return importlib.util.find_spec("mauve") is not None

    def _compute(self, outputs, references, prompts, context) -> MetricResult:  # pragma: no cover - optional
        import mauve

        from adaptive_decoding.scorers.consistency import load_minilm

        model = load_minilm(context.device)
        p = model.encode(references, convert_to_numpy=True, normalize_embeddings=True)
        q = model.encode(outputs, convert_to_numpy=True, normalize_embeddings=True)
        kw = {"num_buckets": self.num_buckets} if self.num_buckets else {}
        out = mauve.compute_mauve(p_features=p, q_features=q, verbose=False, **kw)
        return MetricResult(float(out.mauve), None)


def compute_metrics(specs: Sequence[tuple[str, dict]], outputs: Sequence[str], references: Sequence[str],
                    prompts: Sequence[str], context: MetricContext) -> dict[str, MetricResult]:
    """Every ``(name, params)`` metric on the same texts, keyed by name."""
    return {name: build_metric(name, **params).compute(outputs, references, prompts, context)
            for name, params in specs}
