"""``sudoku_rules``: Sudoku's rules as a lookahead verifier, on designed grids."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.engine.scorer import Candidates, ScoringContext, build_scorer
from adaptive_decoding.framework.tasks.sudoku9_solver import grid_units, units
from adaptive_decoding.framework.testing.toys import CharTokenizer
from adaptive_decoding.scorers.sudoku_rules import count_violations, parse_givens

TOK = CharTokenizer()
SOLUTION = "1234341221434321"  # a valid 4 x 4 grid


def grid_candidates(grids):
    ids = torch.tensor([[TOK.mask_token_id if ch == "_" else TOK.encode(ch)[0] for ch in g] for g in grids])
    return Candidates(tokens=ids, decided=ids != TOK.mask_token_id)


def cells(grid):
    return [None if ch == "_" else int(ch) for ch in grid]


def test_units_of_a_4x4_and_a_9x9_grid():
    u4 = grid_units(4)
    assert len(u4) == 12 and (0, 1, 4, 5) in u4 and (0, 4, 8, 12) in u4
    u9 = grid_units(9)
    assert len(u9) == 27 and all(len(u) == 9 for u in u9) and (60, 61, 62, 69, 70, 71, 78, 79, 80) in u9
    assert u9 == units()  # the 9 x 9 solver's units are the general ones
    with pytest.raises(ValueError, match="square side"):
        grid_units(5)


def test_violations_counted_exactly():
    assert count_violations(cells(SOLUTION), {}, 4) == 0
    # cell 1 = 1 instead of 2: a pair in row 0, one in box 0; column 1 now holds 1 twice (cells 1 and 13)
    assert count_violations(cells("1134" + SOLUTION[4:]), {}, 4) == 3
    assert count_violations(cells(SOLUTION), {0: 2}, 4) == 1  # overwrites a given (the grid keeps its own 1)
    assert count_violations(cells("_" + SOLUTION[1:]), {0: 2}, 4) == 3  # the given 2 repeats in row, column, box
    # three equal digits in a row are three pairs
    assert count_violations(cells("111_" + "_" * 12), {}, 4, dead_cells=False) == 3 + 1  # + box 0's pair (0, 1)
    # cell 3 can take nothing: its row holds 1 2 3, its column 4
    assert count_violations(cells("123_" + "___4" + "_" * 8), {}, 4) == 1
    assert count_violations(cells("123_" + "___4" + "_" * 8), {}, 4, dead_cells=False) == 0
    assert count_violations([0] + [None] * 15, {}, 4) == 1  # a decided cell that is not a digit


def test_the_scorer_ranks_the_solution_first():
    puzzle = "1..." + "." * 12 + "="
    c = grid_candidates([SOLUTION, "1134" + SOLUTION[4:], "1234" + "_" * 12, "_" * 16])
    ctx = ScoringContext(tokenizer=TOK, prompt_text=[puzzle])
    c.source = torch.zeros(4, dtype=torch.long)
    s = build_scorer("sudoku_rules").score(c, ctx).tolist()
    assert s == pytest.approx([0.0, -(1 - 0.5 ** 3), 0.0, 0.0])
    assert build_scorer("sudoku_rules", decay=0.9).score(c, ctx)[1].item() == pytest.approx(-(1 - 0.9 ** 3))


def test_givens_are_read_from_the_prompt_and_a_wrong_size_is_refused():
    assert parse_givens("1.3.|....|....|...4=", 4) == {0: 1, 2: 3, 15: 4}
    assert parse_givens("." * 80 + "9=", 9) == {80: 9}
    with pytest.raises(ValueError, match="n² cells with n in \\(4, 9\\).*got G = 5"):
        build_scorer("sudoku_rules").score(grid_candidates(["12341"]), ScoringContext(tokenizer=TOK))
