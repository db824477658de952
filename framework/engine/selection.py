"""Selection helpers shared by controllers: rank eligible positions, take the top k, never stall.
"""

from __future__ import annotations

import torch

# ---------------------------------------------------------------------- selection helpers
NEG_INF = float("-inf")


def rank_within(scores: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Rank ``[B, L]`` of each eligible position by descending score (0 = best).

    Ties go to the lower position index (stable sort), so decisions are deterministic.
    Ineligible positions get rank ``L`` (never selected).
    """
    b, l = scores.shape  # noqa: E741
    masked_scores = torch.where(eligible, scores.float(), torch.full_like(scores, NEG_INF, dtype=torch.float))
    order = torch.argsort(masked_scores, dim=1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(l, device=scores.device).expand(b, l))
    return torch.where(eligible, ranks, torch.full_like(ranks, l))


def select_topk(scores: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor | int) -> torch.Tensor:
    """Commit mask of the ``k`` best eligible positions per row (``k`` int or long ``[B]``)."""
    ranks = rank_within(scores, eligible)
    k_t = torch.as_tensor(k, device=scores.device).reshape(-1, 1) if not isinstance(k, int) else k
    return eligible & (ranks < k_t)


def ensure_progress(commit: torch.Tensor, eligible: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Add the best eligible position to every row that has eligible positions but no commit."""
    commit = commit & eligible
    stalled = eligible.any(1) & ~commit.any(1)
    if stalled.any():
        best = select_topk(scores, eligible, 1)
        commit = commit | (best & stalled[:, None])
    return commit
