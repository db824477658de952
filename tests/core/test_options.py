"""Options objects: validation naming group, field and value; get_params and YAML round trips; the flat
form a command line gives; the commands build them once from their flags."""

from __future__ import annotations

import argparse

import pytest

from adaptive_decoding.experiments.options import ExperimentOptions, ShardedEvaluation
from adaptive_decoding.framework.core.options import ExampleDraw, PathParam
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.features import FeatureOptions
from adaptive_decoding.framework.engine.lookahead.sweep import SweepGrid
from adaptive_decoding.framework.jobs.options import JobOptions
from adaptive_decoding.framework.learning.options import (
    DaggerVisit,
    PolicyOptions,
    RLOptions,
    ThresholdCalibration,
)
from adaptive_decoding.framework.profiling.options import ProfileArch, ProfileOptions
from adaptive_decoding.framework.training.options import CausalOptions, DenoiserOptions
from adaptive_decoding.framework.tuning.options import TuneOptions

GROUPS = [PolicyOptions, TuneOptions, JobOptions, DenoiserOptions, CausalOptions, ProfileOptions, ExperimentOptions]
SINGLE = [ExampleDraw, DaggerVisit, ThresholdCalibration, ProfileArch, ShardedEvaluation, FeatureOptions,
          SweepGrid]


@pytest.mark.parametrize("cls", GROUPS)
def test_defaults_round_trip_through_get_params_and_yaml(cls):
    opts = cls().validate()
    again = cls.from_dict(opts.get_params())
    assert again == opts and again.get_params() == opts.get_params()
    assert cls.from_yaml(opts.to_yaml()) == opts
    for name, group in opts.groups().items():  # each group on its own too
        assert type(group).from_yaml(group.to_yaml()) == group, name
        assert type(group).build(**group.get_params()) == group, name


def test_a_changed_policy_option_round_trips_and_differs_from_the_default():
    opts = PolicyOptions.from_flat({"n_train": 48, "policies": "mlp,transformer", "hidden": [8], "rl.lr": 0.01,
                                    "training.lr": 0.02, "method": "rl", "thresholds": [0.5, 0.9]})
    assert opts.data.n_train == 48 and opts.network.policies == ["mlp", "transformer"]
    assert opts.rl.lr == 0.01 and opts.training.lr == 0.02 and opts.calibration.thresholds == [0.5, 0.9]
    assert PolicyOptions.from_yaml(opts.to_yaml()) == opts and opts != PolicyOptions().validate()


@pytest.mark.parametrize("values, message", [
    ({"data": {"n_train": 0}}, r"data.n_train=0 is out of range; allowed: integer in \[1, inf\)"),
    ({"network": {"policies": ["mlp", "forest"]}}, "network.policies=.* allowed: a non-empty list of 'mlp'"),
    ({"network": {"hidden": [32, 0]}}, r"network.hidden=\[32, 0\] is not allowed; allowed: a list of integers ≥ 1"),
    ({"rounds": {"method": "dagger", "rounds": 0}}, "rounds=0 with method=dagger; allowed: an integer ≥ 1"),
    ({"rl": {"reward_form": "log"}}, "rl.reward_form='log' is not allowed; allowed: one of 'additive'"),
    ({"calibration": {"thresholds": [0.5, 1.5]}}, "calibration.thresholds=.* numbers in \\[0, 1\\]"),
    ({"output": {"wandb_mode": "cloud"}}, "output.wandb_mode='cloud' is not allowed"),
    ({"data": {"features": "self,nope"}}, "features=nope: unknown"),
    ({"network": {"nope": 1}}, "network has no parameter 'nope'; known: policies, hidden"),
    ({"nets": {}}, "PolicyOptions has no group 'nets'; known: data, network"),
    ({"data": 3}, "data=3 is not allowed; allowed: a mapping of n_train"),
])
def test_bad_policy_options_are_refused_naming_the_group_and_the_value(values, message):
    with pytest.raises((ParameterError, ValueError), match=message):
        PolicyOptions.from_dict(values)


def test_the_flat_form_routes_each_name_to_its_group_and_refuses_ambiguity():
    with pytest.raises(ParameterError, match="option 'lr': declared by training and rl; write GROUP.lr"):
        PolicyOptions.from_flat({"lr": 0.1})
    with pytest.raises(ParameterError, match="option 'n_trails': known: n_trials"):
        TuneOptions.from_flat({"n_trails": 3})
    with pytest.raises(ParameterError, match="has no option 'data.lr'"):
        PolicyOptions.from_flat({"data.lr": 0.1})
    assert TuneOptions.from_flat({"workers": 2, "max_drop": 0.1}).study.workers == 2


def test_rl_threshold_must_be_strictly_inside_the_unit_interval_and_its_seed_follows_training():
    with pytest.raises(ParameterError, match="rl.threshold=1.0 is out of range"):
        RLOptions.build(threshold=1.0)
    with pytest.raises(ParameterError, match="rl.threshold=0.0 is out of range"):
        RLOptions.build(threshold=0.0)
    opts = PolicyOptions.from_flat({"training.seed": 5})
    assert opts.rl_options().seed == 5 and PolicyOptions.from_flat({"rl.seed": 2}).rl_options().seed == 2


def test_job_options_keep_the_job_checks_wording():
    with pytest.raises(ParameterError, match=r"batch_size=0 is out of range; allowed: integer in \[1, inf\)"):
        JobOptions.from_flat({"batch_size": 0})
    with pytest.raises(ParameterError, match=r"item_timeout_s=-1 is out of range; allowed: number in \(0, inf\)"):
        JobOptions.from_flat({"item_timeout_s": -1})
    with pytest.raises(ParameterError, match="on_error='explode' is not allowed; allowed: one of 'skip', 'refuse'"):
        JobOptions.from_flat({"on_error": "explode"})


def _parsed(module, argv):
    parser = argparse.ArgumentParser(prog="adec")
    module.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_train_controller_builds_its_options_once_from_the_flags(monkeypatch):
    import adaptive_decoding.framework.learning.pipeline as pipeline
    from adaptive_decoding.framework.cli import train_controller as cmd

    seen = []
    monkeypatch.setattr(pipeline, "train_policy", lambda task, options, **kw: seen.append((task, options, kw)))
    args = _parsed(cmd, ["train-controller", "--task", "addition", "--n-train", "48", "--policy", "mlp",
                         "--hidden", "16,8", "--method", "rl", "--rl-group", "3", "--rl-lr", "0.01", "--lr", "0.02",
                         "--no-calibrate", "--set", "cache=prefix", "--wandb", "disabled", "--rl-no-std"])
    assert args.func(args) == 0
    task, opts, kw = seen[0]
    want = PolicyOptions.from_flat({"n_train": 48, "policies": ["mlp"], "hidden": [16, 8], "method": "rl",
                                    "group": 3, "rl.lr": 0.01, "training.lr": 0.02, "calibrate": False,
                                    "decode": {"cache": "prefix"}, "wandb_mode": "disabled", "normalise": False,
                                    "window_arch": {"d_model": 32, "layers": 2, "heads": 4}})
    assert task == "addition" and opts == want and kw["device"] in ("cpu", "cuda")  # auto, resolved


def test_tune_builds_its_options_once_from_the_flags(monkeypatch, tmp_path):
    import adaptive_decoding.framework.tuning.study as study
    from adaptive_decoding.framework.cli import tune as cmd

    seen = []

    class Stop(Exception):
        pass

    def fake(controller, task, options, **kw):
        seen.append(options)
        raise Stop

    monkeypatch.setattr(study, "tune_controller", fake)
    args = _parsed(cmd, ["tune", "--controller", "fast_dllm", "--task", "addition", "--n-trials", "3",
                         "--set", "gen_length=8", "--no-prune", "--range", "threshold=0.6:0.9",
                         "--out", str(tmp_path), "--no-plot"])
    with pytest.raises(Stop):
        args.func(args)
    want = TuneOptions.from_flat({"n_trials": 3, "decode": {"gen_length": 8}, "prune_margin": None,
                                  "ranges": {"threshold": "0.6:0.9"}, "out_dir": str(tmp_path), "plot": False})
    assert seen == [want]


# ---------------------------------------------------------------------- the second pass's groups
@pytest.mark.parametrize("cls", SINGLE)
def test_single_groups_round_trip_and_refuse_unknown_names(cls):
    opts = cls.build()
    assert cls.from_yaml(opts.to_yaml()) == opts and cls.build(**opts.get_params()) == opts
    with pytest.raises(ParameterError, match="has no parameter 'nope'"):
        cls.build(nope=1)


@pytest.mark.parametrize("build, message", [
    (lambda: ExampleDraw.build(split="dev"), "draw.split='dev' is not allowed; allowed: one of 'train'"),
    (lambda: ExampleDraw.build(n=0), r"draw.n=0 is out of range; allowed: integer in \[1, inf\)"),
    (lambda: ThresholdCalibration.build(thresholds=[0.5, 2]), "calibration.thresholds=.* numbers in \\[0, 1\\]"),
    (lambda: DaggerVisit.build(batch_size=0), r"^batch_size=0 is out of range"),  # collect_on_policy's own names
    (lambda: ProfileArch.build(d_model=30, n_heads=4), "arch.n_heads=4 does not divide arch.d_model=30"),
    (lambda: ProfileOptions.from_flat({"caches": ["triple"]}), "sweep.caches=.* allowed: a non-empty list of 'none'"),
    (lambda: ProfileOptions.from_flat({"batches": [1, 0]}), r"shapes.batches=\[1, 0\] is not allowed"),
    (lambda: DenoiserOptions.from_flat({"model_size": "huge"}), "recipe.model_size='huge' is not allowed; allowed: tiny"),
    (lambda: DenoiserOptions.from_flat({"wandb_mode": "cloud"}), "logging.wandb_mode='cloud' is not allowed"),
    (lambda: DenoiserOptions.from_flat({"out_dir": 3}), "run.out_dir=3 is not allowed; allowed: a path or null"),
    (lambda: CausalOptions.from_flat({"corrupt": 1.5}), r"recipe.corrupt=1.5 is out of range; allowed: number in \[0, 1\]"),
    (lambda: ExperimentOptions.from_flat({"resume": True, "overwrite": True}), "resume=True and overwrite=True exclude"),
    (lambda: ShardedEvaluation.build(repeats=0), "evaluation.repeats=0 is out of range"),
    (lambda: FeatureOptions.build(gen_length=0), r"features.gen_length=0 is out of range; allowed: integer in \[1"),
    (lambda: FeatureOptions.build(temperature=-1.0), r"features.temperature=-1.0 is out of range"),
    (lambda: SweepGrid.build(widths=[2, 0]), r"sweep.widths=\[2, 0\] is not allowed; allowed: a list of integers ≥ 1"),
])
def test_bad_values_of_the_new_groups_are_refused_naming_the_field(build, message):
    with pytest.raises(ParameterError, match=message):
        build()


def test_the_denoiser_recipe_declares_every_field_of_a_tasks_recipe():
    import dataclasses

    from adaptive_decoding.framework.tasks.base import Recipe
    from adaptive_decoding.framework.training.options import DenoiserRecipe

    fields = {f.name for f in dataclasses.fields(Recipe)}
    assert set(DenoiserRecipe.params) == (fields - {"size"}) | {"model_size"}
    assert DenoiserRecipe.build(model_size="tiny", max_steps=20).overrides() == {"size": "tiny", "max_steps": 20}


def test_the_causal_recipe_is_the_verifiers_recipe():
    from adaptive_decoding.framework.training.causal_lm import RECIPE

    assert CausalOptions().validate().recipe.get_params() == RECIPE


def test_flat_keywords_replace_the_fields_of_the_options_given(tmp_path):
    base = DenoiserOptions.from_flat({"max_steps": 50, "seed": 3, "progress": False})
    opts = DenoiserOptions.with_flat(base, {"max_steps": 20, "out_dir": tmp_path, "wandb_mode": "disabled"})
    assert opts.recipe.max_steps == 20 and opts.run.seed == 3 and opts.logging.progress is False
    assert opts.run.out_dir == str(tmp_path) and opts.logging.wandb_mode == "disabled"
    assert base.recipe.max_steps == 50 and base.logging.wandb_mode == "offline"  # the given options untouched
    assert DenoiserOptions.with_flat(None, {}) == DenoiserOptions().validate()
    with pytest.raises(ParameterError, match="DenoiserOptions option 'max_step': known: model_size"):
        DenoiserOptions.with_flat(base, {"max_step": 20})


def test_a_path_param_takes_a_string_or_a_path_and_stores_a_string(tmp_path):
    assert PathParam(nullable=True).check("run", "out_dir", tmp_path) == str(tmp_path)
    assert PathParam(nullable=True).check("run", "out_dir", None) is None
    with pytest.raises(ParameterError, match="run.out_dir='' is not allowed"):
        PathParam().check("run", "out_dir", "")


def test_profile_builds_its_options_once_from_the_flags(monkeypatch):
    import adaptive_decoding.framework.profiling as profiling
    from adaptive_decoding.framework.cli import profile as cmd

    seen = []

    class Stop(Exception):
        pass

    def fake(model, options, **kw):
        seen.append(options)
        raise Stop

    monkeypatch.setattr(profiling, "run_profile", fake)
    args = _parsed(cmd, ["profile", "--batch", "1", "2", "--cache", "dual", "--temperature", "0", "--repeats", "1",
                         "--prompt-length", "8", "--gen-length", "16", "--block-length", "8", "--tokens-per-step", "2",
                         "--vocab-size", "64", "--d-model", "16", "--layers", "1", "--heads", "2", "--device", "cpu",
                         "--loops", "decode", "verify"])
    with pytest.raises(Stop):
        args.func(args)
    want = ProfileOptions.from_flat({"batches": [1, 2], "caches": ["dual"], "temperatures": [0.0], "repeats": 1,
                                     "prompt_length": 8, "gen_length": 16, "block_length": 8, "steps": 8,
                                     "loops": ["decode", "verify"]})
    assert seen == [want]


def test_train_denoiser_builds_its_options_once_from_the_flags(monkeypatch, tmp_path):
    import adaptive_decoding.framework.training.masked_diffusion as md
    from adaptive_decoding.framework.cli import train as cmd

    seen = []

    class Stop(Exception):
        pass

    def fake(task, options, **kw):
        seen.append((task.name, options, kw))
        raise Stop

    monkeypatch.setattr(md, "train_denoiser", fake)
    args = _parsed(cmd, ["train-denoiser", "--task", "addition", "--max-steps", "20", "--size", "tiny", "--out",
                         str(tmp_path), "--wandb", "disabled", "--no-progress", "--threads", "1", "--seed", "2"])
    with pytest.raises(Stop):
        args.func(args)
    want = DenoiserOptions.from_flat({"max_steps": 20, "model_size": "tiny", "out_dir": str(tmp_path), "seed": 2,
                                      "num_threads": 1, "wandb_mode": "disabled", "progress": False})
    assert seen == [("addition", want, {})]


def test_run_builds_its_options_once_from_the_flags(monkeypatch, tmp_path):
    import adaptive_decoding.experiments.runner as runner
    from adaptive_decoding.framework.cli import run as cmd

    seen = []

    class Stop(Exception):
        pass

    def fake(exp, out, options, **kw):
        seen.append(options)
        raise Stop

    monkeypatch.setattr(runner, "run_experiment", fake)
    path = tmp_path / "e.yaml"
    path.write_text("name: e\nmodel: tiny-addition\ntasks: [addition]\nn: 2\n"
                    "strategies: [{label: s, controller: sequential}]\n")
    args = _parsed(cmd, ["run", str(path), "--wandb", "disabled", "--no-progress", "--max-cells", "1",
                         "--out", str(tmp_path / "runs")])
    with pytest.raises(Stop):
        args.func(args)
    assert seen[0].cells.max_cells == 1 and seen[0].cells.resume is False and seen[0].cells.command
    assert seen[0].logging.get_params() == {"wandb_mode": "disabled", "progress": False, "run_config": None}
