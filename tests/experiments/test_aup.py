"""AUP (accuracy under parallelism, d3LLM's definition) on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from adaptive_decoding.experiments.aup import aup, kept_points, task_aup, weight


def test_three_points_by_hand():
    # y_max = 100, points (ρ, y) = (1, 90), (2, 88), (4, 85); y₁ − 5 = 85, so all three are kept.
    #   W(90) = exp(−3·0.10) = exp(−0.30) = 0.740818221  → 90·W = 66.673640
    #   W(88) = exp(−3·0.12) = exp(−0.36) = 0.697676326  → 88·W = 61.395517
    #   W(85) = exp(−3·0.15) = exp(−0.45) = 0.637628152  → 85·W = 54.198393
    #   AUP = 1·90                                   (first rectangle, unweighted)  =  90
    #       + ½·(2 − 1)·(61.395517 + 66.673640)                                    =  64.034578
    #       + ½·(4 − 2)·(54.198393 + 61.395517)                                    = 115.593910
    #       = 269.628488
    assert aup([(4, 85), (1, 90), (2, 88)], 100) == pytest.approx(269.628488, abs=1e-5)  # any input order
    assert weight(90, 100) == pytest.approx(0.740818221, abs=1e-9)
    assert weight(100, 100) == 1.0 and weight(101, 100) == 1.0  # W is capped at 1


def test_points_more_than_five_below_the_first_are_dropped():
    # y₁ = 90 at the lowest ρ, so the floor is 85: (2, 84.9) is dropped, (3, 86) is kept and the
    # trapezoid spans ρ = 1 → 3 directly:
    #   W(86) = exp(−0.42) = 0.657046820 → 86·W = 56.506027
    #   AUP = 90 + ½·(3 − 1)·(56.506027 + 66.673640) = 90 + 123.179667 = 213.179667
    pts = [(1, 90), (2, 84.9), (3, 86)]
    assert kept_points(pts) == [(1.0, 90.0), (3.0, 86.0)]
    assert aup(pts, 100) == pytest.approx(213.179667, abs=1e-5)
    assert kept_points([(1, 90), (2, 85)]) == [(1.0, 90.0), (2.0, 85.0)]  # exactly y₁ − 5 stays


def test_a_single_point_is_its_unweighted_rectangle():
    # d3LLM's get_aup starts from ρ₁·y₁ with no weight and adds only trapezoids between points,
    # so one point scores ρ₁·y₁ even when it is below y_max: the reference (ρ = 1) scores its accuracy.
    assert aup([(1.0, 70.0)], 100) == pytest.approx(70.0)
    assert aup([(2.5, 80.0)], 95) == pytest.approx(200.0)


def test_task_aup_takes_y_max_over_every_curve():
    scores, y_max = task_aup({"seq": [(1, 92)], "fast": [(1.5, 90), (3, 88)]})
    assert y_max == 92
    w90, w88 = math.exp(-3 * (1 - 90 / 92)), math.exp(-3 * (1 - 88 / 92))
    assert scores == {"seq": pytest.approx(92.0),
                      "fast": pytest.approx(1.5 * 90 + 0.75 * (88 * w88 + 90 * w90))}
    assert task_aup({"a": [(1, 0)], "b": [(2, 0), (4, 0)]}) == ({"a": 0.0, "b": 0.0}, 0.0)  # nothing correct


@pytest.mark.parametrize("points, y_max, match", [
    ([], 100, "no points"),
    ([(-1.0, 50.0)], 100, r"ρ=-1.0 is not allowed; allowed: a finite number > 0"),
    ([(0.0, 50.0)], 100, r"ρ=0.0"),
    ([(1.0, 0.9), (2.0, 101.0)], 101, r"point 1: accuracy y=101.0 .* percentage in \[0, 100\]"),
    ([(1.0, float("nan"))], 100, "accuracy y=nan"),
    ([(1.0,)], 100, "not a \\(tokens per forward, accuracy\\) pair"),
    ([(1.0, 90.0)], 80, "y_max=80.0 is below this strategy's accuracy 90.0"),
])
def test_bad_input_is_refused_with_a_clear_message(points, y_max, match):
    with pytest.raises(ValueError, match=match):
        aup(points, y_max)


# The d3LLM leaderboard's own data (hao-ai-lab/d3LLM, AUP_leaderboard/data_llada.yaml): per task, each
# method's (tokens per forward, accuracy in percent) points, as that file lists them.
LEADERBOARD_LLADA = {
    "GSM8K-CoT": {
        "Qwen-2.5-7B-it": [(1.0, 74.1)],
        "LLaDA": [(1.0, 72.55)],
        "Fast-dLLM-LLaDA": [(1.0, 74.79), (2.77, 74.68)],
        "D2F": [(1.0, 74.98), (2.88, 74.39)],
        "dParallel-LLaDA": [(1.0, 74.0), (5.14, 72.63)],
        "d3LLM-LLaDA": [(1.0, 74.02), (9.11, 73.09)],
    },
    "MATH": {
        "Qwen-2.5-7B-it": [(1.0, 41.15)],
        "LLaDA": [(1.0, 32.2)],
        "Fast-dLLM-LLaDA": [(1.0, 32.1), (1.97, 30.82)],
        "D2F": [(1.0, 29.1), (2.66, 28.94)],
        "dParallel-LLaDA": [(1.0, 32.0), (3.17, 30.18)],
        "d3LLM-LLaDA": [(1.0, 32.76), (5.74, 30.36)],
    },
    "MBPP": {
        "Qwen-2.5-7B-it": [(1.0, 63.6)],
        "LLaDA": [(1.0, 41.72)],
        "Fast-dLLM-LLaDA": [(1.0, 41.58), (2.13, 38.6)],
        "D2F": [(1.0, 39.1), (2.13, 39.0)],
        "dParallel-LLaDA": [(1.0, 41.62), (2.35, 40.0)],
        "d3LLM-LLaDA": [(1.0, 42.0), (4.21, 40.6)],
    },
    "HumanEval": {
        "Qwen-2.5-7B-it": [(1.0, 67.73)],
        "LLaDA": [(1.0, 38.28)],
        "Fast-dLLM-LLaDA": [(1.0, 38.16), (2.56, 37.8)],
        "D2F": [(1.0, 41.02), (2.69, 40.64)],
        "dParallel-LLaDA": [(1.0, 39.68), (4.93, 39.02)],
        "d3LLM-LLaDA": [(1.0, 39.8), (5.95, 39.63)],
    },
    "Long-GSM8K": {
        "Qwen-2.5-7B-it": [(1.0, 82.56)],
        "LLaDA": [(1.0, 78.58)],
        "Fast-dLLM-LLaDA": [(1.0, 78.45), (2.45, 78.01)],
        "D2F": [(1.0, 76.0), (2.7, 75.66)],
        "dParallel-LLaDA": [(1.0, 79.15), (4.49, 76.65)],
        "d3LLM-LLaDA": [(1.0, 78.32), (6.95, 74.22)],
    },
}

# The AUP values the leaderboard publishes (asset/imgs/dllm_leaderboard.png, one decimal; its "Avg
# AUP" is the mean over the five tasks).
PUBLISHED_AUP = {
    "d3LLM-LLaDA": {"GSM8K-CoT": 637.7, "MATH": 107.6, "MBPP": 88.4, "HumanEval": 96.6, "Long-GSM8K": 441.1},
    "dParallel-LLaDA": {"GSM8K-CoT": 358.1, "MATH": 64.5, "MBPP": 60.5, "HumanEval": 83.7, "Long-GSM8K": 309.1},
}
PUBLISHED_AVERAGE = {"d3LLM-LLaDA": 274.3, "dParallel-LLaDA": 175.2}


@pytest.mark.parametrize("method", sorted(PUBLISHED_AUP))
def test_reproduces_the_d3llm_leaderboard_from_its_own_data(method):
    """``task_aup`` (y_max over every method of the task) gives the leaderboard's published AUP to its
    precision. This project's two deviations (drop instead of refuse, ties by accuracy) change none of
    these values: no listed point is more than 5 below its method's first one, and no ρ repeats."""
    scores = {task: task_aup(methods)[0][method] for task, methods in LEADERBOARD_LLADA.items()}
    assert {task: round(v, 1) for task, v in scores.items()} == PUBLISHED_AUP[method]
    assert round(sum(scores.values()) / len(scores), 1) == PUBLISHED_AVERAGE[method]
    for methods in LEADERBOARD_LLADA.values():
        for pts in methods.values():
            assert kept_points(pts) == sorted((float(r), float(y)) for r, y in pts)
