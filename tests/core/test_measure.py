"""adaptive_decoding.framework.core.measure: the allocator replay gives exact peaks on a designed sequence of
allocations, overall and per marked span (the profile's per-step memory rests on it)."""

from __future__ import annotations

import math

import pytest
import torch

from adaptive_decoding.framework.core.measure import AllocatedPeak, _replay, synced_clock

MIB = 2**20


def test_replay_of_a_designed_sequence():
    # alloc 4 @1, span @2, alloc 8 @3, tail @3.5, free 8 @4, span @5, alloc 2 @6, free 2 @7, free 4 @8
    allocs = [(1, 4 * MIB), (3, 8 * MIB), (4, -8 * MIB), (6, 2 * MIB), (7, -2 * MIB), (8, -4 * MIB)]
    peak, spans, tails = _replay(allocs, [(2, "start"), (3.5, "tail"), (5, "start")])
    assert peak == 12 and spans == [8, 2]  # span 1 starts with 4 live, peaks at 12; span 2 at 4 -> 6
    assert tails[0] == 8 and math.isnan(tails[1])  # the tail began with 12 live (8 above the start)
    assert _replay(allocs, [])[:2] == (12, [])
    assert _replay(allocs, [(2, "start"), (4.5, "tail")])[2] == [2]  # after the free: 4 live, then 6


def test_allocated_peak_on_the_cpu_allocator():
    with AllocatedPeak("cpu") as ap:
        with ap.mark():
            kept = torch.empty(4 * MIB, dtype=torch.uint8)
        tmp = torch.empty(8 * MIB, dtype=torch.uint8)
        del tmp
        with ap.mark():
            tmp = torch.empty(2 * MIB, dtype=torch.uint8)
        with ap.mark("tail"):
            pass
        del tmp
        late = torch.empty(1 * MIB, dtype=torch.uint8)  # in the tail, after the 2 MiB were freed
    assert ap.peak_mb == pytest.approx(12, abs=0.01)
    assert ap.span_peaks_mb == pytest.approx([12, 2], abs=0.01)
    assert math.isnan(ap.tail_peaks_mb[0]) and ap.tail_peaks_mb[1] == pytest.approx(2, abs=0.01)
    assert kept.numel() == 4 * MIB and late.numel() == MIB


def test_the_synced_clock_waits_for_a_cuda_device_and_never_for_the_cpu(monkeypatch):
    """A CUDA forward's time is its run, not its launch: the clock synchronises that device first."""
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(str(device)))
    a = synced_clock("cpu")
    b = synced_clock(None)
    assert waited == [] and b >= a
    synced_clock("cuda:1")
    synced_clock(torch.device("cuda", 0))
    assert waited == ["cuda:1", "cuda:0"]
