"""Measurement helpers: peak memory during a call, medians of repeated timings, tokens per forward
(pooled, as the field counts it, and the per-sample mean).

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the call. On CPU, PyTorch has no
allocator statistics, so a background thread samples the process's resident set size every
``interval`` seconds and reports the peak above the RSS at the start (an approximation that
includes allocator caching; comparisons side by side in one run are what it is good for).

:class:`AllocatedPeak` is exact on any device: it records every allocation and free of PyTorch's
allocator during the block (``torch.profiler`` with ``profile_memory=True``) and replays them, so
it gives the peak of the live bytes above the start, over the whole block and per span between
:meth:`AllocatedPeak.mark` events (one span per step when each forward is marked). It slows the
block down, so time and memory are never measured in the same call.
"""

from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None


def _rss() -> int:
    if psutil is not None:
        return psutil.Process().memory_info().rss
    with open("/proc/self/statm") as fh:  # pragma: no cover
        import os

        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Context manager: ``with PeakMemory(device) as pm: ...``; then ``pm.peak_mb``."""

    def __init__(self, device: torch.device | str = "cpu", interval: float = 0.002) -> None:
        self.device = torch.device(device)
        self.interval = interval
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        self._base = _rss()
        self._peak = self._base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, _rss())
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._peak = max(self._peak, _rss())
        self.peak_mb = max(0.0, (self._peak - self._base) / 2**20)


class AllocatedPeak:
    """``with AllocatedPeak(device) as ap: ...``; then ``ap.peak_mb`` (live bytes above the start,
    at their highest), ``ap.span_peaks_mb`` (for each span from one :meth:`mark` to the next, or to
    the end: the highest live bytes in it above those live when it began) and ``ap.tail_peaks_mb``
    (the same over the span's last part, from a ``mark("tail")`` inside it on; NaN without one: for
    a decoding step, what the loop holds after the forward has returned, its logits included).

    Frees of memory allocated before the block are not seen by the profiler, so all are upper
    bounds (exact when the block frees nothing older than itself).
    """

    MARKS = {"start": "adec::span", "tail": "adec::span_tail"}

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.peak_mb = 0.0
        self.span_peaks_mb: list[float] = []
        self.tail_peaks_mb: list[float] = []
        self._prof: Any = None

    @staticmethod
    def mark(kind: str = "start") -> Any:
        """A context entered where a span starts (``"start"``, e.g. each forward of a decode) or
        where its last part starts (``"tail"``, e.g. when the forward has returned)."""
        return torch.profiler.record_function(AllocatedPeak.MARKS[kind])

    def __enter__(self) -> "AllocatedPeak":
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._prof = profile(activities=activities, profile_memory=True)
        with _quiet_stderr():  # the profiler's native start/stop lines ("USDT: ... profiler_start")
            self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with _quiet_stderr():
            self._prof.__exit__(*exc)
        events = self._prof.profiler.kineto_results.events()
        device = "CUDA" if self.device.type == "cuda" else "CPU"
        kinds = {name: kind for kind, name in self.MARKS.items()}
        allocs = [(e.start_ns(), e.nbytes()) for e in events
                  if e.name() == "[memory]" and e.device_type().name == device]
        marks = [(e.start_ns(), kinds[e.name()]) for e in events if e.name() in kinds]
        self.peak_mb, self.span_peaks_mb, self.tail_peaks_mb = _replay(allocs, marks)


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (native code writes there directly, past ``sys.stderr``)."""
    import os
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (e.g. captured): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _replay(allocs: list[tuple[int, int]], marks: list[tuple[int, str]]
            ) -> tuple[float, list[float], list[float]]:
    """Replay ``allocs`` ``(time, ±bytes)``: the peak live MiB, and per span (``marks``: ``(time,
    "start")`` opens one, ``(time, "tail")`` starts its last part) the peak above the live bytes at
    its start, over the whole span and over its tail (NaN without a tail)."""
    live = peak = 0
    spans: list[float] = []
    tails: list[float] = []
    start = span_peak = tail_peak = None
    events = sorted([(t, 0, kind, 0) for t, kind in marks] + [(t, 1, "", n) for t, n in allocs])

    def close() -> None:
        if start is not None:
            spans.append((span_peak - start) / 2**20)
            tails.append(float("nan") if tail_peak is None else (tail_peak - start) / 2**20)

    for _, _, kind, n in events:
        if kind == "start":
            close()
            start = span_peak = live
            tail_peak = None
        elif kind == "tail":
            tail_peak = live if start is not None else None
        else:
            live += n
            peak = max(peak, live)
            span_peak = max(span_peak, live) if start is not None else None
            tail_peak = max(tail_peak, live) if tail_peak is not None else None
    close()
    return peak / 2**20, spans, tails


def synced_clock(device: "torch.device | str | None" = None) -> float:
    """``time.perf_counter()`` once ``device``'s queued work has finished.

    CUDA kernels run asynchronously: without the synchronisation a forward's time would be the
    time to launch it, and its work would be charged to whatever next waits for the GPU. On CPU
    (or ``None``) it is ``time.perf_counter()`` itself.
    """
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@contextmanager
def timer() -> Iterator[list[float]]:
    """``with timer() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - start)


def tokens_per_forward(answer_tokens: Any, nfe: Any) -> float:
    """Tokens per forward as the field counts it (d3LLM's leaderboard, dInfer): the answer tokens
    summed over the evaluated set divided by the forwards summed over it, ``Σ aᵢ / Σ NFEᵢ``.

    ``answer_tokens``: per sample, the positions of the answer (up to and including the first
    end-of-text, or up to the task's stop string; all G where neither occurs); ``nfe``: per sample,
    the forward passes. Either may be a tensor or a sequence. A set with no forward at all gives 0.
    Unlike the per-sample mean (:func:`tokens_per_forward_mean`) it does not flatter a decoder whose
    forwards vary between samples: it is the tokens one gets for the total cost.
    """
    answers, counts = _paired(answer_tokens, nfe)
    total = float(counts.sum())
    return float(answers.sum()) / total if total > 0 else 0.0


def answer_lengths(generated: torch.Tensor, end_ids: Any) -> torch.Tensor:
    """Per row of ``generated`` ``[B, G]``: the positions of the answer, up to and including the first
    of ``end_ids`` (end-of-text, end-of-turn), or all G where none occurs. Long ``[B]``."""
    G = generated.shape[1]
    ends = torch.as_tensor(list(end_ids), dtype=generated.dtype, device=generated.device)
    if ends.numel() == 0 or G == 0:
        return torch.full((generated.shape[0],), G, dtype=torch.long, device=generated.device)
    is_end = torch.isin(generated, ends)
    first = torch.where(is_end.any(1), is_end.float().argmax(1) + 1, torch.full_like(is_end[:, 0], G,
                                                                                      dtype=torch.long))
    return first.long()


def first_stop(text: str, stops: Sequence[str]) -> int:
    """Where ``text`` ends at its first stop string (lm-eval's ``until``): the index of the earliest
    occurrence of any of ``stops``, or ``len(text)`` where none occurs."""
    return min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))


def answer_length_before_stop(ids: Sequence[int], decode: Callable[[Sequence[int]], str], stops: Sequence[str],
                              end_length: int) -> int:
    """The answer's positions when a stop string ends it: the generated positions whose text lies
    before the first stop (a token that straddles the stop counts), found by bisection over the
    decoded prefixes ``decode(ids[:m])``; ``end_length`` (the positions up to the first end-of-text)
    where no stop occurs in ``decode(ids[:end_length])`` or it would be longer."""
    text = decode(ids[:end_length])
    cut = first_stop(text, stops)
    if cut >= len(text):
        return end_length
    lo, hi = 0, end_length  # the largest m whose decoded prefix fits before the stop
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(decode(ids[:mid])) <= cut:
            lo = mid
        else:
            hi = mid - 1
    straddles = len(decode(ids[:lo])) < cut
    return min(end_length, lo + int(straddles))


def tokens_per_forward_mean(answer_tokens: Any, nfe: Any) -> float:
    """The per-sample mean of ``aᵢ / NFEᵢ`` (an NFE of at least 1): the second, flattering figure that
    some tables print beside :func:`tokens_per_forward` (dInfer's bracketed per-batch mean)."""
    answers, counts = _paired(answer_tokens, nfe)
    return float((answers / counts.clamp(min=1)).mean()) if counts.numel() else 0.0


def _paired(answer_tokens: Any, nfe: Any) -> tuple[torch.Tensor, torch.Tensor]:
    answers = torch.as_tensor(answer_tokens, dtype=torch.float64).reshape(-1)
    counts = torch.as_tensor(nfe, dtype=torch.float64).reshape(-1)
    if answers.shape != counts.shape:
        raise ValueError(f"tokens per forward: {answers.numel()} answer-token counts for {counts.numel()} NFE "
                         "counts; expected one of each per sample")
    return answers, counts
