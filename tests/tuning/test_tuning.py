"""``adaptive_decoding.framework.tuning`` / ``adec tune``: studies that write, resume, share a storage and export.

The model is :class:`CarryAdder`, a designed denoiser for 2-digit addition (no training, exact
behaviour), so that accuracy and NFE really trade off against each other:

* an answer digit that receives no carry is predicted right with p = 0.97 (EOS padding too);
* a digit that receives a carry is predicted right with p = 0.90 once every less significant
  digit is decided, and otherwise *wrong* (the no-carry digit, p = 0.55; the right one 0.40).

So one-token-per-step decoding is always right, ``fast_dllm`` is right for any threshold in
[0.55, 0.90) with NFE = 1 + carries (the designed minimum), and below 0.55 it commits wrong digits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller, load_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.testing.carry import carry_model
from adaptive_decoding.framework.tuning.front import choose_trial
from adaptive_decoding.framework.tuning.options import TuneOptions
from adaptive_decoding.framework.tuning.storage import open_storage
from adaptive_decoding.framework.tuning.study import tune_controller

TASK = dict(task="addition", task_params={"digits": 2})


def run_tune(controller, tmp_path=None, *, task="addition", task_params=None, loaded=None, **flat):
    """``tune_controller`` with its options given flat (each name goes to its group), on the carry toy."""
    flat = {"plot": False, "verbose": False, **({} if tmp_path is None else {"out_dir": str(tmp_path)}), **flat}
    return tune_controller(controller, task, TuneOptions.from_flat(flat), task_params=task_params,
                           loaded=loaded if loaded is not None else carry_model())


def tune(tmp_path, storage, **kw):
    args = dict(n_trials=4, n_val=16, n_test=16, batch_size=16, storage=storage, study_name="s", seed=1, **TASK)
    args.update(kw)
    return run_tune("fast_dllm", tmp_path, **args)


# ----------------------------------------------------------------------------- the toy itself
def test_carry_adder_trades_accuracy_for_nfe():
    loaded, task = carry_model(), get_task("addition", digits=2)
    ex = task.examples("validation", 24)
    prompts = [task.prompt_ids(e) for e in ex]
    cfg = DecodeConfig(gen_length=task.gen_length)
    seq = decode(loaded.denoiser, prompts, build_controller("sequential"), cfg)
    fast = decode(loaded.denoiser, prompts, build_controller("fast_dllm", threshold=0.6), cfg)
    loose = decode(loaded.denoiser, prompts, build_controller("fast_dllm", threshold=0.5), cfg)
    targets = torch.tensor([task.target_ids(e) for e in ex])
    assert torch.equal(seq.generated, targets) and torch.equal(fast.generated, targets)
    assert fast.nfe.tolist() == [1 + e.meta["carries"] for e in ex]
    carried = torch.tensor([e.meta["carries"] > 0 for e in ex])
    assert carried.any() and not torch.equal(loose.generated[carried], targets[carried])


# ----------------------------------------------------------------------------- storages
STORAGES = ["inmemory", "sqlite", "journal"]


def storage_spec(mode: str, tmp_path: Path):
    if mode == "inmemory":
        return open_storage("memory")  # an object: the same one is passed again to resume
    if mode == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    return f"journal:{tmp_path / 'study.log'}"


@pytest.mark.parametrize("mode", STORAGES)
def test_study_writes_resumes_and_exports(mode, tmp_path):
    spec = storage_spec(mode, tmp_path)
    first = tune(tmp_path, spec, n_trials=3)
    assert first.n_trials == 3 and first.ran == 3
    if mode == "sqlite":
        assert (tmp_path / "study.db").stat().st_size > 0
    if mode == "journal":
        assert (tmp_path / "study.log").stat().st_size > 0

    again = tune(tmp_path, spec, n_trials=3)  # same total: nothing is re-run
    assert again.ran == 0 and again.n_trials == 3
    more = tune(tmp_path, spec, n_trials=5)  # resumes: the count grows, not restarts
    assert more.ran == 2 and more.n_trials == 5

    import optuna

    study = optuna.load_study(study_name="s", storage=open_storage(spec))
    numbers = sorted(t.number for t in study.trials)
    assert numbers == list(range(5))
    points = [round(t.params["threshold"], 12) for t in study.trials]
    assert len(set(points)) == len(points)  # trials already done are not proposed again
    assert study.trials[0].params == {"threshold": 0.9}  # the controller's default goes first

    ctrl = load_controller(more.path)
    assert ctrl.display_name() == "fast_dllm" and ctrl.threshold == more.params["threshold"]
    assert build_controller(f"tuned:{more.path}") == ctrl
    # the exported point is the fewest-NFE trial at the reference's accuracy (the toy: 100 %)
    assert more.reference_validation["accuracy"] == 1.0
    ok = [t for t in study.trials if t.values and t.values[0] >= 1.0 - 0.01]
    assert more.validation["nfe"] == min(t.values[1] for t in ok)
    # and it decodes: right answers with fewer forward passes than one token per step
    assert more.test["accuracy"] >= more.reference_test["accuracy"] - 0.01
    assert more.test["nfe"] <= more.reference_test["nfe"]


def test_a_wrapper_is_tuned_together_with_its_inner_controller(tmp_path):
    import adaptive_decoding.controllers as controllers  # noqa: F401  (registers verified)
    from adaptive_decoding.framework.tuning.space import tuned_space

    cls = build_controller("verified").__class__
    assert set(tuned_space(cls)) == {"verify_threshold", "inner.threshold"}  # the default inner: fast_dllm
    held = tuned_space(cls, {"inner": "margin_topk", "inner_params": {"k": 2}})
    assert "inner.eta" in held and "inner.k" not in held  # a held inner parameter leaves the space
    spec = tuned_space(cls, {"inner": {"name": "margin_topk", "params": {"adapt": True}}})
    assert "inner.eta" in spec and "inner.adapt" not in spec  # the spec's own params are held too
    res = run_tune("verified", tmp_path, n_trials=4, n_val=16, n_test=16, batch_size=16, storage="memory",
                   study_name="w", seed=1, fixed={"inner": "fast_dllm", "progress_guard": True}, **TASK)
    ctrl = load_controller(res.path)
    assert ctrl.display_name() == "verified" and ctrl.inner == "fast_dllm" and ctrl.progress_guard
    tau1 = ctrl.inner_params["threshold"]
    assert tau1 == res.params["inner_params"]["threshold"] and 0.5 <= tau1 <= 0.99  # the inner's own range
    assert ctrl.inner_controller().threshold == tau1  # the exported file rebuilds the tuned inner controller


def test_composites_are_tuned_by_dotted_paths_into_their_nested_controllers():
    import adaptive_decoding.controllers as controllers  # noqa: F401
    from adaptive_decoding.framework.engine.controller import CONTROLLERS
    from adaptive_decoding.framework.tuning.space import tuned_space, with_point

    ladder = CONTROLLERS.get("confidence_ladder")
    assert {"high", "base.eta", "base.k", "base.adapt"} <= set(tuned_space(ladder))
    switch = CONTROLLERS.get("switch")
    space = tuned_space(switch, {"controllers": ["margin_topk", {"name": "fast_dllm", "params": {"threshold": 0.8}}]})
    assert "controllers.0.eta" in space and "controllers.1.threshold" not in space
    params = with_point(switch, {"controllers": ["margin_topk", "fast_dllm"]}, {"controllers.0.eta": 0.95})
    assert params["controllers"] == [{"name": "margin_topk", "params": {"eta": 0.95}}, "fast_dllm"]
    assert switch.build(**params).children()["0"].controller.eta == 0.95
    compose = CONTROLLERS.get("compose")
    deep = with_point(compose, {}, {"depth.base.eta": 0.8})  # a composite inside a composite
    assert compose.build(**deep).children()["depth"].controller.children()["base"].controller.eta == 0.8
    hybrid = with_point(CONTROLLERS.get("hybrid"), {}, {"margin.eta": 0.7})
    assert hybrid == {"margin": {"eta": 0.7}}
    verified = CONTROLLERS.get("verified")
    wrapped = with_point(verified, {"inner_params": {"k": 2}}, {"inner.eta": 0.9})
    assert wrapped == {"inner_params": {"k": 2, "eta": 0.9}}  # stored where a wrapper keeps it
    with pytest.raises(ParameterError, match="given both"):
        verified.build(inner={"name": "margin_topk", "params": {"k": 3}}, inner_params={"k": 2})


def test_resume_refuses_a_different_setup(tmp_path):
    spec = f"sqlite:///{tmp_path / 'study.db'}"
    tune(tmp_path, spec, n_trials=1, n_test=0)
    with pytest.raises(ParameterError, match="n_val=16, not 8"):
        tune(tmp_path, spec, n_trials=2, n_val=8, n_test=0)


def test_bad_storage_and_empty_space_fail_clearly(tmp_path):
    with pytest.raises(ParameterError, match="ftp://x.*allowed: memory, journal:PATH"):
        open_storage("ftp://x")
    with pytest.raises(ParameterError, match="'sequential' has nothing to tune"):
        run_tune("sequential", tmp_path, **TASK)
    with pytest.raises(ParameterError, match="cannot be shared by --workers 2"):
        tune(tmp_path, "memory", workers=2)


def test_pruning_and_choice_rules(tmp_path):
    """A threshold below 0.55 commits wrong carry digits: pruned on the first chunk."""
    import optuna

    storage = open_storage("memory")
    tune(tmp_path, storage, n_trials=1, n_test=0, prune_margin=0.05, prune_fraction=0.5, study_name="p")
    study = optuna.load_study(study_name="p", storage=storage)
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE  # the default, τ = 0.9
    study.enqueue_trial({"threshold": 0.5})
    tune(tmp_path, storage, n_trials=2, n_test=0, prune_margin=0.05, prune_fraction=0.5, study_name="p")
    t = study.trials[1]
    assert t.params == {"threshold": 0.5} and t.state == optuna.trial.TrialState.PRUNED
    assert t.user_attrs["chunk_accuracy"] < 0.95 and not t.values
    # a point that fails to decode with a ParameterError is pruned as invalid, not a crash
    storage = open_storage("memory")
    run_tune("llada", tmp_path, **TASK, decode={"block_length": 2}, storage=storage, study_name="bad", n_trials=1,
             n_test=0, n_val=8)
    study = optuna.load_study(study_name="bad", storage=storage)
    study.enqueue_trial({"steps": 9})
    run_tune("llada", tmp_path, **TASK, decode={"block_length": 2}, storage=storage, study_name="bad", n_trials=2,
             n_test=0, n_val=8)
    bad = study.trials[1]
    assert bad.state == optuna.trial.TrialState.PRUNED and "steps=9 must be a multiple" in bad.user_attrs["invalid"]
    # choice: fewest NFE within max_drop of the reference, else the most accurate
    from types import SimpleNamespace as NS

    C = optuna.trial.TrialState.COMPLETE
    trials = [NS(number=0, state=C, values=(1.0, 3.0)), NS(number=1, state=C, values=(0.995, 2.0)),
              NS(number=2, state=C, values=(0.9, 1.0))]
    assert choose_trial(trials, 1.0, 0.01) == (trials[1], True)
    assert choose_trial(trials, 1.0, 0.0) == (trials[0], True)
    assert choose_trial(trials[1:], 1.0, 0.001) == (trials[1], False)


def test_a_study_with_every_trial_pruned_says_so_and_what_to_change():
    from types import SimpleNamespace as NS

    import optuna

    from adaptive_decoding.framework.tuning.front import NoCompleteTrialError

    P, F = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL
    trials = [NS(number=0, state=P, values=None), NS(number=1, state=P, values=None), NS(number=2, state=F, values=None)]
    with pytest.raises(NoCompleteTrialError, match=r"2 of 3 trials were pruned .* and 1 failed; .*--no-prune"):
        choose_trial(trials, 0.8, 0.01)


@pytest.mark.ddp
def test_two_workers_share_one_storage(tmp_path):
    spec = f"sqlite:///{tmp_path / 'shared.db'}"
    res = tune(tmp_path, spec, n_trials=6, workers=2, n_test=0, loaded=carry_model(delay=0.1))
    import optuna

    study = optuna.load_study(study_name="s", storage=spec)
    done = [t for t in study.trials if t.state.is_finished()]
    assert res.n_trials >= 6 and res.ran == len(done) >= 6
    assert sorted(t.number for t in study.trials) == list(range(len(study.trials)))
    workers = {t.user_attrs["worker"].split(":")[0] for t in done}
    assert workers == {"0", "1"}  # both processes ran trials of the one study
    # the enqueued default point ran in this process before the workers started, so no two workers
    # could pop it (optuna/optuna#4621: "Cannot tell a COMPLETE trial" with SQLite)
    import os

    first = min(done, key=lambda t: t.number)
    assert first.user_attrs["worker"] == f"0:{os.getpid()}"
    assert [t.user_attrs["worker"] for t in done].count(f"0:{os.getpid()}") == 1


def test_a_failing_worker_names_its_traceback_and_the_study_keeps_its_trials(tmp_path):
    spec = f"sqlite:///{tmp_path / 'shared.db'}"
    with pytest.raises(RuntimeError) as err:
        tune(tmp_path, spec, n_trials=4, workers=2, n_test=0, loaded=carry_model(fail_elsewhere=True))
    text = str(err.value)
    assert "adec-tune-0 (exit 1)" in text and "adec-tune-1 (exit 1)" in text
    assert "designed failure: CarryAdder called in process" in text  # the worker's own traceback
    assert "Traceback" in text
    import optuna

    study = optuna.load_study(study_name="s", storage=spec)  # the reference the parent computed is kept
    assert study.user_attrs["reference"]["accuracy"] == 1.0


def test_a_long_traceback_keeps_its_header_and_its_end_within_the_limit():
    from adaptive_decoding.framework.tuning.study import traceback_tail

    frames = "".join(f'  File "/a/very/long/path/{i}/module.py", line {i}, in f{i}\n    call()\n' for i in range(200))
    text = "Traceback (most recent call last):\n" + frames + "RuntimeError: designed failure\n"
    cut = traceback_tail(text, limit=500)
    assert len(cut) <= 500 and len(text) > 500
    assert cut.startswith("Traceback (most recent call last):\n  ...\n")
    assert cut.endswith("RuntimeError: designed failure\n") and "line 199, in f199" in cut
    assert traceback_tail("short", limit=500) == "short"


def test_cli_help_and_plot(tmp_path, capsys):
    import argparse

    from adaptive_decoding.framework.cli import tune as tune_cmd

    parser = argparse.ArgumentParser(prog="adec")
    tune_cmd.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["tune", "--help"])
    text = capsys.readouterr().out
    for flag in ("--controller", "--storage", "--workers", "--n-trials", "--max-drop", "journal:PATH"):
        assert flag in text
    args = parser.parse_args(["tune", "--controller", "fast_dllm", "--task", "addition", "--set", "gen_length=4"])
    assert (args.n_trials, args.workers, args.max_drop, args.func) == (20, 1, 0.01, tune_cmd.run)
    res = tune(tmp_path, "memory", n_trials=2, n_test=0, plot=True, study_name="plot")
    assert res.plot is not None and res.plot.stat().st_size > 1000
    assert res.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_user_ranges_replace_the_declared_ones_and_are_checked_first(tmp_path):
    import adaptive_decoding.controllers as controllers  # noqa: F401
    from adaptive_decoding.framework.engine.controller import CONTROLLERS
    from adaptive_decoding.framework.tuning.space import tuned_space

    margin = CONTROLLERS.get("margin_topk")
    space = tuned_space(margin, ranges={"eta": "0.9:0.999", "k": "1:4"})
    assert space["eta"].tune == (0.9, 0.999) and space["k"].tune == (1, 4) and isinstance(space["k"].tune[0], int)
    with pytest.raises(ParameterError, match=r"margin_topk.eta range 2:3 is outside the parameter's bounds \[0, 1\]"):
        tuned_space(margin, ranges={"eta": "2:3"})
    with pytest.raises(ParameterError, match="'nope' is not tuned"):
        tuned_space(margin, ranges={"nope": "0:1"})
    nested = tuned_space(CONTROLLERS.get("verified"), ranges={"inner.threshold": "0.8:0.95"})
    assert nested["inner.threshold"].tune == (0.8, 0.95)
    with pytest.raises(ParameterError, match="outside the parameter's bounds"):  # before any decoding
        tune(tmp_path, "memory", ranges={"threshold": "-1:0.5"})
    res = tune(tmp_path, "memory", n_trials=3, n_test=0, ranges={"threshold": "0.6:0.85"}, study_name="r")
    assert all(0.6 <= f["params"]["threshold"] <= 0.85 for f in res.front)
