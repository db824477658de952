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

Every per-position tensor covers the step's **window** ``[B, W]``: each row's current block,
gathered per row by the loop (``window_index`` holds each slot's canvas column, ``position`` its
index in the generation), so nothing of size ``[B, L, V]`` is built. Slots past a row's block
(rows with shorter blocks) are never eligible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from framework.core.rng import uniform_at

PROB_CLAMP = 1e-10
GUMBEL_SALT = 0x5A17


@dataclass
class StepFeatures:
    """Tensors of one step; per-position ones are ``[B, W]`` (the window), per-sample ones ``[B]``."""

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
    window_index: Optional[torch.Tensor] = None
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


#: positions per chunk of the one-pass statistics: bounds the float temporaries to [B, chunk, V]
STAT_CHUNK = 8


def _chunk_stats(z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """lse, top-2 values and ids, and entropy of one chunk of logits ``[..., V]`` (float32 inside)."""
    zf = z.float()
    lse = torch.logsumexp(zf, dim=-1)
    if zf.shape[-1] >= 2:
        top = zf.topk(2, dim=-1)
        tv, ti = top.values, top.indices
    else:
        tv = torch.cat([zf, torch.full_like(zf, float("-inf"))], -1)
        ti = torch.zeros_like(tv, dtype=torch.long)
    p = (zf - lse.unsqueeze(-1)).exp_()
    entropy = -(p * p.clamp(min=PROB_CLAMP).log()).sum(-1)
    return lse, tv, ti, entropy


def token_statistics(logits: torch.Tensor, chunk: int = STAT_CHUNK) -> dict[str, torch.Tensor]:
    """top-1/top-2 probabilities and ids, margin, entropy and log-sum-exp from logits ``[B, W, V]``.

    One pass over the vocabulary per chunk of ``chunk`` positions: the float32 temporaries are
    ``[B, chunk, V]``, never a full-window copy, whatever the logits' dtype. ``entropy`` is
    H = -Σ p log max(p, 1e-10) (Dream's ``entropy`` alg, EB-sampler); ``lse`` lets callers turn
    any logit into a log-probability without another pass.
    """
    if logits.dim() == 2:
        return {k: v[0] for k, v in token_statistics(logits[None], chunk).items()}
    w = logits.shape[1]
    parts = [_chunk_stats(logits[:, i:i + chunk]) for i in range(0, max(w, 1), chunk)] if w else [
        _chunk_stats(logits)]
    lse, tv, ti, entropy = (torch.cat([p[j] for p in parts], dim=1) for j in range(4))
    top1_prob = (tv[..., 0] - lse).exp()
    top2_prob = (tv[..., 1] - lse).exp()
    return {
        "top1_prob": top1_prob,
        "top2_prob": top2_prob,
        "top1_id": ti[..., 0],
        "top2_id": ti[..., 1],
        "margin": top1_prob - top2_prob,
        "entropy": entropy,
        "lse": lse,
    }


def sample_tokens(
    logits: torch.Tensor, temperature: float, seeds: torch.Tensor, step: torch.Tensor, position: torch.Tensor,
    chunk: int = STAT_CHUNK,
) -> torch.Tensor:
    """A sample ``x0 ~ softmax(logits / T)`` per position, in float64, counter-based per sample.

    The same distribution as LLaDA's and Fast-dLLM's float64 Gumbel-max
    (``argmax exp(z) / (-log u)^T``), drawn by inverse CDF: one uniform per position, keyed by
    ``(sample seed, step, generation position)`` (:func:`framework.core.rng.uniform_at`), so a row's
    sample never depends on the rest of the batch or on the window's layout, and the cost is one
    float64 softmax and cumulative sum over the window instead of V hashed Gumbel draws.
    """
    u = uniform_at(seeds, step, GUMBEL_SALT, position).to(torch.float64)  # [B, W]
    out = torch.empty(position.shape, dtype=torch.long, device=logits.device)
    for i in range(0, logits.shape[1], chunk):
        z = logits[:, i:i + chunk].to(torch.float64) / temperature
        cdf = torch.softmax(z, dim=-1).cumsum_(-1)
        target = (u[:, i:i + chunk] * cdf[..., -1]).unsqueeze(-1)
        idx = torch.searchsorted(cdf, target).squeeze(-1)
        out[:, i:i + chunk] = idx.clamp_(max=logits.shape[-1] - 1)
    return out


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
    window_index: Optional[torch.Tensor] = None,
    n_masked: Optional[torch.Tensor] = None,
) -> StepFeatures:
    """Build :class:`StepFeatures` from the window's logits ``[B, W, V]``.

    The window is what the step can commit (each row's current block, gathered per row by the
    loop); every per-position argument is ``[B, W]`` in the same order. ``window_index`` gives
    each slot's canvas column (default: the identity, a window that is the whole canvas) and
    ``n_masked`` the row's masked generation positions outside the window too (default: those in
    it). At ``temperature > 0`` the prediction is a sample of ``softmax(logits / T)``
    (:func:`sample_tokens`) and ``confidence = p(x0)`` under the un-tempered softmax, as LLaDA does.
    """
    stats = token_statistics(logits)
    lse = stats.pop("lse")
    if temperature > 0:
        if seeds is None:
            raise ValueError("temperature > 0 needs per-sample seeds")
        x0 = sample_tokens(logits, temperature, seeds, step, rel)
        confidence = (logits.gather(-1, x0.unsqueeze(-1)).squeeze(-1).float() - lse).exp()
    else:
        x0 = stats["top1_id"]
        confidence = stats["top1_prob"]
    blen = (block_end - block_start).clamp(min=1).float()
    pos_in_block = ((rel - block_start[:, None]).float() / blen[:, None]).clamp(0.0, 1.0)
    n_masked = masked.sum(1) if n_masked is None else n_masked
    frac_masked = n_masked.float() / float(gen_length)
    if window_index is None:
        window_index = torch.arange(x0.shape[1], device=x0.device).expand_as(x0)
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
        window_index=window_index,
        logits=logits if keep_logits else None,
        **stats,
    )
