"""``sudoku``: 4x4 Sudoku completion, scored by validity (several solutions may be right).
"""

from __future__ import annotations

import itertools
import random
from functools import lru_cache

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import TASKS, Example, Recipe, Task, fold_whitespace
from adaptive_decoding.framework.tasks.sudoku9_solver import grid_units
from adaptive_decoding.framework.tasks.vocab import VOCAB


# ====================================================================== sudoku
@lru_cache(maxsize=1)
def sudoku_solutions() -> tuple[tuple[int, ...], ...]:
    """All 288 valid 4x4 Sudoku grids (row-major, digits 1-4)."""
    perms = list(itertools.permutations(range(1, 5)))
    out = []

    def ok(rows: list[tuple[int, ...]]) -> bool:
        r = len(rows)
        for c in range(4):
            col = [row[c] for row in rows]
            if len(set(col)) != r:
                return False
        if r % 2 == 0:
            for bc in (0, 2):
                box = rows[r - 2][bc : bc + 2] + rows[r - 1][bc : bc + 2]
                if len(set(box)) != 4:
                    return False
        return True

    def extend(rows: list[tuple[int, ...]]) -> None:
        if len(rows) == 4:
            out.append(tuple(v for row in rows for v in row))
            return
        for p in perms:
            if ok(rows + [p]):
                extend(rows + [p])

    extend([])
    return tuple(out)


def sudoku_valid(grid: list[int]) -> bool:
    """Whether 16 digits form a valid 4x4 Sudoku (rows, columns, 2x2 boxes are permutations of 1-4)."""
    if len(grid) != 16 or any(v not in (1, 2, 3, 4) for v in grid):
        return False
    return all(len({grid[i] for i in u}) == 4 for u in grid_units(4))


@lru_cache(maxsize=1)
def _agreement_masks() -> tuple[tuple[int, ...], ...]:
    """``masks[j][k]``: bit ``i`` set where solutions ``j`` and ``k`` agree at cell ``i``."""
    sols = sudoku_solutions()
    return tuple(tuple(sum(1 << i for i in range(16) if a[i] == b[i]) for b in sols) for a in sols)


def sudoku_completions(givens: dict[int, int]) -> list[tuple[int, ...]]:
    """Every valid grid consistent with ``givens`` (cell index -> digit)."""
    return [s for s in sudoku_solutions() if all(s[int(i)] == int(v) for i, v in givens.items())]


@TASKS.register("sudoku")
class SudokuTask(Task):
    """4x4 Sudoku with a unique solution; any valid completion consistent with the givens scores 1."""

    metric = "valid completion"
    vocabulary = VOCAB
    recipe = Recipe(max_steps=2000)  # val 100 % from ~500 steps
    model_name = "tiny-sudoku"
    model_description = "4x4 Sudoku, tiny bidirectional Transformer"
    params = {
        "min_blanks": Param(int, low=1, high=12, doc="fewest blank cells"),
        "max_blanks": Param(int, low=1, high=12, doc="most blank cells (fewer if uniqueness needs it)"),
    }

    def __init__(self, min_blanks: int = 8, max_blanks: int = 12) -> None:
        self.min_blanks = min_blanks
        self.max_blanks = max_blanks

    def check_combination(self) -> None:
        if self.min_blanks > self.max_blanks:
            raise ParameterError(
                f"sudoku.min_blanks={self.min_blanks} is larger than max_blanks={self.max_blanks}"
            )

    @property
    def gen_length(self) -> int:
        return 16

    @property
    def max_prompt_length(self) -> int:
        return 20  # 16 cells, 3 '|', '='

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        sols = sudoku_solutions()
        j = rng.randrange(len(sols))
        sol = sols[j]
        target = rng.randint(self.min_blanks, self.max_blanks)
        agree = _agreement_masks()[j]  # bit i of agree[k]: solution k equals sol at cell i
        givens = (1 << 16) - 1
        order = list(range(16))
        rng.shuffle(order)
        blanks: list[int] = []
        for cell in order:
            if len(blanks) >= target:
                break
            trial = givens & ~(1 << cell)
            if sum(1 for m in agree if m & trial == trial) == 1:  # still a unique solution
                givens = trial
                blanks.append(cell)
        cells = [str(sol[i]) if givens >> i & 1 else "." for i in range(16)]
        prompt = "|".join("".join(cells[r * 4 : r * 4 + 4]) for r in range(4)) + "="
        return prompt, "".join(map(str, sol)), {"givens": {i: sol[i] for i in range(16) if givens >> i & 1},
                                                 "blanks": sorted(blanks)}

    @staticmethod
    def parse_givens(prompt: str) -> dict[int, int]:
        cells = [c for c in prompt if c in "1234."]
        if len(cells) != 16:
            raise ValueError(f"sudoku prompt {prompt!r} does not have 16 cells")
        return {i: int(c) for i, c in enumerate(cells) if c != "."}

    def score(self, example: Example, output_text: str) -> float:
        text = fold_whitespace(output_text).replace("|", "")
        if len(text) != 16 or not text.isdigit():
            return 0.0
        grid = [int(c) for c in text]
        givens = example.meta.get("givens") or self.parse_givens(example.prompt)
        if any(grid[int(i)] != int(v) for i, v in givens.items()):
            return 0.0
        return float(sudoku_valid(grid))
