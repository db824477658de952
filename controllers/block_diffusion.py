"""The block-diffusion models' own decoding rules, as controllers (``kind = "baseline"``).

* ``llada2``: LLaDA2.0's ``generate`` (inclusionAI's hub ``modeling_llada2_moe.py``; docs/models.md
  writes it out step by step). A block of b positions gets ``steps`` forwards at most; step j of
  the block has the scheduled count ``n_j = ⌊b / steps⌋ + [j < b mod steps]`` (the remainder
  first). With ``p_i = p(x0_i)`` at the block's masked positions, the step commits every position
  with ``p_i > τ`` (strict) when at least ``n_j`` of them pass, else the ``min(n_j, m)`` most
  confident of the m masked ones. ``steps`` is capped at ``⌊G / minimal_topk⌋`` as the reference
  does. With the schedule summing to b, every block finishes within ``steps`` forwards.

* ``llada21``: LLaDA2.1's joint threshold (the hub ``modeling_llada21_moe.py`` ``generate``; SGLang's
  ``joint_threshold``). Mask to token (M2T): every masked position with ``p_i > τ`` when at least
  ``n`` (``num_to_transfer``) pass, else the ``n`` most confident. Token to token (T2T): every decided
  position of the block whose prediction changed, ``x0_i ≠ y_i``, with ``p_i > τ_edit``, is rewritten
  (also while masks remain; both sets from the step's state, written together). The block ends at a
  step that started with no mask and edited nothing, or after ``max_post_steps`` forwards without
  masks (``Decision.stay`` keeps it open; the loop enforces the limit, so decoding ends).

Each decides on the window the loop gives it, so it runs on a block-causal canvas (where the loop
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


@CONTROLLERS.register("llada21", aliases=("joint_threshold",))
class LLaDA21JointThreshold(Controller):
    """LLaDA2.1's joint threshold: M2T commits above τ (at least n), T2T edits of decided positions whose
    prediction changed with p > τ_edit, the block kept open while it edits (module docstring)."""

    kind = "baseline"
    edits = True
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence τ a masked position must exceed",
                           tune=(0.5, 0.99)),
        "editing_threshold": Param(float, low=0.0, high=1.0,
                                   doc="confidence τ_edit a changed prediction needs to rewrite a decided token"),
        "max_post_steps": Param(int, low=0, doc="forwards a block may take after its masks are gone"),
        "num_to_transfer": Param(int, low=1, doc="masked positions committed at least each step (n)"),
    }

    def __init__(self, threshold: float = 0.95, editing_threshold: float = 0.9, max_post_steps: int = 16,
                 num_to_transfer: int = 1) -> None:
        self.threshold = threshold
        self.editing_threshold = editing_threshold
        self.max_post_steps = max_post_steps
        self.num_to_transfer = num_to_transfer

    def stay_limit(self) -> int:
        return int(self.max_post_steps)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        n = f.n_eligible.clamp(max=self.num_to_transfer)
        high = f.eligible & (f.confidence > self.threshold)
        commit = torch.where((high.sum(1) >= n)[:, None], high, select_topk(f.confidence, f.eligible, n))
        current = state.context.canvas
        decided = (current != state.mask_token_id) & ~f.eligible
        edit = decided & (f.confidence > self.editing_threshold) & (f.x0 != current)
        stay = f.eligible.any(1) | edit.any(1)
        return Decision(commit=commit, edit=edit, stay=stay,
                        info={"n_commit": commit.sum(1), "n_edit": edit.sum(1)})
