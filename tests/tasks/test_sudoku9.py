"""9×9 Sudoku: the solver's counts, carving, the difficulty grade, the task's splits and scoring."""

from __future__ import annotations

import itertools
import random

import pytest

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.tasks.sudoku9_solver import (
    carve,
    grade,
    is_valid_solution,
    random_grid,
    solve,
)

# Arto Inkala's 2012 puzzle: one solution, far beyond singles
INKALA = "800000000003600000070090200050007000000045700000100030001000068008500010090000400"


def _grid(text: str) -> list[int]:
    return [int(c) for c in text]


def test_solver_counts_unique_multiple_and_clashing_puzzles():
    count, sol = solve(_grid(INKALA))
    assert count == 1 and is_valid_solution(sol)
    assert all(sol[i] == v for i, v in enumerate(_grid(INKALA)) if v)
    assert solve([0] * 81, limit=2)[0] == 2  # the empty grid has many solutions; counting stops at 2
    clash = [0] * 81
    clash[0] = clash[1] = 5  # two 5s in a row
    assert solve(clash) == (0, None)


def test_random_grid_is_valid_and_seeded():
    a, b = random_grid(random.Random(1)), random_grid(random.Random(1))
    assert a == b and is_valid_solution(a)
    assert random_grid(random.Random(2)) != a


def test_carve_keeps_uniqueness_and_the_given_count():
    rng = random.Random(0)
    sol = random_grid(rng)
    puzzle = carve(sol, 28, rng, unique=True)
    assert solve(puzzle)[0] == 1
    assert sum(1 for v in puzzle if v) >= 28
    assert all(v in (0, s) for v, s in zip(puzzle, sol))
    open_puzzle = carve(sol, 20, rng, unique=False)
    assert sum(1 for v in open_puzzle if v) == 20


def test_grade_orders_techniques():
    sol = random_grid(random.Random(3))
    one_blank = list(sol)
    one_blank[40] = 0
    assert grade(one_blank) == "easy"
    # the Inkala puzzle needs more than singles
    assert grade(_grid(INKALA)) == "hard"


def test_hidden_single_puzzle_is_medium():
    # search a few carved puzzles for one that singles solve only with hidden singles
    rng = random.Random(5)
    grades = {grade(carve(random_grid(rng), 30, rng)) for _ in range(25)}
    assert "medium" in grades and "easy" in grades


def test_task_splits_are_disjoint_and_graded():
    task = get_task("sudoku9", min_givens=30, max_givens=34, grade="easy")
    test = task.examples("test", 6)
    train = list(itertools.islice(task.iter_examples("train"), 300))
    assert {e.prompt for e in test}.isdisjoint({e.prompt for e in train})
    assert all(e.meta["grade"] == "easy" for e in test)
    assert all(len(task.prompt_ids(e)) == 82 and len(task.target_ids(e)) == 81 for e in test)
    assert task.examples("test", 6) == test  # memoised and deterministic


def test_score_accepts_any_valid_completion_and_rejects_changed_givens():
    task = get_task("sudoku9", min_givens=17, max_givens=17, unique=False)
    ex = task.examples("test", 1)[0]
    assert task.score(ex, ex.answer) == 1.0
    givens = ex.meta["givens"]
    # another solution of the same open puzzle, from the solver, also scores 1
    puzzle = [givens.get(i, 0) for i in range(81)]
    other = solve(puzzle, limit=1, rng=random.Random(9))[1]
    assert task.score(ex, "".join(map(str, other))) == 1.0
    broken = list(ex.answer)
    i = next(iter(givens))
    broken[i] = str(givens[i] % 9 + 1)
    assert task.score(ex, "".join(broken)) == 0.0
    assert task.score(ex, ex.answer[:-1]) == 0.0


def test_bad_parameters_name_the_value():
    with pytest.raises(ParameterError, match="min_givens=40 is larger than max_givens=30"):
        get_task("sudoku9", min_givens=40, max_givens=30)
    with pytest.raises(ParameterError, match="grade='hard' needs unique=true"):
        get_task("sudoku9", unique=False, grade="hard")
    with pytest.raises(ParameterError, match="grade"):
        get_task("sudoku9", grade="fiendish")
