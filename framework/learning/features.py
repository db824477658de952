"""The learned policies' feature vector φ per eligible position (:data:`FEATURE_NAMES`).
"""

from __future__ import annotations

import torch

from framework.engine.features import StepFeatures
from framework.engine.selection import rank_within

#: φ, in column order. Every entry is per position; per-sample ones are broadcast over the row.
FEATURE_NAMES: tuple[str, ...] = (
    "confidence",          # p(x0)
    "margin",              # top1 − top2
    "entropy",             # H = −Σ p log p (nats)
    "top2_prob",           # p of the runner-up
    "position_in_block",   # (i − block_start) / block length, in [0, 1)
    "position_frac",       # i / G
    "progress",            # fraction of the G positions already decided
    "block_progress",      # 1 − eligible / masked-at-block-start
    "confidence_rank",     # rank by confidence among the eligible / #eligible (0 = most confident)
    "relative_confidence",  # confidence / the row's highest eligible confidence
    "left_decided",        # position i − 1 is not masked (prompt or committed)
    "right_decided",       # position i + 1 is not masked (committed, padding or past the end)
    "eligible_frac",       # #eligible / G
)


def feature_matrix(f: StepFeatures, gen_length: int) -> torch.Tensor:
    """φ for every position, float32 ``[B, L, len(FEATURE_NAMES)]`` (meaningful where eligible)."""
    el = f.eligible
    n_el = f.n_eligible.clamp(min=1).float()[:, None]
    conf = f.confidence.float()
    best = torch.where(el, conf, torch.zeros_like(conf)).amax(1, keepdim=True).clamp(min=1e-12)
    rank = rank_within(conf, el).float() / n_el
    decided = ~f.masked
    left = torch.ones_like(decided)
    left[:, 1:] = decided[:, :-1]
    right = torch.ones_like(decided)
    right[:, :-1] = decided[:, 1:]
    block_prog = 1.0 - f.n_eligible.float() / f.block_masked_at_start.clamp(min=1).float()
    shape = conf.shape
    row = lambda t: t.float()[:, None].expand(shape)  # noqa: E731
    cols = [
        conf, f.margin.float(), f.entropy.float(), f.top2_prob.float(), f.position_in_block.float(),
        f.position.float() / float(gen_length), row(f.progress), row(block_prog), rank,
        conf / best, left.float(), right.float(), row(f.n_eligible.float() / float(gen_length)),
    ]
    return torch.stack(cols, dim=-1)
