"""Learned controllers: the rollout dataset's exact labels, the policy file, training and decoding."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.learning.features import FEATURE_NAMES
from adaptive_decoding.framework.learning.policy import (
    PolicyFileError,
    PolicyNet,
    load_policy,
    save_policy,
    tiny_policy_file,
)
from adaptive_decoding.framework.learning.rollouts import collect_rollouts
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.testing.carry import carry_model
from adaptive_decoding.framework.testing.toys import CouplingDenoiser

COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


def test_rollout_rows_and_oracle_labels_on_the_coupled_pair():
    """Sequential decoding of the coupled pair ends with (0, 1, t, t). At step 0 position 1 still
    predicts the other pair's word (3): the only unsafe row. Later every prediction is final."""
    data = collect_rollouts(CouplingDenoiser(), [[5]], DecodeConfig(gen_length=4))
    assert data.step.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3]
    assert data.position.tolist() == [0, 1, 2, 3, 1, 2, 3, 2, 3, 3]
    assert data.y.tolist() == [1, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    x = data.X
    assert x[0, COL["confidence"]] == pytest.approx(0.52, abs=1e-4)
    assert x[4, COL["confidence"]] == pytest.approx(0.99, abs=1e-4)  # position 1 follows once 0 is set
    assert x[:4, COL["position_frac"]].tolist() == [0.0, 0.25, 0.5, 0.75]
    assert x[:, COL["progress"]].tolist() == [0.0] * 4 + [0.25] * 3 + [0.5] * 2 + [0.75]
    assert x[:, COL["eligible_frac"]].tolist() == [1.0] * 4 + [0.75] * 3 + [0.5] * 2 + [0.25]
    assert x[:2, COL["confidence_rank"]].tolist() == [0.0, 0.25]  # a tie goes to the lower position
    assert x[:4, COL["left_decided"]].tolist() == [1.0, 0.0, 0.0, 0.0]  # position 0 follows the prompt
    assert x[4, COL["left_decided"]] == 1.0 and x[4, COL["right_decided"]] == 0.0
    assert x[0, COL["relative_confidence"]] == pytest.approx(1.0)


def test_rollout_of_another_controller_is_labelled_by_sequential():
    """fast_dllm at 0.5 commits both words of the pair at once: its rows are labelled against the
    sequential output (0, 1), so position 1's prediction 3 is unsafe there too."""
    data = collect_rollouts(CouplingDenoiser(), [[5]], DecodeConfig(gen_length=4),
                            rollout=build_controller("fast_dllm", threshold=0.5))
    assert data.step.tolist()[:4] == [0, 0, 0, 0] and data.y.tolist()[:4] == [1, 0, 1, 1]
    assert len(data) == 4 + 2 + 1  # fast_dllm commits 2 tokens at step 0, then one per step


def test_policy_file_round_trip_and_clear_errors(tmp_path):
    net = PolicyNet(len(FEATURE_NAMES), (4,))
    torch.manual_seed(0)
    x = torch.randn(5, len(FEATURE_NAMES))
    path = save_policy(net, tmp_path / "p.pt", kind="mlp", threshold=0.7, meta={"task": "t"})
    pol = load_policy(path)
    assert pol.kind == "mlp" and pol.threshold == 0.7 and pol.meta == {"task": "t"}
    assert torch.allclose(pol.prob(x), torch.sigmoid(net(x)).double(), atol=1e-6)

    with pytest.raises(FileNotFoundError, match="nowhere.pt.*adec train-controller"):
        build_controller("learned", policy=str(tmp_path / "nowhere.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(PolicyFileError, match="junk.pt.*cannot be read"):
        build_controller("learned", policy=str(tmp_path / "junk.pt"))
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(PolicyFileError, match="other.pt.*is not an adaptive-decoding.policy file"):
        build_controller("learned", policy=str(tmp_path / "other.pt"))
    blob = torch.load(path, weights_only=True)
    blob["feature_names"] = ["confidence", "a_feature_since_removed"]
    torch.save(blob, tmp_path / "old.pt")
    with pytest.raises(PolicyFileError, match="old.pt.*trained on features.*unknown: a_feature_since_removed"):
        build_controller("learned", policy=str(tmp_path / "old.pt"))
    with pytest.raises(ParameterError, match="holds a mlp policy, not logreg; use --controller learned"):
        build_controller("logreg", policy=str(path))
    with pytest.raises(ParameterError, match="learned.policy is required"):
        build_controller("learned")
    with pytest.raises(ParameterError, match=r"learned.threshold=1.5 is out of range"):
        build_controller("learned", policy=str(path), threshold=1.5)


def test_a_policy_trained_before_a_feature_was_added_reads_its_own_columns(tmp_path):
    """A file whose feature list is a subset of today's (in another order too) is fed exactly those
    columns, in its order; the packaged policies were trained on 20 and 21 of today's columns."""
    names = [FEATURE_NAMES[0], FEATURE_NAMES[5], FEATURE_NAMES[2]]
    net = PolicyNet(3, (4,))
    path = save_policy(net, tmp_path / "p.pt", kind="mlp", threshold=0.6)
    blob = torch.load(path, weights_only=True)
    blob["feature_names"] = names
    torch.save(blob, tmp_path / "subset.pt")
    pol = load_policy(tmp_path / "subset.pt")
    assert pol.columns == (0, 5, 2)
    x = torch.randn(2, 7, len(FEATURE_NAMES))
    assert torch.allclose(pol.prob(x), torch.sigmoid(net(x[..., [0, 5, 2]])).double(), atol=1e-6)
    for name, n in (("sudoku9-set", 20), ("phrases-set-window", 21)):
        assert load_policy(name).columns == tuple(range(n))


def test_threshold_decides_exactly_what_is_committed():
    """τ = 0 commits every eligible position; τ = 1 only the single most likely one per step."""
    policy = str(tiny_policy_file("logreg"))
    cfg = DecodeConfig(gen_length=8)
    prompts = [[1, 2], [3, 4, 5]]
    from adaptive_decoding.framework.testing.toys import ContextToyDenoiser

    all_at_once = decode(ContextToyDenoiser(), prompts,
                         build_controller("logreg", policy=policy, threshold=0.0), cfg)
    one_by_one = decode(ContextToyDenoiser(), prompts,
                        build_controller("logreg", policy=policy, threshold=1.0), cfg)
    assert all_at_once.nfe.tolist() == [1, 1] and one_by_one.nfe.tolist() == [8, 8]
    assert int(all_at_once.forced.sum()) == int(one_by_one.forced.sum()) == 0


def test_train_controller_cli_trains_and_the_policy_decodes(tmp_path, monkeypatch, capsys):
    """``adec train-controller`` on the carry toy (a designed model: the oracle label is exactly
    "confidence ≥ 0.9"): both policies separate the rows, and decoding with the calibrated
    thresholds keeps sequential's accuracy with fewer forward passes."""
    import adaptive_decoding.framework.training.zoo
    from adaptive_decoding.framework.cli import train_controller as cmd

    monkeypatch.setattr(adaptive_decoding.framework.training.zoo, "load_model_for_task",
                        lambda task, model=None, **k: (carry_model(), model or "carry"))
    parser = argparse.ArgumentParser(prog="adec")
    cmd.register(parser.add_subparsers())
    out = tmp_path / "policy"
    args = parser.parse_args(["train-controller", "--task", "addition", "--out", str(out), "--n-train", "96",
                              "--n-val", "24", "--n-test", "32", "--max-epochs", "12", "--hidden", "16",
                              "--wandb", "disabled", "--task-param", "digits=2"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "ROC-AUC" in printed and "learned" in printed

    summary = json.loads((out / "summary.json").read_text())
    for kind in ("mlp", "logreg"):
        m = summary["metrics"][kind]
        assert m["roc_auc"] > 0.99 and m["precision"] > 0.99
    assert (out / "lightning" / "csv").is_dir() and summary["training"]["mlp"]["best_checkpoint"].endswith(".ckpt")
    test = summary["test"]
    for name in ("learned", "logreg"):
        assert test[name]["accuracy"] >= test["sequential"]["accuracy"] - 0.01
        assert test[name]["nfe"] < test["sequential"]["nfe"]
    # the saved policy loads and decodes on its own
    task = get_task("addition", digits=2)
    ctrl = build_controller("learned", policy=str(out / "mlp.pt"))
    assert ctrl.threshold is None and load_policy(out / "mlp.pt").threshold == summary["calibration"]["mlp"]["threshold"]
    ex = task.examples("test", 8)
    res = decode(carry_model().denoiser, [task.prompt_ids(e) for e in ex], ctrl,
                 DecodeConfig(gen_length=task.gen_length))
    assert res.generated.tolist() == [task.target_ids(e) for e in ex]
    assert res.nfe.tolist() == [1 + e.meta["carries"] for e in ex]  # the designed minimum


def test_bad_cli_values_fail_in_one_line(tmp_path):
    from adaptive_decoding.framework.cli import train_controller as cmd
    from adaptive_decoding.framework.cli.errors import CLIError

    parser = argparse.ArgumentParser(prog="adec")
    cmd.register(parser.add_subparsers())
    args = parser.parse_args(["train-controller", "--task", "addition", "--hidden", "a,b"])
    with pytest.raises(CLIError, match="--hidden='a,b'"):
        args.func(args)


def test_features_name_the_columns_a_policy_reads(tmp_path, monkeypatch):
    """--features self: the rows, the network and the file hold the 13 per-position columns only, and
    the policy decodes; an unknown name fails before any work, peer columns on a task without a
    declared structure before the model is loaded."""
    import adaptive_decoding.framework.training.zoo
    from adaptive_decoding.framework.cli import train_controller as cmd
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.learning.features import SELF_FEATURES
    from adaptive_decoding.framework.learning.options import PolicyOptions
    from adaptive_decoding.framework.learning.pipeline import train_policy

    loads = []
    monkeypatch.setattr(adaptive_decoding.framework.training.zoo, "load_model_for_task",
                        lambda task, model=None, **k: loads.append(task) or (carry_model(), model or "carry"))
    parser = argparse.ArgumentParser(prog="adec")
    cmd.register(parser.add_subparsers())
    bad = tmp_path / "bad"
    args = parser.parse_args(["train-controller", "--task", "addition", "--out", str(bad), "--features",
                              "self,nearest_leads"])
    with pytest.raises(CLIError, match="--features: features=nearest_leads: unknown; allowed: the groups "
                                       "self, dependence, peer"):
        args.func(args)
    with pytest.raises(ValueError, match="task 'addition' declares no structure"):
        train_policy("addition", PolicyOptions.from_flat({"out_dir": str(bad), "features": "self,peer",
                                                          "policies": ["logreg"], "verbose": False}))
    assert not bad.exists() and not loads  # refused before the model is loaded
    out = tmp_path / "self"
    options = PolicyOptions.from_flat({"out_dir": str(out), "features": "self", "policies": ["logreg"], "n_train": 48,
                                       "n_val": 16, "n_test": 16, "wandb_mode": "disabled", "verbose": False})
    res = train_policy("addition", options, task_params={"digits": 2})
    pol = load_policy(res.paths["logreg"])
    assert pol.feature_names == SELF_FEATURES and pol.columns == tuple(range(13)) and pol.structure is None
    assert res.dataset["features"] == list(SELF_FEATURES) and res.test["logreg"]["accuracy"] == 1.0


def test_feature_lists_expand_groups_and_keep_the_framework_order():
    from adaptive_decoding.framework.learning.features import (
        DEPENDENCE_FEATURES,
        PEER_FEATURES,
        SELF_FEATURES,
        parse_features,
    )

    assert parse_features("peer,self") == SELF_FEATURES + PEER_FEATURES
    assert parse_features(["margin", "confidence", "peer_leads"]) == ("confidence", "margin", "peer_leads")
    assert parse_features("self, dependence") == SELF_FEATURES + DEPENDENCE_FEATURES
    with pytest.raises(ValueError, match="'confidence' is required"):
        parse_features("margin,dependence")
    with pytest.raises(ValueError, match=r"features=\(none\): unknown"):
        parse_features(" , ")
