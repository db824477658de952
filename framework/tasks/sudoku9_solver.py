"""9×9 Sudoku arithmetic for :mod:`adaptive_decoding.framework.tasks.sudoku9`: a bitmask solver that counts
solutions (uniqueness), random full grids, puzzle carving and a difficulty grade.

A grid is a tuple of 81 ints in row-major order, 0 for an empty cell, 1–9 for a digit.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from typing import Optional, Sequence

N = 9
CELLS = 81
_ALL = 0x3FE  # bits 1..9


def row_of(i: int) -> int:
    return i // N


def col_of(i: int) -> int:
    return i % N


def box_of(i: int) -> int:
    return (i // 27) * 3 + (i % 9) // 3


@lru_cache(maxsize=None)
def grid_units(n: int) -> tuple[tuple[int, ...], ...]:
    """The 3n units of an n × n Sudoku (n a square: rows, columns, then √n × √n boxes row by row),
    each a tuple of n cell indices (row-major, ascending)."""
    b = math.isqrt(n)
    if b * b != n:
        raise ValueError(f"a Sudoku grid needs a square side (4, 9, ...), got {n}")
    rows = [tuple(r * n + c for c in range(n)) for r in range(n)]
    cols = [tuple(r * n + c for r in range(n)) for c in range(n)]
    boxes = [tuple((br * b + r) * n + bc * b + c for r in range(b) for c in range(b))
             for br in range(b) for bc in range(b)]
    return tuple(rows + cols + boxes)


def units() -> tuple[tuple[int, ...], ...]:
    """The 27 units (9 rows, 9 columns, 9 boxes), each a tuple of 9 cell indices."""
    return grid_units(N)


@lru_cache(maxsize=1)
def peers() -> tuple[frozenset[int], ...]:
    """For each cell, the 20 other cells that share its row, column or box."""
    return tuple(frozenset(j for j in range(81) if j != i and (row_of(i) == row_of(j) or col_of(i) == col_of(j)
                                                            or box_of(i) == box_of(j)))
                 for i in range(81))


def is_valid_solution(grid: Sequence[int]) -> bool:
    """Whether 81 digits form a solved Sudoku (every unit a permutation of 1–9)."""
    if len(grid) != CELLS or any(v not in range(1, 10) for v in grid):
        return False
    return all(len({grid[i] for i in u}) == 9 for u in units())


def _masks(grid: Sequence[int]) -> Optional[tuple[list[int], list[int], list[int]]]:
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    for i, v in enumerate(grid):
        if v:
            bit = 1 << v
            r, c, b = row_of(i), col_of(i), box_of(i)
            if rows[r] & bit or cols[c] & bit or boxes[b] & bit:
                return None  # the givens already clash
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    return rows, cols, boxes


class _OutOfNodes(Exception):
    pass


def solve(grid: Sequence[int], limit: int = 2, rng: Optional[random.Random] = None,
          max_nodes: Optional[int] = None) -> tuple[int, Optional[tuple[int, ...]]]:
    """``(number of solutions found, up to limit; the first solution or None)``.

    Depth-first search that always branches on the empty cell with the fewest candidates; with
    ``rng`` the digits are tried in random order (a random full grid is ``solve([0] * 81, 1, rng)``).
    ``max_nodes`` bounds the search: past it, the solutions found so far are returned.
    """
    masks = _masks(grid)
    if masks is None:
        return 0, None
    rows, cols, boxes = masks
    g = list(grid)
    empty = [i for i in range(CELLS) if not g[i]]
    rcb = [(row_of(i), col_of(i), box_of(i)) for i in range(CELLS)]
    found: list[tuple[int, ...]] = []
    count = 0

    nodes = [0]

    def search() -> None:
        nonlocal count
        nodes[0] += 1
        if max_nodes is not None and nodes[0] > max_nodes:
            raise _OutOfNodes
        best, best_mask, best_n = -1, 0, 10
        for i in empty:
            if g[i]:
                continue
            r, c, b = rcb[i]
            m = _ALL & ~(rows[r] | cols[c] | boxes[b])
            n = bin(m).count("1")
            if n < best_n:
                best, best_mask, best_n = i, m, n
                if n <= 1:
                    break
        if best < 0:
            count += 1
            if not found:
                found.append(tuple(g))
            return
        if best_n == 0:
            return
        digits = [d for d in range(1, 10) if best_mask >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        r, c, b = rcb[best]
        for d in digits:
            bit = 1 << d
            g[best] = d
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            search()
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[b] &= ~bit
            g[best] = 0
            if count >= limit:
                return

    try:
        search()
    except _OutOfNodes:
        pass
    return count, (found[0] if found else None)


def random_grid(rng: random.Random) -> tuple[int, ...]:
    """A uniformly shuffled full grid: random backtracking from the empty grid."""
    _, grid = solve([0] * CELLS, limit=1, rng=rng)
    assert grid is not None
    return grid


def carve(solution: Sequence[int], n_givens: int, rng: random.Random, unique: bool = True) -> tuple[int, ...]:
    """A puzzle of ``solution`` with about ``n_givens`` givens (0 = blank).

    ``unique``: blank cells in random order, keeping a removal only while the puzzle still has one
    solution (the result may keep more givens than asked when no further removal is possible).
    Otherwise: ``n_givens`` random cells stay, whatever the number of solutions.
    """
    order = list(range(CELLS))
    rng.shuffle(order)
    if not unique:
        keep = set(order[:n_givens])
        return tuple(v if i in keep else 0 for i, v in enumerate(solution))
    puzzle = list(solution)
    givens = CELLS
    for i in order:
        if givens <= n_givens:
            break
        v, puzzle[i] = puzzle[i], 0
        if solve(puzzle, limit=2)[0] == 1:
            givens -= 1
        else:
            puzzle[i] = v
    return tuple(puzzle)


GRADES: tuple[str, ...] = ("easy", "medium", "hard")


def grade(puzzle: Sequence[int]) -> str:
    """Deduction technique a puzzle needs: ``easy`` = naked singles alone solve it, ``medium`` = naked
    and hidden singles, ``hard`` = more than singles (pairs, chains or search)."""
    g = list(puzzle)
    hidden_used = False
    while True:
        masks = _masks(g)
        if masks is None:
            return "hard"
        rows, cols, boxes = masks
        cand = {i: _ALL & ~(rows[row_of(i)] | cols[col_of(i)] | boxes[box_of(i)]) for i in range(CELLS) if not g[i]}
        if not cand:
            return "medium" if hidden_used else "easy"
        naked = [(i, m.bit_length() - 1) for i, m in cand.items() if m and m & (m - 1) == 0]
        if naked:
            for i, d in naked:
                g[i] = d
            continue
        single = next(((spots[0], d) for u in units() for d in range(1, 10)
                       for spots in [[i for i in u if i in cand and cand[i] >> d & 1]] if len(spots) == 1), None)
        if single is None:
            return "hard"
        g[single[0]] = single[1]  # one hidden single, then the candidates are recomputed
        hidden_used = True
