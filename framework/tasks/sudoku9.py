"""``sudoku9``: 9×9 Sudoku, the benchmark of "Train for the Worst, Plan for the Best" (Kim et al.,
2025, arXiv 2502.06768), graded by difficulty.

Layout: the prompt is the puzzle, 81 cells row-major (``1``–``9`` or ``.``) and ``=``; the answer
is the full grid, 81 digits (G = 81). A deduction needs earlier commitments, so the order in which
a decoder commits cells decides whether it solves the puzzle: the task where the paper finds
random order 6.9 %, top-probability order 18.5 % and top-margin order 89.5 %.

* ``unique=True`` (default): every test puzzle has exactly one solution, carved from a random
  full grid; ``grade`` keeps only ``easy`` (naked singles suffice), ``medium`` (hidden singles) or
  ``hard`` (more than singles) puzzles.
* ``unique=False``: ``n`` random givens whatever the number of solutions: several valid joint
  modes, scored by validity (the 9×9 version of "New Francisco": two cells of a row committed
  together may both take the same digit).

Training examples (split ``train``) are always random-givens puzzles, from 17 to 50 givens, since
carving unique puzzles costs milliseconds each; the answer is the grid they were drawn from.
"""

from __future__ import annotations

import random
from typing import Optional, Sequence

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import TASKS, Example, Recipe, Task, fold_whitespace
from adaptive_decoding.framework.tasks.sudoku9_solver import (
    CELLS,
    GRADES,
    carve,
    grade,
    is_valid_solution,
    random_grid,
    solve,
)
from adaptive_decoding.framework.tasks.vocab import VOCAB

#: givens of the training puzzles (uniform), wide enough to cover every test variant
TRAIN_GIVENS: tuple[int, int] = (17, 50)
#: search nodes :meth:`Sudoku9Task.completable` gives the solver before it answers no
SOLVER_NODES = 2000
_EXAMPLES: dict[tuple, list[Example]] = {}


@TASKS.register("sudoku9", aliases=("sudoku_9x9",))
class Sudoku9Task(Task):
    """9×9 Sudoku (unique solutions, graded by difficulty, or open puzzles scored by validity)."""

    metric = "valid completion"
    vocabulary = VOCAB
    # 163-token canvas, peer-masked attention: ~0.8 s a step on 2 cores at batch 64
    recipe = Recipe(size="medium", max_minutes=25.0, max_steps=2000, batch_size=64, lr=1e-3,
                    warmup_steps=100, val_size=128, val_every=500, n_test=300)
    model_name = "tiny-sudoku9"
    model_description = "9x9 Sudoku, Transformer with row/column/box attention"
    params = {
        "min_givens": Param(int, low=17, high=80, doc="fewest givens of a test puzzle"),
        "max_givens": Param(int, low=17, high=80, doc="most givens (a unique puzzle may keep more when no "
                                                      "further cell can be blanked)"),
        "unique": Param(bool, doc="test puzzles with exactly one solution (else random givens)"),
        "grade": Param(str, choices=("any",) + GRADES,
                       doc="keep only puzzles of this difficulty: easy = naked singles suffice, medium = "
                           "hidden singles, hard = more than singles (unique puzzles only)"),
    }

    def __init__(self, min_givens: int = 25, max_givens: int = 36, unique: bool = True, grade: str = "any") -> None:
        self.min_givens = min_givens
        self.max_givens = max_givens
        self.unique = unique
        self.grade = grade

    def check_combination(self) -> None:
        if self.min_givens > self.max_givens:
            raise ParameterError(f"sudoku9.min_givens={self.min_givens} is larger than max_givens={self.max_givens}")
        if self.grade != "any" and not self.unique:
            raise ParameterError(f"sudoku9.grade={self.grade!r} needs unique=true (a grade is defined for "
                                 f"puzzles with one solution)")

    @property
    def gen_length(self) -> int:
        return CELLS

    @property
    def max_prompt_length(self) -> int:
        return CELLS + 1  # the cells and '='

    @property
    def attention_structure(self) -> Optional[dict]:
        """Where the cells lie on the canvas, for a denoiser whose attention is restricted to a
        cell's row, column and box (:mod:`adaptive_decoding.framework.models.structure`)."""
        return {"kind": "sudoku", "size": 9, "offsets": [0, CELLS + 1]}

    @staticmethod
    def format_puzzle(puzzle: tuple[int, ...]) -> str:
        return "".join(str(v) if v else "." for v in puzzle) + "="

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        solution = random_grid(rng)
        n = rng.randint(self.min_givens, self.max_givens)
        puzzle = carve(solution, n, rng, unique=self.unique)
        meta = {"givens": {i: v for i, v in enumerate(puzzle) if v}}
        if self.unique:
            meta["grade"] = grade(puzzle)
        return self.format_puzzle(puzzle), "".join(map(str, solution)), meta

    def _sample_train(self, rng: random.Random) -> tuple[str, str, dict]:
        solution = random_grid(rng)
        puzzle = carve(solution, rng.randint(*TRAIN_GIVENS), rng, unique=False)
        return self.format_puzzle(puzzle), "".join(map(str, solution)), {"givens": {i: v for i, v in enumerate(puzzle) if v}}

    def _sample_for(self, split: str, rng: random.Random) -> Optional[tuple[str, str, dict]]:
        """``train`` draws fast random-givens puzzles, the other splits carve (unique, graded) test
        puzzles and reject those of another grade. The split still comes from the prompt's hash."""
        if split == "train":
            return self._sample_train(rng)
        drawn = self._sample(rng)
        return None if self.grade != "any" and drawn[2].get("grade") != self.grade else drawn

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """As :meth:`Task.examples`, memoised per process: carving unique test puzzles costs about
        0.1 s each, and a benchmark asks for the same ones in every cell."""
        key = (tuple(sorted(self.get_params().items())), split, n, seed)
        if key not in _EXAMPLES:
            _EXAMPLES[key] = super().examples(split, n, seed)
        return list(_EXAMPLES[key])

    @staticmethod
    def parse_givens(prompt: str) -> dict[int, int]:
        cells = [c for c in prompt if c in "123456789."]
        if len(cells) != CELLS:
            raise ValueError(f"sudoku9 prompt {prompt!r} does not have 81 cells")
        return {i: int(c) for i, c in enumerate(cells) if c != "."}

    def completable(self, example: Example, tokens: Sequence[int], committed: Sequence[bool]) -> Optional[bool]:
        """The committed digits (with the givens) still admit a solution: they agree with the answer,
        or (any puzzle but a carved unique one, whose one solution is the answer) :func:`solve` finds a
        solution within :data:`SOLVER_NODES` search nodes (past them the answer is no: conservative,
        for labels). A committed non-digit is never completable."""
        grid = [0] * CELLS
        for i, given in (example.meta.get("givens") or self.parse_givens(example.prompt)).items():
            grid[int(i)] = int(given)
        for i in range(min(CELLS, len(tokens))):
            if committed[i]:
                text = self.tokenizer.decode([int(tokens[i])], stop_at_eos=False)
                if len(text) != 1 or text not in "123456789" or grid[i] not in (0, int(text)):
                    return False
                grid[i] = int(text)
        answer = fold_whitespace(example.answer).replace(" ", "")
        if all(g == int(a) for g, a in zip(grid, answer) if g):  # the answer itself completes it
            return True
        if "grade" in example.meta:  # a carved puzzle: its one solution is the answer
            return False
        return solve(grid, limit=1, max_nodes=SOLVER_NODES)[0] >= 1

    def score(self, example: Example, output_text: str) -> float:
        """1.0 if the output is a solved grid that keeps every given, else 0.0."""
        text = fold_whitespace(output_text).replace(" ", "")
        if len(text) != CELLS or not text.isdigit():
            return 0.0
        grid = [int(c) for c in text]
        givens = example.meta.get("givens") or self.parse_givens(example.prompt)
        if any(grid[int(i)] != int(v) for i, v in givens.items()):
            return 0.0
        return float(is_valid_solution(grid))
