"""Measurement helpers: peak memory during a call, medians of repeated timings.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the call. On CPU, PyTorch has no
allocator statistics, so a background thread samples the process's resident set size every
``interval`` seconds and reports the peak above the RSS at the start (an approximation that
includes allocator caching; comparisons side by side in one run are what it is good for).
"""

from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager
from typing import Iterator

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
