"""The first-step ceiling's arithmetic on designed rows, and the whole measurement on a toy."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.experiments.studies.first_step_ceiling import (
    adaptive_count,
    clean_prefix,
    global_cut,
    ranking_auc,
    report,
)


def test_clean_prefix_counts_blanks_ranked_before_the_first_wrong_one():
    score = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5], [0.1, 0.9, 0.95, 0.2, 0.3], [0.5, 0.4, 0.3, 0.2, 0.1]])
    right = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    blank = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 1, 0, 1]], dtype=torch.bool)
    # row 0: 0.9, 0.8 right, 0.7 wrong -> 2; row 1: 0.95, 0.9 right, then 0.3 right, 0.2 wrong -> 3;
    # row 2: every blank right -> all 3 blanks (the non-blanks never count, wherever they rank)
    assert clean_prefix(score, right, blank).tolist() == [2, 3, 3]
    # a non-blank that is wrong and ranked first does not stop the count
    right2 = right.clone()
    right2[2, 1] = False
    assert clean_prefix(score, right2, blank).tolist() == [2, 3, 3]


def test_one_cut_off_for_all_prompts_stops_where_too_many_prompts_would_commit_an_error():
    # two prompts; prompt 1's third-best blank (0.7) is wrong, prompt 0's fourth (0.4) is wrong
    score = torch.tensor([[0.95, 0.9, 0.6, 0.4], [0.99, 0.8, 0.7, 0.3]])
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    blank = torch.ones(2, 4, dtype=torch.bool)
    t, commits = global_cut(score, right, blank, keep=1.0,
                            grid=9)  # thresholds: the 9 quantiles of the 8 scores
    assert 0.7 < t <= 0.8 and commits == pytest.approx(2.0)  # 0.95, 0.9 | 0.99, 0.8
    t, commits = global_cut(score, right, blank, keep=0.5, grid=401)  # one prompt may fail: down to above 0.4
    assert 0.4 < t <= 0.6 and commits == pytest.approx(3.0)  # 0.95, 0.9, 0.6 | 0.99, 0.8, 0.7


def test_ranking_auc_is_the_mann_whitney_probability_with_ties_halved():
    blank = torch.ones(1, 4, dtype=torch.bool)
    right = torch.tensor([[True, True, False, False]])
    assert ranking_auc(torch.tensor([[0.9, 0.8, 0.2, 0.1]]), right, blank) == pytest.approx(1.0)
    assert ranking_auc(torch.tensor([[0.1, 0.2, 0.8, 0.9]]), right, blank) == pytest.approx(0.0)
    # pairs (right, wrong): (0.9,0.5) win, (0.9,0.1) win, (0.5,0.5) tie, (0.5,0.1) win -> 3.5 / 4
    assert ranking_auc(torch.tensor([[0.9, 0.5, 0.5, 0.1]]), right, blank) == pytest.approx(0.875)
    assert ranking_auc(torch.ones(1, 4), right, blank) == pytest.approx(0.5)


def test_report_puts_the_hindsight_bound_beside_the_oracle():
    data = {"right": torch.tensor([[1, 1, 0, 1]], dtype=torch.bool),
            "blank": torch.ones(1, 4, dtype=torch.bool),
            "confidence": torch.tensor([[0.9, 0.2, 0.5, 0.8]])}
    (row,) = report(data)
    assert row["oracle_mean"] == 3 and row["clean_mean"] == 2 and row["share_of_oracle"] == pytest.approx(2 / 3)
    assert row["auc"] == pytest.approx(2 / 3)


def _typed_prompts(n: int) -> dict:
    """Half the prompts confident everywhere (0.95) and right down to rank 4, half unsure (0.55)
    and wrong from rank 2: one cut-off for all must stop at 1, a count that reads the profile can not."""
    conf = torch.empty(n, 6)
    right = torch.ones(n, 6, dtype=torch.bool)
    sure = torch.arange(n) % 2 == 0
    conf[sure] = torch.linspace(0.97, 0.93, 6)
    conf[~sure] = torch.linspace(0.57, 0.53, 6)
    right[sure, 4:] = False
    right[~sure, 1:] = False
    return {"confidence": conf, "right": right, "blank": torch.ones(n, 6, dtype=torch.bool)}


def test_an_adaptive_count_commits_more_where_the_profile_tells_how_far_is_safe():
    train, test = _typed_prompts(200), _typed_prompts(20)
    assert clean_prefix(test["confidence"], test["right"], test["blank"]).float().mean() == pytest.approx(2.5)
    assert global_cut(test["confidence"], test["right"], test["blank"], keep=1.0)[1] == pytest.approx(2.0)
    (row,) = adaptive_count(train, test, levels=(0.9,), top=6)
    assert row["error_free"] == pytest.approx(1.0) and row["commits"] == pytest.approx(2.5)  # 4 | 1


def test_the_command_runs_on_the_shipped_sudoku_model(capsys):
    from adaptive_decoding.experiments.studies.first_step_ceiling import main

    assert main(["--task", "sudoku9", "--n", "4", "--train", "8"]) == 0
    out = capsys.readouterr().out
    assert "| confidence |" in out and "| margin |" in out and "the oracle commits" in out
    assert "| probe (hidden + stats) |" in out and "adaptive count" in out


def test_bad_arguments_fail_with_what_is_allowed(capsys):
    from adaptive_decoding.experiments.studies.first_step_ceiling import main

    with pytest.raises(SystemExit):
        main(["--task-param", "grade"])
    assert "--task-param expects key=value, got 'grade'" in capsys.readouterr().err
