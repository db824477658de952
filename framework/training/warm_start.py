"""Warm-starting a tiny denoiser from a trained one: same architecture, possibly a longer canvas.

A :class:`~adaptive_decoding.framework.models.tiny.TinyDenoiser` has learned absolute positions (``pos``, one row per
canvas position), so a model trained at generation length G cannot decode at 2G. Training the longer
model from scratch repeats what the shorter one already knows; :func:`warm_start` copies every weight
and grows the position table by repeating its last row (the position that, in a task padded with
``[EOS]``, sits deepest in the end-of-text tail). Training then only has to teach the new positions.

The same copy adapts a bidirectional model to block diffusion (``block_size`` set on the new model:
block-causal attention, trained with the two-copy objective of
:mod:`~adaptive_decoding.framework.training.block_diffusion`), as Fast-dLLM v2 and SDAR adapt theirs:
the weights carry over, only the attention mask changes.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from adaptive_decoding.framework.models.saved import CheckpointError
from adaptive_decoding.framework.models.tiny import TinyDenoiser

#: TinyConfig fields that may differ between the source and the warm-started model: the canvas, the
#: dropout, and the block size (a bidirectional model adapted to block diffusion by fine-tuning, as
#: Fast-dLLM v2 and SDAR adapt theirs: the weights are the same, only the attention mask changes)
RESIZABLE = ("max_len", "dropout", "block_size")


def check_compatible(target: TinyDenoiser, source: TinyDenoiser, source_name: str) -> None:
    """Raise :class:`CheckpointError` naming every architecture field (vocabulary ids, widths, attention
    structure) on which ``source`` differs from ``target``, other than the canvas length."""
    want, have = asdict(target.config), asdict(source.config)
    differ = [f"{k}: {have.get(k)!r} (init) vs {v!r} (new)" for k, v in want.items()
              if k not in RESIZABLE and have.get(k) != v]
    if differ:
        raise CheckpointError(f"cannot warm-start from {source_name}: its architecture differs in "
                              + "; ".join(differ) + " (train with the same --size and task vocabulary)")


def warm_start(target: TinyDenoiser, source: TinyDenoiser, source_name: str = "the init model") -> int:
    """Copy ``source``'s weights into ``target`` in place; return how many position rows were added.

    Every tensor is copied as is except the position table ``pos.weight`` ``[max_len, d]``: its first
    ``min(L_src, L_new)`` rows are copied and any further row of ``target`` is the source's last row.
    """
    check_compatible(target, source, source_name)
    state = {k: v.detach().clone() for k, v in source.state_dict().items()}
    pos = state["pos.weight"]
    n_new = target.config.max_len
    if n_new > pos.shape[0]:
        state["pos.weight"] = torch.cat([pos, pos[-1:].expand(n_new - pos.shape[0], -1)], dim=0)
    else:
        state["pos.weight"] = pos[:n_new]
    target.load_state_dict(state, strict=True)
    return max(0, n_new - pos.shape[0])
