"""``prophet``: early answer commitment (pixeli99/Prophet, ``generate_earlyexit.py``).

A diffusion LM often knows its answer long before the last step. Prophet decodes with LLaDA's
schedule and watches the gap between the top-2 logits; once the mean gap clears a threshold that
falls with the progress of decoding, it commits every remaining position in one step ("go all-in").
"""

from __future__ import annotations

from typing import Optional

import torch

from adaptive_decoding.controllers.baselines import SCHEDULE_STEPS, llada_schedule
from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk

#: the progress (step / steps) at which Prophet's early phase ends and its mid phase ends
PHASE_ENDS = (0.33, 0.67)


def top2_logit_gap(f: StepFeatures) -> torch.Tensor:
    """``z_top1 − z_top2`` per slot ``[B, W]``, equal to ``log p_top1 − log p_top2`` (one normaliser)."""
    return f.top1_prob.double().log() - f.top2_prob.double().log()


@CONTROLLERS.register("prophet")
class Prophet(Controller):
    """Prophet: LLaDA's schedule until the mean top-2 logit gap clears τ(progress), then commit all.

    At global step t (1-based) of ``steps`` (null = gen_length), progress ``t / steps`` selects
    τ = ``early_threshold`` (progress < 0.33), ``mid_threshold`` (< 0.67) or ``late_threshold``.
    When the mean of ``z_top1 − z_top2`` over the block's masked positions is ≥ τ, the row commits
    every masked position (and, from then on, every later block at its first step); otherwise
    LLaDA's top-k by p(x0).
    """

    kind = "baseline"
    params = {
        "early_threshold": Param(float, low=0.0, doc="τ_early: gap to commit all while progress < 0.33",
                                 tune=(2.0, 12.0)),
        "mid_threshold": Param(float, low=0.0, doc="τ_mid: gap while progress < 0.67", tune=(1.0, 8.0)),
        "late_threshold": Param(float, low=0.0, doc="τ_late: gap from progress 0.67 on", tune=(0.5, 5.0)),
        "steps": SCHEDULE_STEPS,
    }
    differences = """
    Prophet averages the gap over a fixed answer region: the 5 positions from two after a forced
    "The answer is" prefix (constraints at generation positions 200-202 in its eval script); with no
    constraints it never exits. Here the answer is wherever decoding is, so the gap is averaged over
    the masked positions of the current block (the window), and no prefix is forced.

    Prophet fills every masked position of the canvas at once and stops; the window here is the
    current block, so a row that has exited commits its block now and each later block at its first
    step (one forward a block). Defaults are Prophet's (7.5, 5.0, 2.5; its eval uses steps =
    gen_length). Where the schedule gives k = 0 Prophet commits nothing; here at least one token.
    """

    def __init__(self, early_threshold: float = 7.5, mid_threshold: float = 5.0, late_threshold: float = 2.5,
                 steps: Optional[int] = None) -> None:
        self.early_threshold = early_threshold
        self.mid_threshold = mid_threshold
        self.late_threshold = late_threshold
        self.steps = steps

    def threshold(self, f: StepFeatures, state: DecodeState) -> torch.Tensor:
        """τ per row ``[B]`` from progress = (step + 1) / steps."""
        progress = (f.step + 1).double() / float(self.steps or state.config.gen_length)
        late = torch.full_like(progress, self.late_threshold)
        return torch.where(progress < PHASE_ENDS[0], self.early_threshold,
                           torch.where(progress < PHASE_ENDS[1], self.mid_threshold, late))

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        gap = torch.where(f.eligible, top2_logit_gap(f), torch.zeros((), dtype=torch.float64, device=f.x0.device))
        mean_gap = gap.sum(1) / f.n_eligible.clamp(min=1)
        exited = state.memory.get("prophet.exited", torch.zeros_like(f.n_eligible, dtype=torch.bool))
        exited = exited | ((f.n_eligible > 0) & (mean_gap >= self.threshold(f, state)))
        state.memory["prophet.exited"] = exited
        scheduled = select_topk(f.confidence, f.eligible, llada_schedule(self, self.steps, f, state))
        return Decision(commit=torch.where(exited[:, None], f.eligible, scheduled),
                        info={"mean_gap": mean_gap, "exited": exited})
