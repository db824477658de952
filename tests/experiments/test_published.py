"""Published results beside this run's: the experiment key ``published``, validated with YAML paths,
stored with the run and rendered by the report as ours-versus-paper tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from adaptive_decoding.experiments.parse import parse_experiment
from adaptive_decoding.experiments.published import resolve_task, task_pairs
from adaptive_decoding.experiments.report import write_report
from adaptive_decoding.experiments.spec import ExperimentError

TOY = {"factory": "adaptive_decoding.experiments.cells:toy_model", "kwargs": {"task": "{task}"}}

# Kim et al. 2025 (arXiv 2502.06768), Table 2: a 6M-parameter MDM on 9×9 Sudoku, one cell per step
PAPER = {"title": "Sudoku, one cell per step: Kim et al. 2025 (Table 2) beside this run",
         "source": "Kim et al. 2025, arXiv 2502.06768, Table 2 (6M-parameter MDM)",
         "note": "Their model is trained for the task on 1.8M puzzles; ours is a toy.",
         "columns": {"all": "addition", "hard": "addition(digits=2)"},
         "rows": [{"label": "random order", "strategy": "llada_random",
                   "published": {"all": 6.88, "hard": 3.62}},
                  {"label": "top probability", "strategy": "top_prob",
                   "published": {"all": 18.51, "hard": 9.44}},
                  {"label": "top margin", "strategy": "margin", "published": {"all": 89.49, "hard": 49.88}}]}


def doc(**extra) -> dict:
    d = {"name": "pub", "model": TOY, "n": 4, "batch_size": 4, "tasks": ["addition", {"name": "addition",
                                                                                        "params": {"digits": 2}}],
         "strategies": [{"label": "llada_random", "controller": "llada_random"},
                        {"label": "top_prob", "controller": "llada"},
                        {"label": "margin", "controller": "dream_margin"},
                        {"controller": "fast_dllm", "sweep": {"threshold": [0.9, 0.5]}},
                        {"label": "only addition", "controller": "sequential", "tasks": ["addition"]}],
         "published": [PAPER]}
    d.update(extra)
    return d


def test_columns_name_tasks_as_the_report_rows_do():
    tasks = task_pairs(["addition", {"name": "addition", "params": {"digits": 2}}, {"name": "sorting"}])
    assert tasks == [("addition", "addition"), ("addition", "addition(digits=2)"), ("sorting", "sorting")]
    assert resolve_task("addition(digits=2)", tasks) == ("addition(digits=2)", "")
    assert resolve_task("sorting", tasks) == ("sorting", "")           # a name the file lists once
    assert resolve_task("addition", tasks) == ("addition", "")         # an exact key wins over the name
    key, why = resolve_task("addition", tasks[1:])
    assert key == "addition(digits=2)"
    key, why = resolve_task("sudoku9", tasks)
    assert key is None and "unknown task 'sudoku9'" in why and "addition(digits=2)" in why
    both = task_pairs([{"name": "addition", "params": {"digits": 2}},
                       {"name": "addition", "params": {"digits": 3}}])
    key, why = resolve_task("addition", both)
    assert key is None and "listed 2 times" in why


def test_a_valid_published_block_is_normalised():
    exp = parse_experiment(doc(published=[{**PAPER, "rows": PAPER["rows"] + [
        {"strategy": "fast_dllm (threshold=0.9)", "published": {"all": 50}}]}]))
    (block,) = exp.published
    assert block["columns"] == {"all": "addition", "hard": "addition(digits=2)"}
    assert [r["label"] for r in block["rows"]] == ["random order", "top probability", "top margin",
                                                  "fast_dllm "
                                                  "(threshold=0.9)"]   # label defaults to the strategy
    assert block["rows"][2]["published"] == {"all": 89.49, "hard": 49.88}
    assert block["rows"][3]["published"] == {"all": 50}


def test_published_validation_reports_every_problem_with_its_path():
    bad = [{"title": "t", "sorce": "typo", "columns": {"all": "addition", "big": "sudoku9", "amb": 3},
            "rows": [{"label": "a", "strategy": "margn", "published": {"all": "89%", "hard": 1.0}},
                     {"label": "a", "strategy": "margin", "published": {"all": True}, "extra": 1},
                     {"label": "b", "strategy": "only addition", "published": {"all": 1.0}},
                     "not a row"]},
           {"columns": {}, "rows": []},
           "not a table"]
    with pytest.raises(ExperimentError) as info:
        parse_experiment(doc(published=bad), source="bad.yaml")
    problems = dict(info.value.problems)
    assert "unknown key" in problems["published[0].sorce"] and "'source'" in problems["published[0].sorce"]
    assert "unknown task 'sudoku9'" in problems["published[0].columns.big"]
    assert "addition(digits=2)" in problems["published[0].columns.big"]        # the allowed names
    assert "3 is not allowed" in problems["published[0].columns.amb"]
    assert "unknown strategy 'margn'" in problems["published[0].rows[0].strategy"]
    assert "did you mean 'margin'" in problems["published[0].rows[0].strategy"]
    assert "'89%' is not allowed; allowed: a number" in problems["published[0].rows[0].published.all"]
    assert "unknown column 'hard'; allowed: the table's columns (all, big, amb)" in \
        problems["published[0].rows[0].published.hard"]
    assert "True is not allowed" in problems["published[0].rows[1].published.all"]
    assert "unknown key" in problems["published[0].rows[1].extra"]
    assert "does not run on task addition(digits=2)" not in str(info.value)   # 'big' and 'amb' resolve to nothing
    assert "label 'a' names more than one row" in problems["published[0].rows"]
    assert "not a row" in problems["published[0].rows[3]"]
    assert "required" in problems["published[1].title"] and "required" in problems["published[1].columns"]
    assert "required" in problems["published[1].rows"]
    assert "not a table" in problems["published[2]"]
    assert str(info.value).startswith(f"bad.yaml: {len(info.value.problems)} problems")
    assert len(info.value.problems) == 14
    # a strategy restricted to other tasks, and a block that is no list
    with pytest.raises(ExperimentError) as info:
        parse_experiment(doc(tasks=["addition", "sorting"], published=[
            {**PAPER, "columns": {"all": "addition", "sorted": "sorting"},
             "rows": [{"strategy": "only addition"}]}]))
    (path, msg), = info.value.problems
    assert path == "published[0].rows[0].strategy"
    assert "'only addition' does not run on task sorting (column 'sorted'): its tasks are ['addition']" in msg
    with pytest.raises(ExperimentError) as info:
        parse_experiment(doc(published=PAPER))
    assert [p for p, _ in info.value.problems] == ["published"]


def row(task, strategy, acc, nfe, seed=0, g=8, **kw):
    return {"cell": f"{task}-{strategy}-{seed}", "task": task, "task_name": task.split("(")[0],
            "strategy": strategy,
            "kind": "baseline", "seed": seed, "n": 50, "accuracy": acc, "quality": acc,
            "quality_metric": "accuracy",
            "higher_is_better": True, "nfe": nfe, "tpf": g / nfe, "ms_per_token": 0.1, "peak_mem_mb": 1.0,
            "lookahead": None, "controller": "llada", "params": {}, "metrics": {}, "model": "tiny", **kw}


def make_run(folder: Path, rows: list[dict], experiment: dict, name: str = "pub") -> Path:
    run = folder / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(rows))
    (run / "experiment.yaml").write_text(yaml.safe_dump(experiment, sort_keys=False, allow_unicode=True))
    return run


def test_report_renders_ours_beside_the_paper_and_a_dash_for_what_has_not_run(tmp_path):
    rows = [row("addition", "llada_random", 0.06, 8.0), row("addition", "llada_random", 0.08, 8.0, seed=1),
            row("addition(digits=2)", "llada_random", 0.04, 16.0, g=16),
            row("addition", "margin", 0.9, 8.0), row("addition(digits=2)", "margin", 0.5, 16.0, g=16)]
    make_run(tmp_path / "runs", rows, doc())          # top_prob has not run
    out = write_report([tmp_path / "runs"], tmp_path / "docs")
    md = out["markdown"].read_text()
    section = md[md.index("## Sudoku, one cell per step: Kim et al. 2025 (Table 2) beside this run"):]
    assert md.index("## Headline") < md.index("## Sudoku, one cell") < md.index("## addition")
    assert "Source: Kim et al. 2025, arXiv 2502.06768, Table 2 (6M-parameter MDM)." in section
    assert "Their model is trained for the task on 1.8M puzzles; ours is a toy." in section
    assert "| label | strategy (this run) | all: ours | all: paper | hard: ours | hard: paper |" in section
    assert ("| random order | llada_random | 7.00 (8.0 NFE, 1.00 tok/fwd) | 6.88 | 4.00 (16.0 NFE, 1.00 "
            "tok/fwd) | 3.62 "
            "|") in section                                       # seeds averaged: (6 + 8) / 2
    assert "| top probability | top_prob | — | 18.51 | — | 9.44 |" in section
    assert "| top margin | margin | 90.00 (8.0 NFE, 1.00 tok/fwd) | 89.49 | 50.00 (16.0 NFE, 1.00 tok/fwd) | 49.88 |" \
        in section
    assert "all = task `addition`; hard = task `addition(digits=2)`" in section
    (table,) = json.loads(out["json"].read_text())["published"]
    assert table["experiment"] == "pub" and table["title"] == PAPER["title"] and table["note"] == PAPER["note"]
    assert table["columns"] == {"all": "addition", "hard": "addition(digits=2)"}
    first, second, third = table["rows"]
    assert first["cells"]["all"]["ours"] == pytest.approx(7.0) and first["cells"]["all"]["paper"] == 6.88
    assert first["cells"]["all"]["seeds"] == [0, 1] and first["cells"]["all"]["unit"] == "percent"
    assert first["cells"]["hard"]["tpf"] == pytest.approx(1.0) and first["cells"]["hard"]["nfe"] == 16.0
    assert second["cells"]["all"]["ours"] is None and second["cells"]["hard"]["paper"] == 9.44
    assert third["cells"]["hard"]["ours"] == pytest.approx(50.0)


def test_report_without_published_and_with_a_figure_left_out(tmp_path):
    make_run(tmp_path / "a", [row("addition", "margin", 0.9, 8.0)], {"name": "pub", "tasks": ["addition"]})
    out = write_report([tmp_path / "a"], tmp_path / "docs-a")
    assert json.loads(out["json"].read_text())["published"] == []
    one = {**PAPER, "source": None, "note": None, "columns": {"all": "addition"},
           "rows": [{"label": "top margin", "strategy": "margin", "published": {}}]}
    make_run(tmp_path / "b", [row("addition", "margin", 0.9, 8.0)], {**doc(), "published": [one]})
    md = write_report([tmp_path / "b"], tmp_path / "docs-b")["markdown"].read_text()
    assert "| top margin | margin | 90.00 (8.0 NFE, 1.00 tok/fwd) | — |" in md and "Source:" not in md


def test_the_run_folder_keeps_the_block_and_the_report_reads_it(tmp_path):
    """adec run (the designed toy denoiser: no training) stores the file with its published tables;
    adec report renders them from the run folder."""
    from adaptive_decoding.framework.cli.main import main

    d = doc(strategies=doc()["strategies"][:3])
    d["published"] = [{**PAPER, "rows": PAPER["rows"][::2]}]
    path = tmp_path / "pub.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False, allow_unicode=True))
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--out", str(runs), "--wandb", "disabled", "--no-progress"]) == 0
    stored = yaml.safe_load((runs / "pub" / "experiment.yaml").read_text())
    assert stored["published"] == d["published"]
    assert main(["report", "--runs", str(runs / "pub"), "--out", str(tmp_path / "docs")]) == 0
    data = json.loads((tmp_path / "docs" / "benchmark.json").read_text())
    (table,) = data["published"]
    summary = {(r["task"], r["strategy"]): r for r in data["rows"]}
    for r in table["rows"]:
        for col, task in table["columns"].items():
            ours = summary[(task, r["strategy"])]
            assert r["cells"][col]["ours"] == pytest.approx(100 * ours["quality"])
            assert r["cells"][col]["tpf"] == pytest.approx(ours["tpf"])
    assert [r["cells"]["hard"]["paper"] for r in table["rows"]] == [3.62, 49.88]
