"""``logprob``: the geometric mean of a candidate's token probabilities under the denoiser.

``s = p̄ − 1`` with ``p̄ = exp((1/|D|) Σ_{i∈D} log p_θ(x_i | x_t))``, D the positions whose
log-probability the rollout recorded (``Candidates.logprob_mask``): the candidate token at the
branch position(s), the controller's commits and every token the rollout filled. In [−1, 0];
0 when D is empty.
"""

from __future__ import annotations

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.scorer import SCORERS, Candidates, Scorer, ScoringContext


def geometric_mean_score(logp: torch.Tensor, mask: torch.Tensor, floor: float) -> torch.Tensor:
    """``exp(mean log p over mask) − 1`` per row, log p clamped at ``floor``; 0 for empty rows."""
    lp = torch.where(mask, logp.float().clamp(min=floor), torch.zeros_like(logp, dtype=torch.float))
    count = mask.sum(1)
    mean = lp.sum(1) / count.clamp(min=1)
    return torch.where(count > 0, mean.exp() - 1.0, torch.zeros_like(mean))


@SCORERS.register("logprob", aliases=("denoiser_logprob",))
class LogProb(Scorer):
    """Geometric mean of the candidate's token probabilities under the denoiser (p̄ − 1)."""

    params = {
        "floor": Param(float, high=0.0, doc="log-probabilities are clamped at this value"),
    }

    def __init__(self, floor: float = -30.0) -> None:
        self.floor = floor

    def _score(self, c: Candidates, context: ScoringContext) -> torch.Tensor:
        if c.logprobs is None:
            raise ValueError(
                "the logprob scorer needs Candidates.logprobs (the denoiser's log-probabilities of the "
                "chosen tokens, which the lookahead records); got none"
            )
        return geometric_mean_score(c.logprobs, c.logprob_mask & c.decided, self.floor)
