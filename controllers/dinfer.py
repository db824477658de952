"""dInfer's parallel decoding rules (inclusionAI/dInfer, ``python/dinfer/decoding/parallel_strategy.py``).

* ``hierarchy``: ``HierarchyDecoder``. Commit every position above a high threshold; below it,
  in each maximal run of contiguous masked positions (a *segment*), the most confident one when it
  clears a low threshold, so mid-confidence guesses are made apart from each other.
* ``credit``: ``CreditThresholdParallelDecoder``. Every step adds to an exponential moving *credit*
  ``C`` of each position's top-1 token (``C ← β·C + p_top1^γ``), fuses it into the logits
  (``z + α·log(1 + C)``) and applies dInfer's threshold rule to the fused distribution, so a token
  that keeps being predicted gains confidence.
"""

from __future__ import annotations

from typing import Optional

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures, sample_tokens
from adaptive_decoding.framework.engine.selection import select_topk


def segment_maxima(conf: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """bool ``[B, W]``: the eligible slots whose confidence equals the largest of their segment (a
    maximal run of contiguous eligible slots); ties all count, as in dInfer's ``==`` test."""
    b, w = conf.shape
    prev = torch.cat([torch.zeros_like(eligible[:, :1]), eligible[:, :-1]], dim=1)
    seg = (eligible & ~prev).long().cumsum(1) - 1
    seg = torch.where(eligible, seg, torch.full_like(seg, w))  # ineligible slots: a bucket of their own
    neg = torch.full((b, w + 1), float("-inf"), device=conf.device)
    best = neg.scatter_reduce(1, seg, torch.where(eligible, conf.float(), neg[:, :w]), "amax", include_self=True)
    return eligible & (conf.float() == best.gather(1, seg))


@CONTROLLERS.register("hierarchy", aliases=("dinfer_hierarchy",))
class Hierarchy(Controller):
    """dInfer hierarchy: p(x0) > τ, plus each masked segment's most confident position if > τ_low.

    A position is committed when it is eligible and ``p(x0) > threshold`` (τ), or when it is the
    most confident position of its segment (maximal run of contiguous masked positions of the block)
    and ``p(x0) > low_threshold`` (τ_low), or when it is the block's most confident masked position.
    ``null`` turns either test off (dInfer's class defaults: τ = None, τ_low = 0.4).
    """

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, nullable=True, doc="τ: commit where p(x0) > τ; null = off",
                           tune=(0.7, 0.99)),
        "low_threshold": Param(float, low=0.0, high=1.0, nullable=True,
                               doc="τ_low: a segment's maximum commits only when p(x0) > τ_low; null = always",
                               tune=(0.1, 0.7)),
    }
    differences = """
    dInfer's "local maximum" is the maximum of each segment of contiguous masked positions, found
    with scatter_reduce; we follow that code (not a neighbourhood window).

    Defaults are those of dInfer's benchmarks/benchmark.py command line (threshold 0.9,
    low_threshold 0.3); the HierarchyDecoder class itself defaults to threshold None and
    low_threshold 0.4.

    HierarchyDecoder asserts a batch of one; here every row is decided on its own. At temperature
    > 0 dInfer draws x0 with its Gumbel noise; here x0 is the framework's counter-based sample of the
    same distribution, and p(x0) is untempered in both.
    """

    def __init__(self, threshold: Optional[float] = 0.9, low_threshold: Optional[float] = 0.3) -> None:
        self.threshold = threshold
        self.low_threshold = low_threshold

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        conf = f.confidence.float()
        commit = segment_maxima(conf, f.eligible)
        if self.low_threshold is not None:
            commit &= conf > self.low_threshold
        if self.threshold is not None:
            commit |= f.eligible & (conf > self.threshold)
        return Decision(commit=commit | select_topk(conf, f.eligible, 1))


def _credit_slots(ids: torch.Tensor, value: torch.Tensor, top1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position, the table slot of token ``top1`` (its own, else the first empty one, else the
    least credited) ``[B, W]`` and whether it already held ``top1``."""
    match = ids == top1[..., None]
    held = match.any(-1)
    empty = ids < 0
    spare = torch.where(empty.any(-1), empty.float().argmax(-1), value.argmin(-1))
    return torch.where(held, match.float().argmax(-1), spare), held


@CONTROLLERS.register("credit", aliases=("dinfer_credit",))
class Credit(Controller):
    """dInfer credit: threshold rule on logits fused with an EMA credit of each repeated top-1 token.

    Per position and token v, the credit ``C_v ← β·C_v + [v = top1]·p_top1^γ`` (β = ``decay_beta``,
    γ = ``boost_gamma``, updated while the position is masked, β applied from the block's second
    step), the fused logits ``z̃_v = z_v + α·log(1 + C_v)`` (α = ``credit_alpha``) give x0 and its
    confidence p̃(x0), and every masked position with ``p̃(x0) ≥ min(τ, max p̃ − 1e-5)`` is committed.
    """

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, doc="τ: commit where the fused p̃(x0) ≥ τ (at least the best)",
                           tune=(0.7, 0.99)),
        "credit_alpha": Param(float, low=0.0, doc="α: weight of log(1 + credit) added to the logits", tune=(0.0, 2.0)),
        "boost_gamma": Param(float, low=0.0, doc="γ: a step's credit is p_top1^γ", tune=(0.0, 1.0)),
        "decay_beta": Param(float, low=0.0, high=1.0, doc="β: credit decay per step", tune=(0.5, 0.99)),
    }
    differences = """
    dInfer keeps a dense credit matrix [B, L, V] per block; only a position's top-1 token gains
    credit, one token per step, so here each position keeps a table of its credited tokens with
    room for one per step of its block (block_length entries): the fused logits are the same.

    The committed tokens are the fused argmax (Decision.tokens), as dInfer writes them. At
    temperature > 0 x0 is the framework's counter-based sample of softmax(z̃ / T) instead of
    dInfer's Gumbel draw of the same distribution.
    """

    def __init__(self, threshold: float = 0.9, credit_alpha: float = 0.7, boost_gamma: float = 0.2,
                 decay_beta: float = 0.8) -> None:
        self.threshold = threshold
        self.credit_alpha = credit_alpha
        self.boost_gamma = boost_gamma
        self.decay_beta = decay_beta

    def credit(self, f: StepFeatures, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's credit table ``(ids, value)`` ``[B, W, K]`` (id −1 = empty), stored per generation position."""
        b, w = f.x0.shape
        g, cap = state.config.gen_length, state.config.effective_block_length
        mem = state.memory
        ids_all = mem.get("credit.ids", torch.full((b, g, cap), -1, dtype=torch.long, device=f.x0.device)).clone()
        val_all = mem.get("credit.value", torch.zeros((b, g, cap), device=f.x0.device)).clone()
        pos = f.position.clamp(0, g - 1)
        at = pos[..., None].expand(b, w, cap)
        ids, value = ids_all.gather(1, at), val_all.gather(1, at) * self.decay_beta
        slot, held = _credit_slots(ids, value, f.top1_id)
        hit = torch.nn.functional.one_hot(slot, cap).bool() & f.eligible[..., None]
        ids = torch.where(hit, f.top1_id[..., None], ids)
        gain = f.top1_prob.float().pow(self.boost_gamma)[..., None]
        value = torch.where(hit, torch.where(held[..., None], value, 0.0) + gain, value)
        r, c = f.eligible.nonzero(as_tuple=True)  # masked slots only: a padding slot never overwrites them
        ids_all[r, pos[r, c]], val_all[r, pos[r, c]] = ids[r, c], value[r, c]
        mem["credit.ids"], mem["credit.value"] = ids_all, val_all
        return ids, value

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        if f.logits is None:
            raise RuntimeError("credit needs the window logits (features.logits), which this step did not keep")
        ids, value = self.credit(f, state)
        fused = f.logits.float().scatter_add(-1, ids.clamp(min=0), self.credit_alpha * torch.log1p(value))
        if state.config.temperature > 0:
            x0 = sample_tokens(fused, state.config.temperature, state.seeds, f.step, f.position)
        else:
            x0 = fused.argmax(-1)
        conf = torch.softmax(fused, -1).gather(-1, x0[..., None]).squeeze(-1)
        best = torch.where(f.eligible, conf, torch.full_like(conf, float("-inf"))).amax(1, keepdim=True)
        commit = f.eligible & (conf >= torch.clamp(best - 1e-5, max=self.threshold))
        return Decision(commit=commit | select_topk(conf, f.eligible, 1), tokens=torch.where(f.eligible, x0, f.x0))
