"""``klass``: KL-Adaptive Stability Sampling (shkim0116/KLASS, ``src/model/llada_klass.py``).

A masked position is ready when its predictive distribution has stopped moving, the KL divergence
between consecutive steps ``KL(p_t ‖ p_{t−1})`` staying below a bound for the last H steps, and its
confidence is high; every ready position is committed. When none is ready, LLaDA's top-k step.
"""

from __future__ import annotations

from typing import Optional

import torch

from adaptive_decoding.controllers.baselines import SCHEDULE_STEPS, llada_schedule
from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk

#: KLASS's ε inside both logarithms of the KL divergence
KL_EPS = 1e-12
STRATEGIES = ("all", "max_conf", "min_kl")


def step_kl(f: StepFeatures, state: DecodeState) -> torch.Tensor:
    """``KL(p_t ‖ p_{t−1})`` per window slot ``[B, W]`` (+inf where the slot showed another position
    or nothing at the previous step), remembering this step's window distributions."""
    if f.logits is None:
        raise RuntimeError("klass needs the window logits (features.logits), which this step did not keep")
    b, w, v = f.logits.shape
    multi_block = state.config.block_add_threshold not in (None, 1.0)  # the window may grow to G
    cap = state.config.gen_length if multi_block else max(w, state.config.effective_block_length)
    mem = state.memory
    p = torch.softmax(f.logits.float(), -1)
    prev_p = mem.get("klass.p", torch.zeros((b, cap, v), device=p.device))
    prev_pos = mem.get("klass.position", torch.full((b, cap), -1, dtype=torch.long, device=p.device))
    if prev_p.shape[1:] != (cap, v):
        raise RuntimeError(f"klass: the window ({w} slots, vocabulary {v}) changed shape within a decode")
    kl = (p * ((p + KL_EPS).log() - (prev_p[:, :w] + KL_EPS).log())).sum(-1)
    kl = torch.where(prev_pos[:, :w] == f.position, kl, torch.full_like(kl, float("inf")))
    mem["klass.p"] = torch.cat([p, prev_p[:, w:]], 1)
    mem["klass.position"] = torch.cat([f.position, prev_pos[:, w:]], 1)
    return kl


@CONTROLLERS.register("klass")
class KLASS(Controller):
    """KLASS: commit masked positions with p(x0) > τ_conf whose KL between steps stayed < τ_KL for H steps.

    With ``D_t = KL(p_t ‖ p_{t−1}) = Σ_v p_t(v)·(log(p_t(v) + ε) − log(p_{t−1}(v) + ε))`` (ε = 1e-12)
    a position is *ready* when ``D_{t−h} < kl_threshold`` for h = 0 … H−1 (H = ``history_length``)
    and ``p(x0) > conf_threshold``. ``unmask_strategy`` commits every ready position (``all``), the
    most confident (``max_conf``) or the one of smallest ``D_t`` (``min_kl``). A row with none
    ready commits LLaDA's top-k by p(x0), ``steps`` over all blocks (null = gen_length: one a step).
    """

    kind = "baseline"
    params = {
        "conf_threshold": Param(float, low=0.0, high=1.0, doc="τ_conf: ready only where p(x0) > τ_conf",
                                tune=(0.5, 0.99)),
        "kl_threshold": Param(float, low=0.0, low_exclusive=True, doc="τ_KL: ready only where KL(p_t ‖ p_t−1) < τ_KL "
                              "for H steps", tune=(0.001, 0.1), log=True),
        "history_length": Param(int, low=1, doc="H: steps the KL must stay below τ_KL", tune=(1, 4)),
        "unmask_strategy": Param(str, choices=STRATEGIES, doc="which ready positions to commit"),
        "steps": SCHEDULE_STEPS,
    }
    differences = """
    The window holds only the current block, so the KL at a block's first step (against the
    previous step, when the position was outside the window) is unknown and counts as unstable: a
    position can be ready from block step H on, where KLASS (which runs the whole canvas every step)
    allows block step H − 1 from the second block on. In the first block the two agree (KLASS
    compares its first step with an all-zero distribution).

    The previous step's window distributions are kept in state.memory (one [B, W, V] float32
    tensor, the size of the step's logits; [B, G, V] under multi-block decoding, whose window may
    grow to G): the exact KL, not a top-k estimate. KLASS computes in float64.

    Defaults are KLASS's LLaDA GSM8K script (conf 0.6, KL 0.015, H = 2, steps = gen_length). At
    temperature > 0 KLASS computes p(x0) and the KL from softmax of its Gumbel-noised,
    exponentiated logits (add_gumbel_noise returns exp(z)/g, not logits): a defect; here both use the
    untempered distribution. Its fallback resets the whole transfer mask inside the per-row loop
    (a batch of one only) and can leave masks in a block when ready sets are smaller than the
    schedule's k; here every row is its own and the schedule's last step takes all that remain.
    The random unmask strategy is not offered.
    """

    def __init__(self, conf_threshold: float = 0.6, kl_threshold: float = 0.015, history_length: int = 2,
                 unmask_strategy: str = "all", steps: Optional[int] = None) -> None:
        self.conf_threshold = conf_threshold
        self.kl_threshold = kl_threshold
        self.history_length = history_length
        self.unmask_strategy = unmask_strategy
        self.steps = steps

    def stable(self, kl: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """bool ``[B, W]``: the last H KL values are all below τ_KL (the history lives beside ``klass.p``)."""
        b, w = kl.shape
        hist = state.memory.get("klass.kl", torch.full((b, state.memory["klass.p"].shape[1], self.history_length),
                                                       float("inf"), device=kl.device))
        recent = torch.cat([hist[:, :w, 1:], kl[..., None]], -1)
        recent = torch.where(torch.isinf(kl)[..., None], torch.full_like(recent, float("inf")), recent)
        state.memory["klass.kl"] = torch.cat([recent, hist[:, w:]], 1)
        return (recent < self.kl_threshold).all(-1)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        kl = step_kl(f, state)
        ready = self.stable(kl, state) & (f.confidence > self.conf_threshold) & f.eligible
        if self.unmask_strategy == "max_conf":
            ready = select_topk(f.confidence, ready, 1)
        elif self.unmask_strategy == "min_kl":
            ready = select_topk(-kl, ready, 1)
        fallback = select_topk(f.confidence, f.eligible, llada_schedule(self, self.steps, f, state))
        commit = torch.where(ready.any(1, keepdim=True), ready, fallback)
        return Decision(commit=commit, info={"ready": ready.sum(1)})
