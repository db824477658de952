"""Per-position features of one decoding step (the controllers' only view of the model).

For every position the step computes, from the denoiser's logits:

* ``x0``          the predicted token (argmax, or a Gumbel-max sample at temperature > 0),
* ``confidence``  p(x0), the probability of the predicted token (LLaDA's / Fast-dLLM's "confidence"),
* ``top1_prob``, ``top2_prob`` and ``margin = top1 - top2`` (Dream's ``topk_margin``, the margin
  top-k controller's η test),
* ``entropy``     H = -Σ p log p with p clamped at 1e-10 (Dream's ``entropy`` alg, EB-sampler, and
  the entropy top-k controller's ``k = k_base + α·H/τ``),
* position features: ``position`` (index in the generation), ``position_in_block`` in [0, 1),
* progress features: ``frac_masked`` and ``progress`` per sample.

``eligible`` marks what may be committed now: still masked and inside the current block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from framework.core.rng import gumbel

PROB_CLAMP = 1e-10
GUMBEL_SALT = 0x5A17


@dataclass
class StepFeatures:
    """Tensors of one step; per-position ones are ``[B, L]``, per-sample ones ``[B]``."""

    x0: torch.Tensor
    confidence: torch.Tensor
    top1_prob: torch.Tensor
    top2_prob: torch.Tensor
    top1_id: torch.Tensor
    top2_id: torch.Tensor
    margin: torch.Tensor
    entropy: torch.Tensor
    eligible: torch.Tensor
    masked: torch.Tensor
    position: torch.Tensor
    position_in_block: torch.Tensor
    frac_masked: torch.Tensor
    step: torch.Tensor
    block_step: torch.Tensor
    block_index: torch.Tensor
    block_start: torch.Tensor
    block_end: torch.Tensor
    block_masked_at_start: torch.Tensor
    n_eligible: torch.Tensor
    logits: Optional[torch.Tensor] = field(default=None, repr=False)

    @property
    def progress(self) -> torch.Tensor:
        """Fraction of the generation already decided, per sample ``[B]``."""
        return 1.0 - self.frac_masked

    @property
    def batch_size(self) -> int:
        return self.x0.shape[0]

    def rows(self, index: torch.Tensor) -> "StepFeatures":
        """The features of a subset of samples (index into the batch dimension)."""
        kw = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            kw[name] = value[index] if isinstance(value, torch.Tensor) else value
        return StepFeatures(**kw)


def token_statistics(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """top-1/top-2 probabilities and ids, margin and entropy from logits ``[..., V]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    probs = logp.exp()
    top = probs.topk(2, dim=-1) if probs.shape[-1] >= 2 else None
    if top is None:
        top1_prob = probs[..., 0]
        top2_prob = torch.zeros_like(top1_prob)
        top1_id = torch.zeros_like(top1_prob, dtype=torch.long)
        top2_id = top1_id
    else:
        top1_prob, top2_prob = top.values[..., 0], top.values[..., 1]
        top1_id, top2_id = top.indices[..., 0], top.indices[..., 1]
    clamped = probs.clamp(min=PROB_CLAMP)
    entropy = -(probs * clamped.log()).sum(-1)
    return {
        "probs": probs,
        "top1_prob": top1_prob,
        "top2_prob": top2_prob,
        "top1_id": top1_id,
        "top2_id": top2_id,
        "margin": top1_prob - top2_prob,
        "entropy": entropy,
    }


def compute_features(
    logits: torch.Tensor,
    *,
    eligible: torch.Tensor,
    masked: torch.Tensor,
    rel: torch.Tensor,
    gen_length: int,
    block_start: torch.Tensor,
    block_end: torch.Tensor,
    block_index: torch.Tensor,
    block_masked_at_start: torch.Tensor,
    step: torch.Tensor,
    block_step: torch.Tensor,
    temperature: float = 0.0,
    seeds: Optional[torch.Tensor] = None,
    keep_logits: bool = True,
) -> StepFeatures:
    """Build :class:`StepFeatures` from logits ``[B, L, V]``.

    At ``temperature > 0`` the prediction is a Gumbel-max sample
    ``x0 = argmax(logits / T + g)`` with per-sample counter-based noise (see :mod:`framework.core.rng`)
    and ``confidence = p(x0)`` under the un-tempered softmax, as LLaDA does.
    """
    stats = token_statistics(logits)
    probs = stats.pop("probs")
    if temperature > 0:
        if seeds is None:
            raise ValueError("temperature > 0 needs per-sample seeds")
        noise = gumbel(seeds, step, GUMBEL_SALT, tuple(logits.shape[1:]), logits.device)
        x0 = (logits.float() / temperature + noise).argmax(-1)
        confidence = probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        x0 = stats["top1_id"]
        confidence = stats["top1_prob"]
    blen = (block_end - block_start).clamp(min=1).float()
    pos_in_block = ((rel - block_start[:, None]).float() / blen[:, None]).clamp(0.0, 1.0)
    frac_masked = masked.sum(1).float() / float(gen_length)
    return StepFeatures(
        x0=x0,
        confidence=confidence,
        eligible=eligible,
        masked=masked,
        position=rel,
        position_in_block=pos_in_block,
        frac_masked=frac_masked,
        step=step,
        block_step=block_step,
        block_index=block_index,
        block_start=block_start,
        block_end=block_end,
        block_masked_at_start=block_masked_at_start,
        n_eligible=eligible.sum(1),
        logits=logits if keep_logits else None,
        **stats,
    )
