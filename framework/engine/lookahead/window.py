"""The step's window and the canvas under it, as the lookahead's candidate rows see them.

The loop decodes a window of W columns of the ``[B, L]`` canvas (the current block, or the whole
canvas); ``StepFeatures.window_index`` maps window slots to canvas columns. These helpers read and
write a candidate row's window tokens on its own copy of the canvas.
"""

from __future__ import annotations

import torch

from adaptive_decoding.framework.engine.denoise import token_logprob
from adaptive_decoding.framework.engine.features import StepFeatures


def window_index(f: StepFeatures) -> torch.Tensor:
    """The window's canvas columns ``[B, W]`` (the identity when the window is the whole canvas)."""
    if f.window_index is not None:
        return f.window_index
    return torch.arange(f.x0.shape[1], device=f.x0.device).expand_as(f.x0)


def window_valid(f: StepFeatures) -> torch.Tensor:
    """Which window slots are real ``[B, W]`` (slots past a row's shorter block repeat a column)."""
    if f.window_index is None:
        return torch.ones_like(f.eligible)
    slot = torch.arange(f.x0.shape[1], device=f.x0.device)[None, :]
    return slot < (f.block_end - f.block_start)[:, None]


def write_window(canvas: torch.Tensor, cols: torch.Tensor, win: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``canvas`` ``[N, L]`` with the window's real slots ``win`` ``[N, W]`` written at ``cols`` (a copy)."""
    out = canvas.clone()
    r, c = valid.nonzero(as_tuple=True)
    out[r, cols[r, c]] = win[r, c]
    return out


def step_token_logprob(f: StepFeatures, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) ``[B, W]`` under the step's distribution (from logits, else the confidence)."""
    if f.logits is not None:
        return token_logprob(f.logits, tokens)
    own = torch.where(tokens == f.x0, f.confidence.float(), torch.full_like(f.confidence, 1e-30, dtype=torch.float))
    return own.clamp(min=1e-30).log()
