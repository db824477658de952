"""``sudoku_rules``: a verifier that does not share the denoiser's beliefs: Sudoku's rules.

The denoiser's own joint scores (pseudo-likelihood, recorded probabilities) favour a rollout that
is coherent *with whatever it guessed*, so they cannot tell a wrong guess from a right one
(docs/lookahead.md). This scorer checks a candidate grid against the puzzle instead. With the
grid's n × n cells (n = 4 or 9, boxes of √n × √n; the generation region is the n² cells,
row-major, one token per cell, as in the ``sudoku`` and ``sudoku9`` tasks) and the givens read
from the prompt (its first n² characters among ``1``–``9`` and ``.``), it counts violations v:

* every pair of equal digits in one row, column or box (givens included, so a pair of givens
  never occurs but a decided cell that repeats a given counts);
* a decided cell that is not a digit 1..n, or that overwrites a given with another digit;
* with ``dead_cells``, every undecided cell for which no digit is left (all n appear in its
  row, column and box): a partial grid that can no longer be completed.

``s = −(1 − decay^v)``: 0 for a grid that breaks no rule, −0.5 for one violation at
``decay=0.5``, towards −1. A full grid with v = 0 is a solution.
"""

from __future__ import annotations

from typing import Optional

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.scorer import SCORERS, Candidates, Scorer, ScoringContext
from adaptive_decoding.framework.tasks.sudoku9_solver import grid_units

SIZES = (4, 9)


def count_violations(cells: list[Optional[int]], givens: dict[int, int], n: int, dead_cells: bool = True) -> int:
    """Violations of a grid ``cells`` (a digit, 0 for a decided non-digit, None for undecided)."""
    grid: list[Optional[int]] = [givens.get(i) for i in range(n * n)]
    v = 0
    for i, d in enumerate(cells):
        if d is None:
            continue
        if d == 0 or (i in givens and givens[i] != d):
            v += 1
        if d:
            grid[i] = d
    seen_by_cell: list[set[int]] = [set() for _ in range(n * n)]
    for unit in grid_units(n):
        digits = [grid[i] for i in unit if grid[i]]
        v += sum(k * (k - 1) // 2 for k in (digits.count(d) for d in set(digits)))
        for i in unit:
            seen_by_cell[i].update(digits)
    if dead_cells:
        v += sum(1 for i in range(n * n) if not grid[i] and len(seen_by_cell[i]) >= n)
    return v


def parse_givens(prompt: str, n: int) -> dict[int, int]:
    """The givens of a prompt: its first n² characters among ``1``–``9`` and ``.``."""
    chars = [c for c in prompt if c in "123456789."][: n * n]
    return {i: int(c) for i, c in enumerate(chars) if c != "."}


@SCORERS.register("sudoku_rules", aliases=("rules",))
class SudokuRules(Scorer):
    """Sudoku's rules as a verifier: minus (1 − decay^violations) of the candidate grid."""

    needs_text = True
    params = {
        "decay": Param(float, low=0.0, high=1.0, low_exclusive=True, doc="score = −(1 − decay^violations)"),
        "dead_cells": Param(bool, doc="also count undecided cells with no digit left"),
    }

    def __init__(self, decay: float = 0.5, dead_cells: bool = True) -> None:
        self.decay = decay
        self.dead_cells = dead_cells

    @classmethod
    def conformance_batch(cls) -> tuple[Candidates, ScoringContext]:
        """4 × 4 grids for the scorer conformance suite: a solution, a conflict, a partial grid,
        an undecided one and one with a letter, from two puzzles."""
        tok = _GridTokenizer()
        puzzles = ("1...........3..4=", "..3.............=")  # ragged givens, both solvable
        grids = ("1234341221434321", "1134341221434321", "1234____________", "________________", "12a4341221434321",
                 "4132231414233241")
        ids = torch.tensor([tok.encode(g) for g in grids])
        src = torch.tensor([0, 0, 0, 1, 0, 1])
        cands = Candidates(tokens=ids, source=src, prompt_ids=torch.tensor([tok.encode(puzzles[i]) for i in src.tolist()]),
                           decided=ids != tok.mask_token_id,
                           logprobs=-torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)))
        return cands, ScoringContext(tokenizer=tok, prompt_text=list(puzzles))

    def _score(self, cands: Candidates, context: ScoringContext) -> torch.Tensor:
        g = cands.tokens.shape[1]
        if g == 0:
            return torch.zeros(cands.n, device=cands.tokens.device)
        n = next((s for s in SIZES if s * s == g), None)
        if n is None:
            raise ValueError(f"sudoku_rules scores Sudoku grids: the generation must be n² cells with n in "
                             f"{SIZES} ({[s * s for s in SIZES]}), got G = {g}")
        digit: dict[int, int] = {}

        def as_digit(tok: int) -> int:
            if tok not in digit:
                text = context.decode([tok]).strip()
                digit[tok] = int(text) if len(text) == 1 and text.isdigit() and 1 <= int(text) <= n else 0
            return digit[tok]

        prompts = context.prompt_texts(cands)
        out = []
        for row, ok, prompt in zip(cands.tokens.tolist(), cands.decided.tolist(), prompts):
            cells = [as_digit(t) if d else None for t, d in zip(row, ok)]
            v = count_violations(cells, parse_givens(prompt, n), n, self.dead_cells)
            out.append(-(1.0 - self.decay ** v))
        return torch.tensor(out, dtype=torch.float32, device=cands.tokens.device)


class _GridTokenizer:
    """One id per character of ``0-9 . = a`` and ``_`` for the mask (the conformance batch's)."""

    chars = "0123456789.=a"
    pad_token_id, eos_token_id, mask_token_id = 13, 14, 15

    def encode(self, text: str) -> list[int]:
        return [self.mask_token_id if c == "_" else self.chars.index(c) for c in text]

    def decode(self, ids: list[int], stop_at_eos: bool = True) -> str:
        return "".join(self.chars[i] for i in ids if 0 <= i < len(self.chars))
