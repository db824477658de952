"""Evaluate one strategy on one task split: exact-match accuracy and the cost figures.

Cost figures, in order of trust:

* ``nfe``: mean forward passes per sample (exact, hardware-independent; rollouts included),
* ``tpf``: tokens per forward as the field counts it (d3LLM's leaderboard, dInfer): the answers'
  tokens summed over the examples divided by the forwards summed over them
  (:func:`adaptive_decoding.framework.core.measure.tokens_per_forward`); an answer's tokens are its positions up to
  and including the first end-of-text, or up to the task's first stop string
  (:meth:`Task.stop_strings`), all G where neither occurs,
* ``tpf_mean``: the per-sample mean of answer tokens / NFE (flatters decoders whose NFE varies),
* ``ms_per_token``: median over ``repeats`` runs of wall-time / (samples × G),
* ``peak_mem_mb``: peak memory above the start of the run (see :mod:`adaptive_decoding.framework.core.measure`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.measure import (
    PeakMemory,
    answer_length_before_stop,
    median,
    tokens_per_forward,
    tokens_per_forward_mean,
)
from adaptive_decoding.framework.core.rng import stable_seed
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import Controller
from adaptive_decoding.framework.engine.loop import DecodeResult
from adaptive_decoding.framework.engine.reference import decode_with_reference

#: what evaluation needs of a loaded model (adaptive_decoding.framework.models.LoadedModel): ``.denoiser``, ``.tokenizer``
LoadedModel = Any


@dataclass
class SampleResult:
    id: str
    prompt: str
    answer: str
    output: str
    correct: float
    nfe: int
    steps: int
    meta: dict = field(default_factory=dict)
    answer_tokens: Optional[int] = None


@dataclass
class EvalResult:
    task: str
    strategy: str
    n: int
    accuracy: float
    nfe: float
    tpf: float
    ms_per_token: float
    peak_mem_mb: float
    lookahead_nfe: float = 0.0
    forced_steps: float = 0.0
    tpf_mean: float = float("nan")
    extra: dict = field(default_factory=dict)
    samples: list[SampleResult] = field(default_factory=list, repr=False)

    def row(self) -> dict[str, Any]:
        """The summary fields (no per-sample list)."""
        d = asdict(self)
        d.pop("samples")
        return d


def item_seeds(ids: Sequence[str], seed: int) -> torch.Tensor:
    """Per-sample seeds derived from the global seed and each item's id (batching-independent)."""
    return torch.tensor([stable_seed(seed, i) for i in ids], dtype=torch.long)


def decode_texts(
    loaded: LoadedModel, items: Sequence[Any], controller: Controller, config: DecodeConfig,
    *, ids: Optional[Sequence[str]] = None, batch_size: int = 64, lookahead: Any = None, task: Any = None,
) -> tuple[list[str], list[DecodeResult], list[list[int]]]:
    """Decode prompt texts or task examples (``items``) in batches; returns texts, the per-batch results
    and generated ids.

    Every batch is decoded with its :meth:`DecodeContext.for_batch` (the tokenizer, each item's prompt
    text, its meta and ``task``'s spans), so context-reading controllers and the lookahead's text and
    rule scorers see the same context as under ``adec decode``. A controller that needs a reference
    decode (``Controller.reference_param``, the oracle) gets it: each batch is decoded with the
    reference first (not counted in the results)."""
    tok = loaded.tokenizer
    ids = list(ids) if ids is not None else [str(i) for i in range(len(items))]
    texts: list[str] = []
    gen_ids: list[list[int]] = []
    results: list[DecodeResult] = []
    for start in range(0, len(items), batch_size):
        chunk = list(items[start : start + batch_size])
        enc = [tok.encode(item if isinstance(item, str) else item.prompt) for item in chunk]
        context = DecodeContext.for_batch(tok, chunk, task=task, gen_length=config.gen_length)
        seeds = item_seeds(ids[start : start + batch_size], config.seed)
        res = decode_with_reference(loaded.denoiser, enc, controller, config, seeds=seeds, lookahead=lookahead,
                                    context=context)
        results.append(res)
        for row in res.generated.tolist():
            gen_ids.append(row)
            texts.append(tok.decode(row, stop_at_eos=True))
    return texts, results, gen_ids


def evaluate(
    loaded: LoadedModel,
    task: Any,
    controller: Controller,
    config: DecodeConfig,
    *,
    strategy: Optional[str] = None,
    split: str = "test",
    n: int = 200,
    batch_size: int = 64,
    lookahead: Any = None,
    repeats: int = 1,
    data_seed: int = 0,
) -> EvalResult:
    """Decode ``n`` examples of ``task``'s ``split`` and score them exactly.

    With ``repeats > 1`` the whole decode is run again (same seeds, same outputs) and the median
    wall time is reported; accuracy and NFE come from the first run.
    """
    examples = task.examples(split, n, seed=data_seed)
    ids = [ex.id for ex in examples]
    times: list[float] = []
    peak = 0.0
    texts: list[str] = []
    results: list[DecodeResult] = []
    for r in range(max(1, repeats)):
        with PeakMemory(_device_of(loaded)) as pm:
            out_texts, out_results, _ = decode_texts(
                loaded, examples, controller, config, ids=ids, batch_size=batch_size, lookahead=lookahead, task=task,
            )
        times.append(sum(x.total_seconds for x in out_results))
        peak = max(peak, pm.peak_mb)
        if r == 0:
            texts, results = out_texts, out_results
    decoded = Decoded(examples=examples, texts=texts, results=results, seconds=median(times), peak_mb=peak)
    return summarise(task, decoded, config, strategy=strategy or controller.display_name(), lookahead=lookahead,
                     tokenizer=loaded.tokenizer)


@dataclass
class Decoded:
    """What an evaluation decoded: the ``examples``, their ``texts`` (one per example, in order), the
    batches' ``results``, the wall ``seconds`` (the median over repeats) and the peak memory ``peak_mb``."""

    examples: Sequence[Any]
    texts: Sequence[str]
    results: Sequence[DecodeResult]
    seconds: float
    peak_mb: float


def summarise(task: Any, decoded: Decoded, config: DecodeConfig, *, strategy: str, lookahead: Any,
              tokenizer: Any = None) -> EvalResult:
    """The :class:`EvalResult` of the ``decoded`` texts and their batches' results: exact-match
    accuracy, NFE, tokens per forward (pooled and per-sample mean), seconds per token, and the
    ``extra`` figures. ``tokenizer`` decodes prefixes where a task's stop string ends an answer before
    its end-of-text (without one, answers end at end-of-text)."""
    examples, texts, results = decoded.examples, decoded.texts, decoded.results
    seconds, peak_mb = decoded.seconds, decoded.peak_mb
    nfe = torch.cat([x.nfe for x in results]).float()
    steps = torch.cat([x.steps for x in results])
    la = torch.cat([x.lookahead_nfe for x in results]).float()
    forced = torch.cat([x.forced for x in results]).float()
    answers = answer_token_counts(task, examples, results, tokenizer)
    G = config.gen_length
    samples = [SampleResult(id=ex.id, prompt=ex.prompt, answer=ex.answer, output=texts[i],
                            correct=float(task.score(ex, texts[i])), nfe=int(nfe[i]), steps=int(steps[i]),
                            meta=dict(ex.meta), answer_tokens=answers[i])
               for i, ex in enumerate(examples)]
    extra: dict[str, Any] = {}
    fwd = sum(x.forward_seconds for x in results)
    tot = sum(x.total_seconds for x in results)
    extra["loop_overhead_ratio"] = (tot - fwd) / fwd if fwd > 0 else float("nan")
    if lookahead is not None and getattr(lookahead, "escalate", None):
        extra["escalations"] = float(torch.cat([x.escalations for x in results]).float().mean())
    if hasattr(task, "joint_coherence"):
        extra.update(coherence_summary(task, examples, texts))
    return EvalResult(
        task=getattr(task, "name", str(task)), strategy=strategy, n=len(samples),
        accuracy=sum(s.correct for s in samples) / max(1, len(samples)), nfe=float(nfe.mean()),
        tpf=tokens_per_forward(answers, nfe), tpf_mean=tokens_per_forward_mean(answers, nfe),
        ms_per_token=1000.0 * seconds / max(1, len(samples) * G),
        peak_mem_mb=peak_mb, lookahead_nfe=float(la.mean()), forced_steps=float(forced.mean()), extra=extra,
        samples=samples,
    )


def answer_token_counts(task: Any, examples: Sequence[Any], results: Sequence[DecodeResult],
                        tokenizer: Any = None) -> list[int]:
    """Per example, its answer's positions: the decode's ``answer_tokens`` (up to and including the
    first end-of-text), cut before the task's first stop string where one occurs earlier (the
    positions whose text lies before it, :func:`~adaptive_decoding.framework.core.measure.answer_length_before_stop`)."""
    generated = [row for x in results for row in x.generated.tolist()]
    ends = [int(a) for x in results for a in (x.answer_tokens if x.answer_tokens is not None
                                              else [x.generated.shape[1]] * x.generated.shape[0])]
    stops_of = getattr(task, "stop_strings", None)
    if tokenizer is None or stops_of is None:
        return ends
    return [answer_tokens_before(tokenizer, ids, end, stops_of(ex)) for ex, ids, end in zip(examples, generated, ends)]


def answer_tokens_before(tokenizer: Any, ids: Sequence[int], end: int, stops: Sequence[str]) -> int:
    """One answer's positions: ``end`` (to the first end-of-text), or fewer where one of ``stops``
    begins earlier in the text ``tokenizer`` decodes (:func:`~adaptive_decoding.framework.core.measure.answer_length_before_stop`)."""
    if not stops:
        return end
    return answer_length_before_stop(list(ids), lambda p: tokenizer.decode(p, stop_at_eos=False), stops, end)


def coherence_summary(task: Any, examples: Sequence[Any], texts: Sequence[str]) -> dict[str, float]:
    """Fractions of answer slots that are valid phrases and incoherent mixes ("New Francisco")."""
    totals: dict[str, int] = {}
    for ex, text in zip(examples, texts):
        for key, value in task.joint_coherence(ex, text).items():
            totals[key] = totals.get(key, 0) + int(value)
    slots = max(1, totals.get("slots", 0))
    return {"valid_slots": totals.get("valid", 0) / slots, "incoherent_slots": totals.get("incoherent", 0) / slots}


def _device_of(loaded: LoadedModel) -> torch.device:
    from adaptive_decoding.framework.engine.loop import model_device

    return model_device(loaded.denoiser)
