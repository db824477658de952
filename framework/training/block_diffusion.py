"""The block-diffusion training objective (BD3-LM, SDAR, LLaDA2.x) for a block-causal tiny denoiser.

A block-causal model decodes block i of b canvas positions while blocks ``< i`` are already clean
and blocks ``> i`` are invisible to it. Training must show it exactly that. Noising every block of
the canvas at once and running it block-causally would let block i see *noisy* earlier blocks,
which never happens at inference; so the forward runs two copies side by side (the "vectorised"
training of BD3-LM, Arriola et al. 2025, §3.2, which SDAR and LLaDA2.0 use too):

* the noisy copy ``x_t`` (columns ``0 .. L-1``): each block masked with its own rate
  ``p_mask = (1 − ε) t + ε``, ``t ~ U[0, 1)`` per block;
* the clean copy ``x_0`` (columns ``L .. 2L-1``, the same positions ``0 .. L-1``).

Attention, by the block ``β(c) = c // b`` of each column's canvas position:

* noisy query → noisy key: same block only (``β(q) = β(k)``);
* noisy query → clean key: strictly earlier blocks (``β(k) < β(q)``);
* clean query → clean key: block-causal (``β(k) ≤ β(q)``); clean → noisy: never.

So every block's noisy positions see exactly what they would see when the loop decodes that
block: the clean prefix (in the block-causal encoding the KV cache holds) and their own
partially masked block. The loss is the masked-diffusion cross-entropy on the noisy copy, each
masked position weighted by ``1 / p_mask`` of its block, normalised by the answer's length.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from adaptive_decoding.framework.models.tiny import TinyDenoiser


def block_forward_process(
    x0: torch.Tensor, answer_mask: torch.Tensor, mask_token_id: int, block_size: int, eps: float = 1e-3,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask each answer position with its block's probability ``p_mask = (1 − ε) t + ε``, one
    ``t ~ U[0, 1)`` per (row, canvas block of ``block_size``).

    Returns ``(x_t, masked, p_mask)``, ``p_mask`` ``[B, L]`` (each position's block's rate).
    """
    b, length = x0.shape
    n_blocks = math.ceil(length / block_size)
    t = torch.rand(b, n_blocks, generator=generator, device=x0.device)
    p_mask = ((1.0 - eps) * t + eps).repeat_interleave(block_size, dim=1)[:, :length]
    u = torch.rand(x0.shape, generator=generator, device=x0.device)
    masked = (u < p_mask) & answer_mask
    x_t = torch.where(masked, torch.full_like(x0, mask_token_id), x0)
    return x_t, masked, p_mask


def two_copy_key_mask(length: int, block_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[2L, 2L]`` bool: which column of ``[x_t ; x_0]`` may attend to which (module doc)."""
    blk = torch.arange(length, device=device) // block_size
    same = blk[:, None] == blk[None, :]
    earlier = blk[None, :] < blk[:, None]
    causal = blk[None, :] <= blk[:, None]
    never = torch.zeros(length, length, dtype=torch.bool, device=device)
    return torch.cat([torch.cat([same, earlier], 1), torch.cat([never, causal], 1)], 0)


def noisy_copy_logits(denoiser: TinyDenoiser, x_t: torch.Tensor, x0: torch.Tensor,
                      attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Logits ``[B, L, V]`` of the noisy copy ``x_t`` run beside the clean copy ``x0`` (module doc);
    ``attention_mask`` ``[B, L]`` (1 = real token) hides padding keys in both copies."""
    b, length = x_t.shape
    size = int(denoiser.block_size)  # type: ignore[arg-type]
    key_mask = two_copy_key_mask(length, size, x_t.device).expand(b, -1, -1)
    if attention_mask is not None:
        real = attention_mask.bool().repeat(1, 2)
        key_mask = key_mask & real[:, None, :]
    cols = torch.arange(length, device=x_t.device).expand(b, length)
    logits, _ = denoiser.core(torch.cat([x_t, x0], dim=1), position_ids=torch.cat([cols, cols], dim=1),
                              key_mask=key_mask, output_positions=cols)
    return logits


def block_diffusion_loss(logits: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor, p_mask: torch.Tensor,
                         answer_mask: torch.Tensor) -> torch.Tensor:
    """``mean_b 1/G_b Σ_{masked i} CE(logits_bi, x0_bi) / p_mask_bi`` (per-block rates)."""
    ce = F.cross_entropy(logits.transpose(1, 2).float(), x0, reduction="none")  # [B, L]
    per_example = (ce * masked / p_mask).sum(1)
    return (per_example / answer_mask.sum(1).clamp(min=1)).mean()
