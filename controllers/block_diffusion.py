"""The block-diffusion models' own decoding rules, as controllers (``kind = "baseline"``).

* ``llada2``: LLaDA2.0's ``generate`` (inclusionAI's hub ``modeling_llada2_moe.py``; docs/models.md
  writes it out step by step). A block of b positions gets ``steps`` forwards at most; step j of
  the block has the scheduled count ``n_j = ⌊b / steps⌋ + [j < b mod steps]`` (the remainder
  first). With ``p_i = p(x0_i)`` at the block's masked positions, the step commits every position
  with ``p_i > τ`` (strict) when at least ``n_j`` of them pass, else the ``min(n_j, m)`` most
  confident of the m masked ones. ``steps`` is capped at ``⌊G / minimal_topk⌋`` as the reference
  does. With the schedule summing to b, every block finishes within ``steps`` forwards.

It decides on the window the loop gives it, so it runs on a block-causal canvas (where the loop
aligns the blocks to the model's, and ends a row after a block that contains end-of-text) and on
LLaDA-8B's semi-autoregressive blocks alike; b is the configuration's block length, also for a
first block that the prompt's last partial block shortens (as in the reference, whose schedule is
that of a whole block).
"""

from __future__ import annotations

from typing import Optional

import torch

from framework.core.params import Param
from framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from framework.engine.features import StepFeatures
from framework.engine.selection import select_topk


def scheduled_counts(block_length: int, steps: int) -> torch.Tensor:
    """``n_j`` for j = 0 … steps − 1: ``⌊b / steps⌋`` each, plus one for the first ``b mod steps``."""
    counts = torch.full((steps,), block_length // steps, dtype=torch.long)
    counts[: block_length % steps] += 1
    return counts


@CONTROLLERS.register("llada2", aliases=("llada2_threshold",))
class LLaDA2Threshold(Controller):
    """LLaDA2.0's rule: every masked position with p(x0) > τ when at least the step's scheduled
    count n_j passes, else the n_j most confident (module docstring)."""

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence τ a position must exceed (strictly)",
                           tune=(0.5, 0.99)),
        "steps": Param(int, low=1, nullable=True, doc="forwards per block at most; null = the block length"),
        "minimal_topk": Param(int, low=1, doc="steps is capped at G // minimal_topk (the reference's)"),
    }

    def __init__(self, threshold: float = 0.95, steps: Optional[int] = None, minimal_topk: int = 1) -> None:
        self.threshold = threshold
        self.steps = steps
        self.minimal_topk = minimal_topk

    def scheduled(self, f: StepFeatures, state: DecodeState) -> torch.Tensor:
        """``n_j`` ``[B]`` at each row's step j of its block (every remaining position past the schedule)."""
        b = state.config.effective_block_length
        steps = min(self.steps or b, state.config.gen_length // self.minimal_topk)
        counts = scheduled_counts(b, max(1, steps)).to(f.block_step.device)
        j = f.block_step.long()
        return torch.where(j < counts.numel(), counts[j.clamp(max=counts.numel() - 1)], f.n_eligible)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        n = torch.minimum(self.scheduled(f, state), f.n_eligible)
        high = f.eligible & (f.confidence > self.threshold)
        enough = high.sum(1) >= n
        commit = torch.where(enough[:, None], high, select_topk(f.confidence, f.eligible, n))
        return Decision(commit=commit, info={"n_commit": commit.sum(1), "scheduled": n})
