"""Adaptive batch size: halve on out-of-memory, grow back after successes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


# ---------------------------------------------------------------------------------- batch size
@dataclass
class BatchSizer:
    """Adaptive batch size: halve on OOM, grow back carefully (a binary search below the failure).

    * OOM at size n: ``ceiling = n`` (the smallest size known to fail); the size drops to
      ``n // 2``, or to the largest size that worked since (``good``), if that is larger.
    * After ``grow_after`` consecutive full-size successes the size grows: doubling while no
      ceiling is known, else to the midpoint between the size and the ceiling.
    * Once the size sits just below the ceiling, ``probe_after`` (initially ``4 × grow_after``)
      more successes forget the ceiling, so larger sizes are tried again (memory use varies with
      prompt length and fragmentation); each probe that ends in an OOM doubles ``probe_after``.
    """

    max_size: int
    grow_after: int = 4
    size: int = 0
    ceiling: Optional[int] = None
    good: int = 0
    streak: int = 0
    oom_events: int = 0
    smallest: int = 0
    probe_after: int = 0
    probing: bool = False

    def __post_init__(self) -> None:
        self.size = self.size or self.max_size
        self.smallest = self.size
        self.probe_after = self.probe_after or 4 * self.grow_after

    def on_oom(self, n: int) -> None:
        self.oom_events += 1
        if self.probing:
            self.probe_after *= 2
            self.probing = False
        if self.good >= n:  # what worked before does not work now
            self.good = 0
        self.ceiling = n if self.ceiling is None else min(self.ceiling, n)
        self.size = max(1, n // 2, self.good)
        self.smallest = min(self.smallest, self.size)
        self.streak = 0

    def on_success(self, n: int) -> None:
        if n < self.size:  # a short tail batch says nothing about the current size
            return
        self.good = max(self.good, n)
        self.streak += 1
        if self.ceiling is None:
            if self.streak >= self.grow_after and self.size < self.max_size:
                self.size, self.streak = min(self.max_size, self.size * 2), 0
            return
        target = min(self.max_size, (self.size + self.ceiling) // 2)
        if target > self.size:
            if self.streak >= self.grow_after:
                self.size, self.streak = target, 0
        elif self.streak >= self.probe_after and self.size < self.max_size:
            self.ceiling, self.streak, self.probing = None, 0, True
