"""``temporal_stability``: a threshold rule plus predictions that stopped changing (a heuristic).

This is this project's rule, **not** LEAP (Zhang et al. 2026, arXiv 2605.10980). It was registered
as ``leap`` until that name was found to promise the paper's method: LEAP detects convergence with
lookahead filtering and multi-sequence superposition, and none of that is implemented here. What
is here is the simplest temporal signal a masked diffusion decoder has: a position whose argmax
has not changed for several consecutive forward passes is probably settled.
"""

from __future__ import annotations

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk


@CONTROLLERS.register("temporal_stability", aliases=("stability",))
class TemporalStability(Controller):
    """Temporal stability (heuristic, not LEAP): commit p(x0) > τ, plus predictions unchanged for n steps.

    Per sample and position the controller keeps the last prediction and the length of its current
    run, ``run_t = run_{t−1} + 1`` if ``x0_t = x0_{t−1}`` else 1, over every masked position of the
    canvas (so a later block starts with its history). A position is committed when it is eligible
    and either ``p(x0) > τ`` (Fast-dLLM's threshold rule, at least the most confident) or
    ``run_t ≥ n_stable`` with ``p(x0) ≥ min_confidence``. It is not the LEAP paper's method (no
    lookahead filtering, no multi-sequence superposition); it used to be registered as ``leap``.
    """

    kind = "heuristic"
    params = {
        "threshold": Param(float, low=0.0, doc="base rule: Fast-dLLM threshold τ", tune=(0.7, 0.99)),
        "n_stable": Param(int, low=2, doc="commit a prediction unchanged for n consecutive steps", tune=(2, 6)),
        "min_confidence": Param(float, low=0.0, high=1.0, doc="floor on p(x0) for a stability commit",
                                tune=(0.0, 0.5)),
    }

    def __init__(self, threshold: float = 0.9, n_stable: int = 3, min_confidence: float = 0.0) -> None:
        self.threshold = threshold
        self.n_stable = n_stable
        self.min_confidence = min_confidence

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        # history per generation position [B, G] (windows move from block to block and change width)
        mem = state.memory
        g = state.config.gen_length
        pos = f.position.clamp(0, g - 1)
        hist_x0 = mem.get("stability.prev_x0", torch.zeros(f.x0.shape[0], g, dtype=f.x0.dtype, device=f.x0.device))
        hist_run = mem.get("stability.run", torch.zeros(f.x0.shape[0], g, dtype=torch.long, device=f.x0.device))
        prev, run = hist_x0.gather(1, pos), hist_run.gather(1, pos)
        same = (f.x0 == prev) & (run > 0)
        run = torch.where(f.masked, torch.where(same, run + 1, torch.ones_like(run)), torch.zeros_like(run))
        hist_x0, hist_run = hist_x0.clone(), hist_run.clone()
        r, c = (~f.masked).nonzero(as_tuple=True)  # decided (or padding) slots: no run
        hist_run[r, pos[r, c]] = 0
        r, c = f.masked.nonzero(as_tuple=True)  # written last, so a padding slot never overwrites them
        hist_x0[r, pos[r, c]], hist_run[r, pos[r, c]] = f.x0[r, c], run[r, c]
        mem["stability.prev_x0"], mem["stability.run"] = hist_x0, hist_run
        base = (f.eligible & (f.confidence > self.threshold)) | select_topk(f.confidence, f.eligible, 1)
        stable = f.eligible & (run >= self.n_stable) & (f.confidence >= self.min_confidence)
        return Decision(commit=base | stable, info={"stable_commits": (stable & ~base).sum(1)})
