"""Declarative experiments: validation naming YAML paths, end-to-end runs, resume without recomputing."""

from __future__ import annotations

import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import yaml

import adaptive_decoding.experiments.runner as E
from adaptive_decoding.experiments.options import ExperimentOptions
from adaptive_decoding.experiments.parse import load_experiment, parse_experiment
from adaptive_decoding.experiments.runner import run_experiment
from adaptive_decoding.experiments.spec import ExperimentError, _controller_kind

ROOT = Path(__file__).resolve().parents[2]


def quiet(**flat):
    """Run options without W&B or a progress bar (``flat``: more of them by name)."""
    return ExperimentOptions.from_flat({"wandb_mode": "disabled", "progress": False, **flat})


def addition_g() -> int:
    from adaptive_decoding.framework.tasks.base import get_task

    return get_task("addition").gen_length
TINY = {"factory": "adaptive_decoding.experiments.cells:tiny_model",
        "kwargs": {"task": "{task}", "size": "tiny", "train_steps": 30, "seed": 0}}


def two_strategy(name: str = "two", **extra) -> dict:
    doc = {"name": name, "model": TINY, "n": 8, "batch_size": 8, "seeds": [0], "metrics": ["exact_match"],
           "tasks": ["addition"],
           "strategies": [{"label": "sequential", "controller": "sequential"},
                          {"label": "fast", "controller": "fast_dllm", "params": {"threshold": 0.6}}]}
    doc.update(extra)
    return doc


def write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / f"{doc['name']}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return p


class Counter:
    """Wraps evaluate_cell: counts evaluations and can raise inside the k-th (a simulated kill)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[str] = []
        self.fail_on = fail_on
        self.real = E.evaluate_cell

    def __call__(self, cell, *args, **kwargs):
        self.calls.append(cell.id)
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise KeyboardInterrupt("killed inside cell %d" % self.fail_on)
        return self.real(cell, *args, **kwargs)


# ---------------------------------------------------------------------- validation
def test_validation_reports_every_problem_with_its_yaml_path():
    doc = two_strategy(
        strategy="oops", seeds=[0, -1],
        strategies=[{"controller": "sequential"},
                    {"controller": "fast_dllm", "params": {"treshold": 0.5}},
                    {"controller": "margin_topk", "params": {"eta": 1.5}},
                    {"controller": "margn_topk"},
                    {"controller": "fast_dllm", "kind": "magic", "decode": {"block_lenght": 2}}])
    with pytest.raises(ExperimentError) as info:
        parse_experiment(doc, source="bad.yaml")
    msg = str(info.value)
    paths = [p for p, _ in info.value.problems]
    assert "strategy" in paths and "seeds[1]" in paths
    assert "strategies[1].params.treshold" in paths and "did you mean 'threshold'" in msg
    assert "strategies[2].params.eta" in paths and "allowed: number in [0, 1]" in msg
    assert "strategies[3].controller" in paths and "did you mean 'margin_topk'" in msg and "sequential" in msg
    assert "strategies[4].kind" in paths and "reference, baseline, heuristic, tuned, learned, oracle" in msg
    assert "strategies[4].decode.block_lenght" in paths
    assert msg.startswith("bad.yaml: 7 problems")


def test_validation_checks_per_task_combinations():
    doc = two_strategy(strategies=[{"controller": "fast_dllm", "decode": {"block_length": 3}}])
    with pytest.raises(ExperimentError) as info:
        parse_experiment(doc)
    (path, msg), = info.value.problems
    assert path == "strategies[0].decode"
    assert f"block_length=3 does not divide gen_length={addition_g()}" in msg and "task addition" in msg


def test_quality_must_be_accuracy_or_one_of_the_tasks_metrics():
    with pytest.raises(ExperimentError) as info:
        parse_experiment(two_strategy(tasks=[{"name": "addition", "quality": "bleu"}]))
    (path, msg), = info.value.problems
    assert path == "tasks[0].quality" and "exact_match" in msg
    exp = parse_experiment(two_strategy(tasks=[{"name": "addition", "quality": "exact_match"}]))
    assert exp.tasks[0].quality == "exact_match"


def test_missing_tuned_file_is_an_error_or_a_skip_with_its_prepare_command(tmp_path, capsys):
    strat = {"controller": "tuned:" + str(tmp_path / "{task}.yaml"), "label": "tuned",
             "prepare": "adec tune --controller margin_topk --task {task}"}
    doc = two_strategy(strategies=[{"controller": "sequential"}, strat])
    with pytest.raises(ExperimentError, match="prepare it with: adec tune --controller margin_topk --task addition"):
        parse_experiment(doc)
    exp = parse_experiment({**doc, "on_missing": "skip"})
    assert [c.strategy.label for c in exp.cells()] == ["sequential"]
    assert "skipping strategies[1]" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "experiments" / "configs").glob("*.yaml")))
def test_shipped_experiments_validate(name, tmp_path):
    """Every file of experiments/configs validates (a new one is checked without being listed)."""
    if name == "llada_gsm8k":
        pytest.skip("needs LLaDA-8B-Instruct and GSM8K in the local Hugging Face caches (validated by "
                    "`adec run ... --check` where they are); nothing is downloaded here")
    overrides = {"on_missing": "skip"}
    if name in ("llada_multigpu", "phrases_long"):  # a checkpoint this machine may not have: a factory stands in
        overrides["model"] = {"factory": "adaptive_decoding.experiments.cells:tiny_model", "kwargs": {"task": "{task}"}}
    exp = load_experiment(ROOT / "experiments" / "configs" / f"{name}.yaml", overrides=overrides)
    kinds = {c.kind for c in exp.cells()}
    if name == "benchmark":  # the hard tasks: every parallel decoder is a curve of at least two points
        assert {"reference", "baseline", "heuristic", "tuned", "oracle"} <= kinds  # tuned: one point per task
        assert "learned" in {s.kind or _controller_kind(s.controller) for s in exp.strategies}
        curves: dict = {}
        for s in exp.strategies:
            curves.setdefault(s.curve or s.label, []).append(s)
        singles = {c for c, pts in curves.items() if len(pts) == 1 and not pts[0].tune}
        assert singles == {"sequential", "cadllm", "oracle"}
        assert {s.label for s in exp.strategies if s.tune} == {"margin_topk (tuned)", "entropy_topk (tuned)"}
        assert [p["title"] for p in exp.published] and {t.key for t in exp.tasks} >= {"sudoku9", "phrases"}
    if name == "phrases_long":  # the packaged window policy at G = 256, with and without end-of-text prediction
        assert {t.params.get("length") for t in exp.tasks} == {256}
        learned = [c for c in exp.cells() if c.kind == "learned"]
        assert learned and {c.params["policy"] for c in learned} == {"phrases-set-window"}
    if name == "verified":  # each learned drafter beside itself wrapped, on the same sweep
        points: dict = {}
        for s in exp.strategies:
            if s.sweep:
                points.setdefault(s.curve, []).extend(s.sweep.values())
        assert len(points["learned (residual MLP, RL)"]) == 7
        assert points["verified learned (residual MLP, RL, τ₂=0.98)"] == points["learned (residual MLP, RL)"]
        assert points["verified learned (window, DAgger, τ₂=0.98)"] == points["learned (window, DAgger)"]
    if name == "smoke_benchmark":
        assert {"reference", "baseline", "heuristic", "oracle"} <= kinds
        assert any(c.lookahead for c in exp.cells()) and any(not c.lookahead for c in exp.cells())
        assert {"tuned", "learned"} <= {s.kind or _controller_kind(s.controller) for s in exp.strategies}


# ---------------------------------------------------------------------- sweeps
def test_a_sweep_expands_into_one_strategy_per_value_on_one_curve():
    doc = two_strategy(strategies=[
        {"controller": "sequential"},
        {"controller": "fast_dllm", "sweep": {"threshold": [0.9, 0.7, 0.5]}},
        {"label": "eb γ", "controller": "eb", "params": {"order": "confidence"}, "sweep": {"gamma": [0.1, 1.0]}},
        {"controller": "llada", "sweep": {"steps_per_token": [0.5, 1.0]}},
        {"controller": "fast_dllm", "params": {"threshold": 0.9}, "sweep": {"block_length": [1, addition_g()]}}])
    exp = parse_experiment(doc)
    got = [(s.label, s.curve, s.sweep, s.params, s.decode, s.path) for s in exp.strategies[1:6]]
    assert got == [
        ("fast_dllm (threshold=0.9)", "fast_dllm", {"threshold": 0.9}, {"threshold": 0.9}, {}, "strategies[1].sweep.threshold[0]"),
        ("fast_dllm (threshold=0.7)", "fast_dllm", {"threshold": 0.7}, {"threshold": 0.7}, {}, "strategies[1].sweep.threshold[1]"),
        ("fast_dllm (threshold=0.5)", "fast_dllm", {"threshold": 0.5}, {"threshold": 0.5}, {}, "strategies[1].sweep.threshold[2]"),
        ("eb γ (gamma=0.1)", "eb γ", {"gamma": 0.1}, {"order": "confidence", "gamma": 0.1}, {}, "strategies[2].sweep.gamma[0]"),
        ("eb γ (gamma=1.0)", "eb γ", {"gamma": 1.0}, {"order": "confidence", "gamma": 1.0}, {}, "strategies[2].sweep.gamma[1]")]
    llada = [s for s in exp.strategies if s.curve == "llada"]
    assert [s.params for s in llada] == [{"steps_per_token": 0.5}, {"steps_per_token": 1.0}]
    blocks = [s for s in exp.strategies if s.curve == "fast_dllm (threshold=0.9)"]  # a decoding option
    assert [(s.label, s.params, s.decode) for s in blocks] == [
        ("fast_dllm (threshold=0.9) (block_length=1)", {"threshold": 0.9}, {"block_length": 1}),
        (f"fast_dllm (threshold=0.9) (block_length={addition_g()})", {"threshold": 0.9}, {"block_length": addition_g()})]
    assert exp.strategies[0].curve is None and exp.strategies[0].sweep is None
    cells = exp.cells()
    assert len({c.key for c in cells}) == len(cells) == 10  # the swept value is in every cell's hash
    assert [c.id for c in parse_experiment(doc).cells()] == [c.id for c in cells]  # stable: resumable


def test_a_dotted_sweep_key_reaches_inside_a_wrappers_mapping_parameter():
    doc = two_strategy(strategies=[
        {"label": "v", "controller": "verified", "params": {"inner": "margin_topk", "inner_params": {"depth": 0},
                                                             "verify_threshold": 0.9},
         "sweep": {"inner_params.eta": [0.9, 0.7]}},
        {"label": "w", "controller": "verified", "sweep": {"inner_params.threshold": [0.5]}}])
    exp = parse_experiment(doc)
    got = [(s.label, s.curve, s.params) for s in exp.strategies]
    assert got == [
        ("v (eta=0.9)", "v", {"inner": "margin_topk", "inner_params": {"depth": 0, "eta": 0.9}, "verify_threshold": 0.9}),
        ("v (eta=0.7)", "v", {"inner": "margin_topk", "inner_params": {"depth": 0, "eta": 0.7}, "verify_threshold": 0.9}),
        ("w (threshold=0.5)", "w", {"inner_params": {"threshold": 0.5}})]
    assert len({c.key for c in exp.cells()}) == len(exp.cells())  # the nested value is in the cell's hash
    with pytest.raises(ExperimentError) as info:
        parse_experiment(two_strategy(strategies=[
            {"controller": "fast_dllm", "sweep": {"threshold.x": [0.5]}},
            {"controller": "verified", "params": {"inner_params": {"threshold": 0.9}},
             "sweep": {"inner_params.threshold": [0.5]}}]))
    problems = dict(info.value.problems)
    assert "'threshold' is not a mapping parameter of fast_dllm" in problems["strategies[0].sweep.threshold.x[0]"]
    assert "params.inner_params.threshold is also set" in problems["strategies[1].sweep.inner_params.threshold"]
    # the leaf is checked when the file is read, by building the cell's controller for each task
    with pytest.raises(ExperimentError) as info:
        parse_experiment(two_strategy(strategies=[
            {"controller": "verified", "sweep": {"inner_params.threshold": [0.5, -0.5]}}]))
    assert [p for p, _ in info.value.problems] == ["strategies[0].sweep.inner_params.threshold[1]"]
    assert "fast_dllm.threshold=-0.5 is out of range" in dict(info.value.problems)[
        "strategies[0].sweep.inner_params.threshold[1]"]


def test_a_dotted_sweep_key_reaches_inside_a_sub_controller_spec():
    base = {"name": "margin_topk", "params": {"depth": 16}}
    exp = parse_experiment(two_strategy(strategies=[
        {"label": "l", "controller": "confidence_ladder", "params": {"base": base, "d_max": 16},
         "sweep": {"base.params.eta": [0.99, 0.9]}}]))
    assert [(s.label, s.params) for s in exp.strategies] == [
        ("l (eta=0.99)", {"base": {"name": "margin_topk", "params": {"depth": 16, "eta": 0.99}}, "d_max": 16}),
        ("l (eta=0.9)", {"base": {"name": "margin_topk", "params": {"depth": 16, "eta": 0.9}}, "d_max": 16})]
    assert base == {"name": "margin_topk", "params": {"depth": 16}}  # the file's own mapping is not changed
    with pytest.raises(ExperimentError) as info:
        parse_experiment(two_strategy(strategies=[
            {"controller": "confidence_ladder", "params": {"base": {"name": "margin_topk", "params": {"eta": 0.9}}},
             "sweep": {"base.params.eta": [0.99]}},
            {"controller": "confidence_ladder", "params": {"base": "margin_topk"}, "sweep": {"base.params.eta": [0.99]}}]))
    problems = dict(info.value.problems)
    assert "params.base.params.eta is also set" in problems["strategies[0].sweep.base.params.eta"]
    assert "'base' is 'margin_topk', not a mapping" in problems["strategies[1].sweep.base.params.eta[0]"]
    with pytest.raises(ExperimentError) as info:  # the leaf, when the cell's controller is built
        parse_experiment(two_strategy(strategies=[
            {"controller": "confidence_ladder", "params": {"base": {"name": "margin_topk"}},
             "sweep": {"base.params.eta": [0.9, 1.5]}}]))
    assert [p for p, _ in info.value.problems] == ["strategies[0].sweep.base.params.eta[1]"]
    assert "eta=1.5 is out of range" in info.value.problems[0][1]


def test_a_verified_strategy_is_reported_under_its_drafters_family():
    import adaptive_decoding.controllers as controllers  # noqa: F401  (registers verified)

    assert _controller_kind("verified") == "baseline"  # around fast_dllm, its default: WINO, a baseline
    assert _controller_kind("verified", {"inner": "learned", "inner_params": {"policy": "p.pt"}}) == "learned"
    assert _controller_kind("verified", {"inner": "margin_topk"}) == "heuristic"
    assert _controller_kind("number_guard", {"inner": "learned"}) == "heuristic"  # a guard keeps its own family
    exp = parse_experiment(two_strategy(strategies=[{"controller": "verified", "sweep": {"inner_params.threshold": [0.9]}}]))
    assert {c.kind for c in exp.cells()} == {"baseline"}


def test_sweep_validation_reports_every_bad_value_with_its_path():
    doc = two_strategy(strategies=[
        {"controller": "fast_dllm", "sweep": {"threshold": [0.5, -1, 0.5]}},
        {"controller": "fast_dllm", "sweep": {"treshold": [0.5]}},
        {"controller": "fast_dllm", "sweep": {"threshold": 0.5}},
        {"controller": "fast_dllm", "sweep": {"threshold": [0.5], "block_length": [1]}},
        {"controller": "fast_dllm", "params": {"threshold": 0.5}, "sweep": {"threshold": [0.7]}},
        {"controller": "llada", "params": {"steps_per_token": 0.5}, "sweep": {"steps": [2, 4]}},
        {"controller": "fast_dllm", "sweep": {"cache": ["none", "bogus"]}},
        {"suite": "baselines", "sweep": {"threshold": [0.5]}},
        {"controller": "margin_topk", "sweep": {"eta": [0.2, 1.5]}},
        {"controller": "fast_dllm", "sweep": {"seed": [1, 2]}}])
    with pytest.raises(ExperimentError) as info:
        parse_experiment(doc, source="bad.yaml")
    problems = dict(info.value.problems)
    assert "repeats a value" in problems["strategies[0].sweep.threshold"]
    assert "fast_dllm.threshold=-1 is out of range" in problems["strategies[0].sweep.threshold[1]"]
    assert "did you mean 'threshold'?" in problems["strategies[1].sweep.treshold"]
    assert "nor a decoding option" in problems["strategies[1].sweep.treshold"]
    assert "a non-empty list of values" in problems["strategies[2].sweep.threshold"]
    assert "one parameter and its values" in problems["strategies[3].sweep"]
    assert "params.threshold is also set" in problems["strategies[4].sweep.threshold"]
    assert "params.steps_per_token is also set" in problems["strategies[5].sweep.steps"]
    assert "cache='bogus' is not allowed" in problems["strategies[6].sweep.cache[1]"]
    assert "not allowed with 'suite'" in problems["strategies[7].sweep"]
    assert "allowed: number in [0, 1]" in problems["strategies[8].sweep.eta[1]"]
    assert "top-level 'seeds'" in problems["strategies[9].sweep.seed"]
    assert str(info.value).startswith("bad.yaml: 11 problems")
    # a sweep's curve may not be another entry's label or curve
    with pytest.raises(ExperimentError) as info:
        parse_experiment(two_strategy(strategies=[
            {"label": "fast_dllm", "controller": "fast_dllm", "params": {"threshold": 0.95}},
            {"controller": "fast_dllm", "sweep": {"threshold": [0.5, 0.7]}}]))
    (path, msg), = info.value.problems
    assert path == "strategies" and "curve 'fast_dllm' is drawn by more than one entry (strategies[0], strategies[1])" in msg
    # hand-placed points of one curve (a knob no sweep reaches) are one line; a curve key beside a sweep is not
    exp = parse_experiment(two_strategy(strategies=[
        {"label": "ladder (eta=0.9)", "curve": "ladder", "controller": "confidence_ladder",
         "params": {"base": {"name": "margin_topk", "params": {"eta": 0.9}}}},
        {"label": "ladder (eta=0.5)", "curve": "ladder", "controller": "confidence_ladder",
         "params": {"base": {"name": "margin_topk", "params": {"eta": 0.5}}}}]))
    assert [(s.label, s.curve) for s in exp.strategies] == [("ladder (eta=0.9)", "ladder"), ("ladder (eta=0.5)", "ladder")]
    with pytest.raises(ExperimentError) as info:
        parse_experiment(two_strategy(strategies=[
            {"controller": "fast_dllm", "curve": "x", "sweep": {"threshold": [0.5, 0.7]}},
            {"controller": "fast_dllm", "curve": 3}]))
    problems = dict(info.value.problems)
    assert "on a strategy without 'sweep'" in problems["strategies[0].curve"]
    assert "3 is not allowed; allowed: a curve name" in problems["strategies[1].curve"]
    # a value that does not fit a task is reported at the value itself
    with pytest.raises(ExperimentError) as info:
        parse_experiment(two_strategy(strategies=[{"controller": "fast_dllm", "sweep": {"block_length": [1, 3]}}]))
    (path, msg), = info.value.problems
    assert path == "strategies[0].sweep.block_length[1]" and "block_length=3 does not divide" in msg


# ---------------------------------------------------------------------- running and resuming
def test_runs_end_to_end_resumes_after_a_kill_and_never_recomputes(tmp_path, monkeypatch):
    path = write(tmp_path, two_strategy())
    out = tmp_path / "runs"
    killer = Counter(fail_on=2)
    monkeypatch.setattr(E, "evaluate_cell", killer)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(path, out, quiet())
    run_dir = out / "two"
    first, second = [c.id for c in load_experiment(path).cells()]
    assert killer.calls == [first, second]
    assert (run_dir / "cells" / first / "summary.json").is_file()
    assert not (run_dir / "cells" / second).exists() or not (run_dir / "cells" / second / "summary.json").exists()
    assert len(json.loads((run_dir / "summary.json").read_text())) == 1  # the finished cell is not lost

    again = Counter()
    monkeypatch.setattr(E, "evaluate_cell", again)
    res = run_experiment(path, out, quiet(resume=True))
    assert again.calls == [second] and res.reused == [first] and res.evaluated == [second]

    third = Counter()
    monkeypatch.setattr(E, "evaluate_cell", third)
    res = run_experiment(path, out, quiet())
    assert third.calls == [] and len(res.rows) == 2

    for row in res.rows:  # the summary matches the per-sample file
        samples = [json.loads(x) for x in (run_dir / "cells" / row["cell"] / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == row["n"] == 8
        assert row["accuracy"] == pytest.approx(sum(s["correct"] for s in samples) / len(samples))
        assert row["nfe"] == pytest.approx(sum(s["nfe"] for s in samples) / len(samples))
        # tokens per forward pooled: the answers' tokens (to the first end-of-text) over the forwards
        assert all(1 <= s["answer_tokens"] <= addition_g() for s in samples)
        assert row["tpf"] == pytest.approx(sum(s["answer_tokens"] for s in samples) / sum(s["nfe"] for s in samples))
        assert row["tpf_mean"] == pytest.approx(sum(s["answer_tokens"] / s["nfe"] for s in samples) / len(samples))
        assert row["metrics"]["exact_match"] == pytest.approx(
            sum(s["metrics"]["exact_match"] for s in samples) / len(samples))
    seq, fast = res.rows
    assert seq["kind"] == "reference" and seq["nfe"] == addition_g() and fast["kind"] == "baseline"
    assert fast["nfe"] <= seq["nfe"]
    assert (run_dir / "summary.md").read_text().count("| addition |") == 2
    assert (run_dir / "summary.csv").read_text().splitlines()[0].startswith("task,strategy,kind")
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["cores"] and env["torch"]


def test_a_cell_another_process_finished_meanwhile_is_reused_not_recomputed(tmp_path, monkeypatch, capsys):
    """Two `adec run`s on one run folder: the second cell, finished by the other process while this
    one decoded the first, is taken from the folder (its figures, a reused cell), not decoded again."""
    path = write(tmp_path, two_strategy())
    elsewhere = run_experiment(path, tmp_path / "other", quiet())  # what the other process writes
    first, second = [c.id for c in load_experiment(path).cells()]
    out = tmp_path / "runs"

    class OtherProcessFinishes(Counter):
        def __call__(self, cell, *args, **kwargs):
            shutil.copytree(elsewhere.run_dir / "cells" / second, out / "two" / "cells" / second)
            return super().__call__(cell, *args, **kwargs)

    counter = OtherProcessFinishes()
    monkeypatch.setattr(E, "evaluate_cell", counter)
    res = run_experiment(path, out, quiet())
    assert counter.calls == [first] and res.evaluated == [first] and res.reused == [second]
    assert f"cell {second} was finished by another process meanwhile" in capsys.readouterr().err
    by_cell = {r["cell"]: r for r in res.rows}
    theirs = json.loads((elsewhere.run_dir / "cells" / second / "summary.json").read_text())
    assert set(by_cell) == {first, second} and by_cell[second]["nfe"] == theirs["nfe"]


def test_a_finished_cell_whose_policy_file_changed_since_is_reported_stale(tmp_path):
    from adaptive_decoding.experiments.runner import stale_inputs

    policy, summary = tmp_path / "mlp.pt", tmp_path / "summary.json"
    policy.write_text("v1")
    summary.write_text("{}")
    os.utime(policy, (1000, 1000))
    os.utime(summary, (2000, 2000))
    params = {"inner": "learned", "inner_params": {"policy": str(policy), "threshold": 0.9}, "tags": ["x"]}
    assert stale_inputs(params, summary) == []  # the cell ran after the file was written
    os.utime(policy, (3000, 3000))  # retrained since
    assert stale_inputs(params, summary) == [str(policy)]
    assert stale_inputs({"policy": str(tmp_path / "missing.pt")}, summary) == []


def test_a_metric_added_later_is_computed_from_the_stored_samples(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    run_experiment(write(tmp_path, two_strategy("m")), out, quiet())
    counter = Counter()
    monkeypatch.setattr(E, "evaluate_cell", counter)
    res = run_experiment(write(tmp_path, two_strategy("m", metrics=["exact_match", "rouge_l"])), out,
                         quiet())
    assert counter.calls == []
    for row in res.rows:
        samples = [json.loads(x) for x in (out / "m" / "cells" / row["cell"] / "samples.jsonl").read_text().splitlines()]
        assert row["metrics"]["rouge_l"] == pytest.approx(sum(s["metrics"]["rouge_l"] for s in samples) / len(samples))


def test_a_curve_given_later_is_taken_by_the_finished_cells(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    run_experiment(write(tmp_path, two_strategy("c")), out, quiet())
    doc = two_strategy("c")
    doc["strategies"][1]["curve"] = "fast curve"
    counter = Counter()
    monkeypatch.setattr(E, "evaluate_cell", counter)
    res = run_experiment(write(tmp_path, doc), out, quiet())
    assert counter.calls == []  # presentation only: nothing decoded again
    assert {r["strategy"]: r["curve"] for r in res.rows} == {"sequential": "sequential", "fast": "fast curve"}


def test_an_edited_strategy_is_a_new_cell(tmp_path, monkeypatch):
    out = tmp_path / "runs"
    run_experiment(write(tmp_path, two_strategy("e")), out, quiet())
    doc = two_strategy("e")
    doc["strategies"][1]["params"]["threshold"] = 0.8
    counter = Counter()
    monkeypatch.setattr(E, "evaluate_cell", counter)
    res = run_experiment(write(tmp_path, doc), out, quiet())
    assert len(counter.calls) == 1 and "fast" in counter.calls[0] and len(res.rows) == 2


def test_wandb_gets_the_config_and_one_log_per_cell(tmp_path, monkeypatch):
    calls: dict = {"log": []}

    class Run:
        def log(self, data):
            calls["log"].append(data)

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.update(init=kw) or Run()
    fake.Table = lambda columns, data: {"columns": columns, "data": data}
    monkeypatch.setitem(sys.modules, "wandb", fake)
    doc = two_strategy("w")
    run_experiment(write(tmp_path, doc), tmp_path / "runs", quiet(wandb_mode="offline"))
    assert calls["init"]["mode"] == "offline" and calls["init"]["config"]["experiment"]["name"] == "w"
    assert calls["init"]["config"]["experiment"]["strategies"] == doc["strategies"]
    assert sum("cells_done" in d for d in calls["log"]) == 2 and calls["finished"]
    assert len(calls["log"][-1]["summary"]["data"]) == 2


def test_cli_run_check_and_errors(tmp_path, capsys):
    from adaptive_decoding.framework.cli.main import main

    path = write(tmp_path, two_strategy("cli"))
    assert main(["run", str(path), "--check"]) == 0
    assert "2 cells" in capsys.readouterr().out
    assert main(["run", str(path), "--out", str(tmp_path / "r"), "--wandb", "disabled", "--no-progress",
                 "--max-cells", "1"]) == 0
    assert "1 cells evaluated" in capsys.readouterr().err
    bad = write(tmp_path, two_strategy("bad", strategies=[{"controller": "margin_topk", "params": {"eta": 2}}]))
    assert main(["run", str(bad)]) == 2
    assert "strategies[0].params.eta" in capsys.readouterr().err
    assert main(["run", str(path), "--out", str(tmp_path / "nowhere"), "--resume"]) == 2
