"""Options objects: validation naming group, field and value; get_params and YAML round trips; the flat
form a command line gives; the commands build them once from their flags."""

from __future__ import annotations

import argparse

import pytest

from framework.core.params import ParameterError
from framework.jobs.options import JobOptions
from framework.learning.options import PolicyOptions, RLOptions
from framework.tuning.options import TuneOptions

GROUPS = [PolicyOptions, TuneOptions, JobOptions]


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
    import framework.learning.pipeline as pipeline
    from framework.cli import train_controller as cmd

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
    import framework.tuning.study as study
    from framework.cli import tune as cmd

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
