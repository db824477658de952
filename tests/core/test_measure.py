"""framework.core.measure: the allocator replay gives exact peaks on a designed sequence of
allocations, overall and per marked span (the profile's per-step memory rests on it)."""

from __future__ import annotations

import pytest
import torch

from framework.core.measure import AllocatedPeak, _replay

MIB = 2**20


def test_replay_of_a_designed_sequence():
    # times: alloc 4 @1, mark @2, alloc 8 @3, free 8 @4, mark @5, alloc 2 @6, free 2 @7, free 4 @8
    allocs = [(1, 4 * MIB), (3, 8 * MIB), (4, -8 * MIB), (6, 2 * MIB), (7, -2 * MIB), (8, -4 * MIB)]
    peak, spans = _replay(allocs, [2, 5])
    assert peak == 12 and spans == [8, 2]  # span 1 starts with 4 live, peaks at 12; span 2 at 4 -> 6
    assert _replay(allocs, []) == (12, [])


def test_allocated_peak_on_the_cpu_allocator():
    with AllocatedPeak("cpu") as ap:
        with ap.mark():
            kept = torch.empty(4 * MIB, dtype=torch.uint8)
        tmp = torch.empty(8 * MIB, dtype=torch.uint8)
        del tmp
        with ap.mark():
            tmp = torch.empty(2 * MIB, dtype=torch.uint8)
        del tmp
    assert ap.peak_mb == pytest.approx(12, abs=0.01)
    assert ap.span_peaks_mb == pytest.approx([12, 2], abs=0.01)
    assert kept.numel() == 4 * MIB
