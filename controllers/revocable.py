"""Revocable decoding: controllers that return committed tokens to the mask (``Decision.remask``).

* ``wino``: WINO's draft-and-verify (Hong et al., "Wide-In, Narrow-Out: Revokable Decoding for
  Efficient and Effective DLLMs", arXiv 2507.18578). Wide in: commit every masked position of the
  block whose confidence is above the low draft threshold τ₁ (at least the most confident one).
  Narrow out: every token drafted at an earlier step of the block whose probability *with its own
  position hidden* (``features.verify_prob``, the shadow block) is below the strict verification
  threshold τ₂ returns to the mask. With ``progress_guard`` at most (commits this step − 1) tokens
  are re-masked per step, the least verified first, so the decided count never falls. With
  ``rival_margin`` δ (this framework's addition, off by default) a draft is re-masked only if,
  with its slot hidden, another token is also more likely than it by more than δ
  (``verify_top_prob − verify_prob > δ``): a token that is one of several equally likely modes
  (probability about 1/m each) is not revoked for being uncertain, only for being outvoted.
* ``verified``: WINO's narrow-out step around any controller (``inner``): the wrapped controller
  drafts (a learned policy, a margin rule, ...), and every earlier draft of the block whose
  hidden-slot probability is below τ₂ returns to the mask, as in ``wino``. ``wino`` is
  ``verified`` around ``fast_dllm`` at τ₁ (tested token for token).
* ``remdm``: a ReMDM-style re-masking schedule (Wang et al., "Remasking Discrete Diffusion Models
  with Inference-Time Scaling", arXiv 2503.00307, the "conf" variant) on Fast-dLLM's threshold
  rule: once a block is at least ``start`` decided, each token committed earlier in the block is
  re-masked with probability σᵢ = η·(1 − ψᵢ), ψᵢ the confidence it had when committed (so the
  least confident are revised most), at most ``max_per_step`` per step, drawn per sample from
  ``state.seeds`` (counter-based: a batch of N equals N single runs).

The loop bounds both (:mod:`adaptive_decoding.framework.engine.loop`): only tokens this decode committed, each at
most ``remask_per_position`` times, at most ``remask_budget`` per sample, so decoding ends within
``gen_length + remask_budget`` steps.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.core.rng import uniform_at
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.nesting import Wrapper, wrapped_params
from adaptive_decoding.framework.engine.selection import rank_within, select_topk

REMDM_SALT = 0x2E3D


def draft(f: StepFeatures, threshold: float) -> torch.Tensor:
    """Masked positions of the window with confidence ≥ ``threshold``, at least the best one."""
    return (f.eligible & (f.confidence >= threshold)) | select_topk(f.confidence, f.eligible, 1)


def least_first(score: torch.Tensor, candidates: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
    """The ``limit`` ``[B]`` candidates with the lowest ``score`` per row (ties: lower slot)."""
    return candidates & (rank_within(-score.float(), candidates) < limit[:, None])


#: the narrow-out's knobs, shared by ``wino`` and ``verified`` (see :func:`narrow_out`)
NARROW_OUT_PARAMS = {
    "verify_threshold": Param(float, low=0.0, high=1.0,
                              doc="τ₂: re-mask drafts whose probability with their slot hidden is < τ₂",
                              tune=(0.5, 0.99)),
    "progress_guard": Param(bool, doc="re-mask at most (commits this step − 1) per step"),
    "rival_margin": Param(float, low=0.0, high=1.0, nullable=True,
                          doc="also require another token to beat the draft by more than this with its slot "
                              "hidden (keeps one of several equally likely modes); null: WINO's rule"),
}


def narrow_out(f: StepFeatures, commit: torch.Tensor, verify_threshold: float, rival_margin: "float | None",
               progress_guard: bool) -> torch.Tensor:
    """WINO's narrow-out: earlier drafts whose hidden-slot probability is < τ₂, the least verified first.

    With ``rival_margin`` δ only drafts that another token outvotes by more than δ with the slot
    hidden; with ``progress_guard`` at most (``commit`` count − 1) per row, so the decided count never
    falls. No re-masks where the step carries no verification (``f.verify_prob`` is None).
    """
    if f.revocable is None or f.verify_prob is None:
        return torch.zeros_like(commit)
    weak = f.revocable & (f.verify_prob.nan_to_num(1.0) < verify_threshold)
    if rival_margin is not None and f.verify_top_prob is not None:
        weak &= (f.verify_top_prob - f.verify_prob).nan_to_num(0.0) > rival_margin
    limit = (commit.sum(1) - 1 if progress_guard else weak.sum(1)).clamp(min=0)
    return least_first(f.verify_prob.nan_to_num(1.0), weak, limit)


@CONTROLLERS.register("wino")
class Wino(Controller):
    """WINO draft-and-verify: draft above τ₁, re-mask earlier drafts whose hidden-slot probability < τ₂."""

    kind = "baseline"
    revocable = True
    verifies = True
    params = {
        "draft_threshold": Param(float, low=0.0, high=1.0, doc="τ₁: draft masked positions with confidence ≥ τ₁",
                                 tune=(0.3, 0.9)),
        **NARROW_OUT_PARAMS,
    }

    def __init__(self, draft_threshold: float = 0.7, verify_threshold: float = 0.9,
                 progress_guard: bool = True, rival_margin: "float | None" = None) -> None:
        self.draft_threshold = draft_threshold
        self.verify_threshold = verify_threshold
        self.progress_guard = progress_guard
        self.rival_margin = rival_margin

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        commit = draft(f, self.draft_threshold)
        remask = narrow_out(f, commit, self.verify_threshold, self.rival_margin, self.progress_guard)
        return Decision(commit=commit, remask=remask, info={"remasked": remask.sum(1)})


@CONTROLLERS.register("verified", aliases=("verify_guard",))
class Verified(Wrapper):
    """WINO's narrow-out around any controller: it drafts, drafts failing the hidden-slot check τ₂ return."""

    kind = "heuristic"
    kind_from_inner = True  # experiments report it under its drafter's family (learned, baseline, ...)
    revocable = True
    verifies = True
    params = {
        **wrapped_params("the drafting controller"),
        **NARROW_OUT_PARAMS,
    }

    def __init__(self, inner: str = "fast_dllm", inner_params: Optional[dict] = None, verify_threshold: float = 0.9,
                 progress_guard: bool = True, rival_margin: "float | None" = None) -> None:
        self.inner = inner
        self.inner_params = inner_params
        self.verify_threshold = verify_threshold
        self.progress_guard = progress_guard
        self.rival_margin = rival_margin

    def check_combination(self) -> None:
        super().check_combination()
        if getattr(self.inner_controller(), "revocable", False):
            raise ParameterError(f"verified.inner={self.inner!r} is revocable itself; allowed: a controller "
                                 f"that only commits (one re-masking rule per decode)")

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        d = self.wrapped().decide(f, state)
        commit = d.commit & f.eligible
        remask = narrow_out(f, commit, self.verify_threshold, self.rival_margin, self.progress_guard)
        info = dict(d.info)
        info["remasked"] = remask.sum(1)
        return dataclasses.replace(d, commit=commit, remask=remask, info=info)


@CONTROLLERS.register("remdm", aliases=("remdm_conf",))
class ReMDM(Controller):
    """ReMDM-style re-masking on Fast-dLLM's rule: revise earlier tokens with probability η·(1 − ψ)."""

    kind = "baseline"
    stochastic = True
    revocable = True
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="commit masked positions with confidence ≥ threshold",
                           tune=(0.5, 0.99)),
        "eta": Param(float, low=0.0, high=1.0, doc="η: re-mask probability scale, σᵢ = η·(1 − ψᵢ)", tune=(0.0, 1.0)),
        "start": Param(float, low=0.0, high=1.0, doc="re-mask only once the block is this fraction decided"),
        "max_per_step": Param(int, low=0, doc="most re-masks per step and sample"),
    }

    def __init__(self, threshold: float = 0.9, eta: float = 0.5, start: float = 0.5, max_per_step: int = 1) -> None:
        self.threshold = threshold
        self.eta = eta
        self.start = start
        self.max_per_step = max_per_step

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        g = state.config.gen_length
        state.memory["psi"] = torch.ones(state.batch_size, g, device=state.seeds.device)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        commit = draft(f, self.threshold)
        psi_mem = state.memory["psi"]
        pos = f.position.clamp(0, psi_mem.shape[1] - 1)
        psi = psi_mem.gather(1, pos)
        blen = (f.block_end - f.block_start).clamp(min=1).float()
        decided = 1.0 - f.n_eligible.float() / blen
        remask = torch.zeros_like(commit)
        if f.revocable is not None:
            u = uniform_at(state.seeds, f.step, REMDM_SALT, f.position)
            hit = f.revocable & (u < self.eta * (1.0 - psi.double())) & (decided >= self.start)[:, None]
            remask = least_first(psi, hit, torch.full_like(f.n_eligible, int(self.max_per_step)))
        r, c = commit.nonzero(as_tuple=True)  # padding slots repeat a column: write committed slots only
        psi_mem = psi_mem.clone()
        psi_mem[r, pos[r, c]] = f.confidence[r, c].float()
        state.memory["psi"] = psi_mem
        return Decision(commit=commit, remask=remask, info={"remasked": remask.sum(1)})
