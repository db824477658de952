"""AUP, *accuracy under parallelism*: one number for a strategy's accuracy–parallelism curve.

The definition is the one of the d3LLM leaderboard (Qian et al., "AUP: when Accuracy Meets
Parallelism in Diffusion Language Models", hao-ai-lab/d3LLM ``AUP_leaderboard``). Symbols:

* ``ρᵢ``: tokens per forward of the strategy's i-th point (generated positions / NFE), ``ρᵢ > 0``;
* ``yᵢ``: its accuracy **in percent** (0–100);
* points are sorted by ``ρ``; ``y₁`` is the accuracy at the lowest ``ρ``;
* points with ``yᵢ < y₁ − δ`` are dropped (``δ = 5`` points);
* ``y_max``: the best accuracy any strategy reaches on the task (the same for every curve of it);
* ``W(y) = min(exp(−α·(1 − y / y_max)), 1)`` with ``α = 3``: the weight that discounts accuracy
  lost against the best strategy;

then, over the kept points::

    AUP = ρ₁·y₁ + Σ_{i ≥ 2} ½·(ρᵢ − ρᵢ₋₁)·(yᵢ·W(yᵢ) + yᵢ₋₁·W(yᵢ₋₁))

The first term is the rectangle under the slowest point and is **not** weighted (as in the
reference), so a single-point strategy has ``AUP = ρ₁·y₁``: a one-token-per-forward reference
scores its accuracy. The sum is the trapezoid area under the weighted curve from ``ρ₁`` on.

Where this differs from the reference code, on purpose:

* the reference asserts that the fastest point is within ``δ`` of ``y₁`` (it refuses a sweep that
  runs into a collapse); here such points are simply dropped, as the definition says, so the
  usable part of any sweep scores;
* points with the same ``ρ`` are ordered by accuracy, best first, so ``y₁`` does not depend on the
  order they were listed in (the reference keeps input order);
* ``y_max = 0`` (nothing correct anywhere) is allowed: every term is then 0 and so is AUP.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Iterable, Mapping, Sequence

ALPHA = 3.0
DROP = 5.0


def weight(y: float, y_max: float, alpha: float = ALPHA) -> float:
    """``W(y) = min(exp(−α(1 − y / y_max)), 1)``; 1 when ``y_max`` is 0 (then ``y`` is 0 too)."""
    if y_max <= 0:
        return 1.0
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)


def _checked(points: Iterable[Sequence[float]]) -> list[tuple[float, float]]:
    pts = []
    for i, p in enumerate(points):
        try:
            rho, y = (float(v) for v in p)
        except (TypeError, ValueError):
            raise ValueError(f"AUP point {i}: {p!r} is not a (tokens per forward, accuracy) pair") from None
        if not math.isfinite(rho) or rho <= 0:
            raise ValueError(f"AUP point {i}: tokens per forward ρ={rho!r} is not allowed; allowed: a "
                             f"finite number > 0")
        if not math.isfinite(y) or not 0.0 <= y <= 100.0:
            raise ValueError(f"AUP point {i}: accuracy y={y!r} is not allowed; allowed: a percentage in [0, "
                             f"100]")
        pts.append((rho, y))
    if not pts:
        raise ValueError("AUP of no points: a strategy needs at least one (tokens per forward, accuracy) "
                         "pair")
    return pts


def kept_points(points: Iterable[Sequence[float]], drop: float = DROP) -> list[tuple[float, float]]:
    """The points AUP integrates: sorted by ``ρ`` (ties: best accuracy first), those with
    ``y < y₁ − drop`` left out."""
    pts = sorted(_checked(points), key=lambda p: (p[0], -p[1]))
    floor = pts[0][1] - drop
    return [p for p in pts if p[1] >= floor]


def aup(points: Iterable[Sequence[float]], y_max: float, *, alpha: float = ALPHA,
        drop: float = DROP) -> float:
    """AUP of one strategy's ``(ρ, y)`` points (``y`` in percent) against the task's ``y_max``.

    Raises ``ValueError`` for no points, ``ρ ≤ 0``, ``y`` outside [0, 100] or ``y_max`` below a point.
    """
    pts = kept_points(points, drop)
    y_max = float(y_max)
    best = max(y for _, y in pts)
    if not math.isfinite(y_max) or y_max < best:
        raise ValueError(f"AUP: y_max={y_max!r} is below this strategy's accuracy {best}; y_max is the best "
                         "accuracy any strategy reaches on the task")
    rho1, y1 = pts[0]
    total = rho1 * y1
    for (r0, y0), (r1, y1_) in pairwise(pts):
        total += 0.5 * (r1 - r0) * (y1_ * weight(y1_, y_max, alpha) + y0 * weight(y0, y_max, alpha))
    return total


def task_aup(curves: Mapping[str, Iterable[Sequence[float]]], **kw: float) -> tuple[dict[str, float], float]:
    """AUP of every curve of one task, with ``y_max`` the best accuracy over all of them:
    ``({curve: AUP}, y_max)``."""
    pts = {name: _checked(p) for name, p in curves.items()}
    if not pts:
        raise ValueError("AUP of a task without strategies")
    y_max = max(y for p in pts.values() for _, y in p)
    return {name: aup(p, y_max, **kw) for name, p in pts.items()}, y_max
