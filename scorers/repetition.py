"""``repetition``: an n-gram repetition penalty.

``s = −r`` with r the fraction of the candidate's n-grams (over decided, non-special tokens,
``n`` consecutive positions all decided) that repeat an earlier n-gram of the same candidate:
``r = (#n-grams − #distinct) / #n-grams``; 0 when there is no complete n-gram. Batched: n-grams are
hashed with SplitMix64, sorted per row, and equal neighbours counted.
"""

from __future__ import annotations

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.core.rng import mix64
from adaptive_decoding.framework.engine.scorer import SCORERS, Candidates, Scorer, ScoringContext


def repeated_fraction(tokens: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
    """Fraction ``[N]`` of complete n-grams that repeat an earlier one in their row."""
    rows, g = tokens.shape
    if g < n:
        return torch.zeros(rows, device=tokens.device)
    h = torch.zeros(rows, g - n + 1, dtype=torch.long, device=tokens.device)
    ok = torch.ones_like(h, dtype=torch.bool)
    for j in range(n):  # n is a small constant (the n-gram order), not a loop over candidates
        h = mix64(h * 31 + tokens[:, j : g - n + 1 + j] + 1)
        ok = ok & valid[:, j : g - n + 1 + j]
    h = (h >> 1) & ((1 << 62) - 1)  # non-negative
    filler = -torch.arange(1, h.shape[1] + 1, device=h.device).expand_as(h)  # distinct, never equal
    h = torch.where(ok, h, filler)
    s = h.sort(1).values
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    total = ok.sum(1)
    return torch.where(total > 0, dup.sum(1).float() / total.clamp(min=1), torch.zeros(rows, device=h.device))


@SCORERS.register("repetition", aliases=("ngram_repetition",))
class Repetition(Scorer):
    """n-gram repetition penalty: minus the fraction of repeated n-grams."""

    params = {
        "n": Param(int, low=1, high=8, doc="n-gram order", tune=(1, 4)),
        "ignore_special": Param(bool, doc="skip EOS / PAD / mask tokens (a run of EOS is no repetition)"),
    }

    def __init__(self, n: int = 2, ignore_special: bool = True) -> None:
        self.n = n
        self.ignore_special = ignore_special

    def _score(self, c: Candidates, context: ScoringContext) -> torch.Tensor:
        valid = c.decided.clone()
        if self.ignore_special:
            for sid in context.specials():
                valid &= c.tokens != sid
        return -repeated_fraction(c.tokens, valid, int(self.n))
