"""Rollout rows grouped into the windows a step saw, for policies that look at the whole window.

A :class:`~adaptive_decoding.framework.learning.rollouts.RolloutDataset` holds one row per eligible position; the
rows of one step of one sample (same ``sample`` and ``step``) are one window. :func:`to_windows`
pads them into ``X`` ``[N, W, F]`` with ``valid`` ``[N, W]`` (rows sorted by position) and the
labels ``y`` ``[N, W]``; per-position policies use :func:`to_rows` (every row a window of one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adaptive_decoding.framework.learning.rollouts import RolloutDataset


@dataclass
class Windows:
    """Padded windows: ``X`` ``[N, W, F]``, ``valid`` ``[N, W]``, ``y`` ``[N, W]`` (0 where padded),
    and ``group`` ``[N]``: the sample each window came from."""

    X: torch.Tensor
    valid: torch.Tensor
    y: torch.Tensor
    group: torch.Tensor

    def __len__(self) -> int:
        return int(self.X.shape[0])

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.X, self.valid, self.y


def window_keys(data: RolloutDataset) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, window_id)``: row order sorted by (sample, step, position), and each sorted row's window."""
    key = (data.sample * (int(data.step.max()) + 1 if len(data) else 1) + data.step) * (
        int(data.position.max()) + 1 if len(data) else 1) + data.position
    order = torch.argsort(key, stable=True)
    s, t = data.sample[order], data.step[order]
    new = torch.ones(len(order), dtype=torch.bool)
    if len(order) > 1:
        new[1:] = (s[1:] != s[:-1]) | (t[1:] != t[:-1])
    return order, new.long().cumsum(0) - 1


def to_windows(data: RolloutDataset, values: torch.Tensor | None = None) -> Windows:
    """Group rows by (sample, step); ``values`` (default ``data.y``) fills the ``y`` slots."""
    values = data.y if values is None else values
    if not len(data):
        F = data.X.shape[-1]
        return Windows(torch.zeros(0, 1, F), torch.zeros(0, 1, dtype=torch.bool), torch.zeros(0, 1),
                       torch.zeros(0, dtype=torch.long))
    order, wid = window_keys(data)
    n = int(wid[-1]) + 1
    counts = torch.bincount(wid, minlength=n)
    start = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(order)) - start[wid]
    W = int(counts.max())
    X = torch.zeros(n, W, data.X.shape[-1], dtype=data.X.dtype)
    valid = torch.zeros(n, W, dtype=torch.bool)
    y = torch.zeros(n, W, dtype=values.dtype)
    X[wid, slot] = data.X[order]
    valid[wid, slot] = True
    y[wid, slot] = values[order]
    group = torch.zeros(n, dtype=torch.long)
    group[wid] = data.sample[order]
    return Windows(X, valid, y, group)


def to_rows(data: RolloutDataset, values: torch.Tensor | None = None) -> Windows:
    """Every row its own window of one (for the per-position policies)."""
    values = data.y if values is None else values
    return Windows(data.X[:, None], torch.ones(len(data), 1, dtype=torch.bool), values[:, None],
                   data.sample.clone())


def as_windows(kind: str, data: RolloutDataset) -> Windows:
    """The training view of rollout rows for a policy kind: whole windows for the transformer."""
    return to_windows(data) if kind == "transformer" else to_rows(data)
