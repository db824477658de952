"""Measurement helpers: peak memory during a call, medians of repeated timings.

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
from typing import Any, Iterator

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
    at their highest) and ``ap.span_peaks_mb`` (for each span from one :meth:`mark` to the next, or
    to the end: the highest live bytes in it above those live when it began).

    Frees of memory allocated before the block are not seen by the profiler, so both are upper
    bounds (exact when the block frees nothing older than itself).
    """

    MARK = "adec::span"

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.peak_mb = 0.0
        self.span_peaks_mb: list[float] = []
        self._prof: Any = None

    @staticmethod
    def mark() -> Any:
        """A context to wrap around what starts a span (e.g. each forward of a decode)."""
        return torch.profiler.record_function(AllocatedPeak.MARK)

    def __enter__(self) -> "AllocatedPeak":
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._prof = profile(activities=activities, profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prof.__exit__(*exc)
        events = self._prof.profiler.kineto_results.events()
        kind = "CUDA" if self.device.type == "cuda" else "CPU"
        allocs = sorted((e.start_ns(), e.nbytes()) for e in events
                        if e.name() == "[memory]" and e.device_type().name == kind)
        marks = sorted(e.start_ns() for e in events if e.name() == self.MARK)
        self.peak_mb, self.span_peaks_mb = _replay(allocs, marks)


def _replay(allocs: list[tuple[int, int]], marks: list[int]) -> tuple[float, list[float]]:
    """Peak live MiB over ``allocs`` ``(time, ±bytes)`` and per span starting at each of ``marks``."""
    live = peak = 0
    spans: list[float] = []
    i, start, span_peak = 0, None, 0
    for t, n in allocs + [(float("inf"), 0)]:
        while i < len(marks) and marks[i] <= t:  # a new span begins before this event
            if start is not None:
                spans.append(span_peak - start)
            start = span_peak = live
            i += 1
        live += n
        peak = max(peak, live)
        if start is not None:
            span_peak = max(span_peak, live)
    if start is not None:
        spans.append(span_peak - start)
    return peak / 2**20, [b / 2**20 for b in spans]


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
