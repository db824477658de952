"""Controllers that commit positions which do not depend on each other together.

* ``dus``: Dilated Unmasking Scheduling (Luxembourg, Permuter & Nachmani 2025, arXiv 2506.19037),
  a published baseline. Within a block of B positions it unmasks, at block step t = 1 … R
  (R = ⌈log_a B⌉), the positions k (0-based, block-relative) with k mod s_t = 0, s_t = max(1,
  ⌊B / a^t⌋), not unmasked before: positions far apart first, their neighbours later (a
  first-order Markov assumption: neighbours depend, distant positions barely do). When the last
  group P_R is smaller than P_{R-1} it is merged into step R − 1. With a skip ``threshold`` > 0 a
  scheduled position whose confidence is below it waits for a later step.
* ``neighbour_nms``: non-maximum suppression over uncertain positions. Every position with
  confidence ≥ ``threshold`` is committed; of the uncertain ones, each that is more confident than
  every other uncertain position within ``radius`` slots is committed too (one per cluster of
  mutually dependent guesses; the rest become certain once it is fixed).
* ``peer_nms``: the same over a task's declared constraint structure instead of adjacency: on an
  n×n Sudoku answer (the ``sudoku`` attention structure of :mod:`adaptive_decoding.framework.models.structure`, cells
  row-major in the generation), an uncertain cell is committed when it is more confident than every
  other uncertain cell of its row, column and box (its *peers*), so no two committed guesses
  constrain each other.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.models.structure import sudoku_peers, window_peers


@lru_cache(maxsize=256)
def dus_schedule(block_length: int, dilation: float) -> tuple[int, ...]:
    """The block step (1-based) at which DUS first schedules each block position ``k`` (after the
    merge of a small last group into the step before it)."""
    steps = max(1, math.ceil(math.log(block_length) / math.log(dilation) - 1e-12)) if block_length > 1 else 1
    first = [0] * block_length
    sizes: list[int] = []
    for t in range(1, steps + 1):
        stride = max(1, int(block_length // (dilation ** t)))
        group = [k for k in range(block_length) if first[k] == 0 and k % stride == 0]
        merge = t == steps and sizes and len(group) < sizes[-1]
        for k in group:
            first[k] = len(sizes) if merge else len(sizes) + 1
        if not merge:
            sizes.append(len(group))
    return tuple(first)


def _schedule_table(block_len: torch.Tensor, width: int, dilation: float) -> torch.Tensor:
    """``[B, W]``: the step at which each window slot is scheduled (slots past the block: a large value);
    one table per distinct block length, gathered by row."""
    lengths, row_of = torch.unique(block_len, return_inverse=True)
    tables = []
    for n in lengths.tolist():  # distinct block lengths (one, unless blocks adapt), not samples
        sched = list(dus_schedule(int(n), dilation))[:width]
        tables.append(sched + [10**9] * (width - len(sched)))
    return torch.tensor(tables, dtype=torch.long, device=block_len.device)[row_of]


@CONTROLLERS.register("dus", aliases=("dilated",))
class DilatedUnmasking(Controller):
    """DUS: unmask dilated groups of a block, far-apart positions first (log_a B steps per block)."""

    kind = "baseline"
    params = {
        "dilation": Param(float, low=1.0, low_exclusive=True, doc="base a: about B/a^t positions apart at step t; "
                          "R = ceil(log_a B) steps per block", tune=(2.0, 8.0), log=True),
        "threshold": Param(float, low=0.0, high=1.0, doc="skip: a scheduled position below this confidence waits "
                           "(0 = never skip)", tune=(0.0, 0.9)),
    }

    def __init__(self, dilation: float = 2.0, threshold: float = 0.0) -> None:
        self.dilation = dilation
        self.threshold = threshold

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        table = _schedule_table(f.block_end - f.block_start, f.confidence.shape[1], float(self.dilation))
        due = f.eligible & (table <= (f.block_step + 1)[:, None])
        if self.threshold > 0:
            due &= f.confidence >= self.threshold
        return Decision(commit=due | select_topk(f.confidence, f.eligible, 1) & ~due.any(1, keepdim=True))


@CONTROLLERS.register("neighbour_nms", aliases=("neighbor_nms",))
class NeighbourSuppression(Controller):
    """Commit confident positions, plus each uncertain one more confident than every uncertain one within a radius."""

    kind = "heuristic"
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence at which a position is certain", tune=(0.7, 0.99)),
        "radius": Param(int, low=1, doc="uncertain positions this many slots apart or closer suppress each other",
                        tune=(1, 4)),
        "floor": Param(float, low=0.0, high=1.0, doc="an uncertain position needs at least this confidence",
                       tune=(0.0, 0.5)),
    }

    def __init__(self, threshold: float = 0.9, radius: int = 1, floor: float = 0.0) -> None:
        self.threshold = threshold
        self.radius = radius
        self.floor = floor

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        conf = f.confidence.float()
        certain = f.eligible & (conf >= self.threshold)
        uncertain = f.eligible & ~certain
        score = torch.where(uncertain, conf, torch.full_like(conf, -1.0))
        local_max = uncertain & (conf >= self.floor)
        width = conf.shape[1]
        for d in range(1, min(int(self.radius), width - 1) + 1):
            right = torch.nn.functional.pad(score[:, d:], (0, d), value=-1.0)  # the slot d to the right
            left = torch.nn.functional.pad(score[:, :-d], (d, 0), value=-1.0)
            local_max &= (score >= right) & (score > left)  # a tie goes to the leftmost
        return Decision(commit=certain | local_max | select_topk(f.confidence, f.eligible, 1))


@CONTROLLERS.register("peer_nms")
class PeerSuppression(Controller):
    """Commit confident cells, plus each uncertain cell more confident than all its uncertain peers."""

    kind = "heuristic"
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence at which a cell is certain", tune=(0.9, 0.999)),
        "floor": Param(float, low=0.0, high=1.0, doc="an uncertain cell needs at least this confidence",
                       tune=(0.0, 0.95)),
        "grid": Param(int, low=4, doc="the Sudoku's side n (n² answer cells, row-major from generation position 0)"),
    }

    def __init__(self, threshold: float = 0.99, floor: float = 0.9, grid: int = 9) -> None:
        self.threshold = threshold
        self.floor = floor
        self.grid = grid

    def check_combination(self) -> None:
        if math.isqrt(int(self.grid)) ** 2 != int(self.grid):
            raise ParameterError(f"{self.display_name()}.grid={self.grid} is not a square number "
                                 f"(a Sudoku's side: 4, 9, 16, ...)")

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        conf = f.confidence.float()
        certain = f.eligible & (conf >= self.threshold)
        uncertain = f.eligible & ~certain
        pos = f.position
        rival = window_peers(sudoku_peers(int(self.grid)), pos)
        rival &= uncertain[:, None, :] & (pos[:, :, None] != pos[:, None, :])  # [B, W, W]: i's uncertain peers j
        ahead = (conf[:, :, None] > conf[:, None, :]) | \
            ((conf[:, :, None] == conf[:, None, :]) & (pos[:, :, None] < pos[:, None, :]))  # ties: lower cell
        local_max = uncertain & (conf >= self.floor) & (ahead | ~rival).all(2)
        return Decision(commit=certain | local_max | select_topk(f.confidence, f.eligible, 1))
