"""The canvas layout of a denoiser: full attention (LLaDA-8B, Dream, LLaDA-MoE) or block-causal
(LLaDA2.x, SDAR, Fast-dLLM v2).

A **block-causal** denoiser declares ``block_causal = True`` and its trained ``block_size`` b. Its
canvas is aligned in blocks from position 0: block i holds positions ``[i·b, (i + 1)·b)``, attends
to blocks ``≤ i`` and bidirectionally inside itself. The loop then decodes one such block at a
time: a row whose prompt has P tokens starts with the ``b − P mod b`` generated positions that
share the prompt's last partial block (never editing the prompt), then whole blocks; the last
block ends at the canvas's end (``P + G``). Controllers see the same window and features as on a
full-attention canvas; the layout is the model's and the loop's concern, never the controller's.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from adaptive_decoding.framework.engine.config import DecodeConfig


def model_block_size(model: Any) -> Optional[int]:
    """The trained block size b of a block-causal denoiser, or ``None`` for a full-attention one."""
    if not getattr(model, "block_causal", False):
        return None
    size = getattr(model, "block_size", None)
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{type(model).__name__} declares block_causal but no block_size (got {size!r}); a "
                         "block-causal denoiser names the block size it was trained with")
    return size


def config_for_model(config: DecodeConfig, model: Any) -> DecodeConfig:
    """``config`` checked against the model's layout (:meth:`DecodeConfig.for_layout`): on a
    block-causal model, its blocks and the cache modes that have a meaning there."""
    size = model_block_size(model)
    return config.for_layout("full" if size is None else "block-causal", size)


def first_block_ends(gen_start: torch.Tensor, block_size: int, gen_length: int) -> torch.Tensor:
    """Per row ``[B]``: where its first block ends, relative to the generation. On a block-causal
    canvas the first block is what is left of the block the prompt ends in: ``b − P mod b``."""
    return (block_size - gen_start % block_size).clamp(max=gen_length)
