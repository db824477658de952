"""The window policy, DAgger's labels, the RL update and the new CLI values."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.learning.dagger import collect_on_policy
from adaptive_decoding.framework.learning.features import FEATURE_NAMES
from adaptive_decoding.framework.learning.nets import PolicyNet, WindowPolicyNet
from adaptive_decoding.framework.learning.options import DaggerVisit, NetTraining, RunLogging
from adaptive_decoding.framework.learning.policy import load_policy, save_policy
from adaptive_decoding.framework.learning.rl import (
    bernoulli_log_prob,
    group_advantages,
    reinforce_loss,
    reward,
)
from adaptive_decoding.framework.learning.rollouts import RolloutDataset, collect_rollouts
from adaptive_decoding.framework.learning.train import policy_metrics, train_net
from adaptive_decoding.framework.learning.windows import to_windows
from adaptive_decoding.framework.testing.toys import CouplingDenoiser

F = len(FEATURE_NAMES)
CONF = FEATURE_NAMES.index("confidence")


def coupled_pairs(n: int, seed: int) -> RolloutDataset:
    """Windows of two eligible positions whose features are drawn independently; position i is
    safe exactly when its partner is confident (conf_j > 0.5): a coupled pair. y_i does not depend
    on φ_i at all, so no per-position policy can beat 50% accuracy on balanced data."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, F, generator=g)
    y = torch.stack([X[:, 1, CONF] > 0.5, X[:, 0, CONF] > 0.5], 1).float()
    sample = torch.arange(n).repeat_interleave(2)
    return RolloutDataset(X=X.reshape(-1, F), y=y.reshape(-1), sample=sample,
                          step=torch.zeros(2 * n, dtype=torch.long),
                          position=torch.tensor([0, 1]).repeat(n))


def accuracy(net, data: RolloutDataset, kind: str) -> float:
    m = policy_metrics(net, data, 0.5, kind)
    return m["precision"] * m["commit_rate"] + (1 - m["positive_rate"] - m["commit_rate"] * (1 - m["precision"]))


def test_window_policy_learns_the_coupled_pair_that_no_per_position_policy_can(tmp_path):
    train, val, test = coupled_pairs(1500, 0), coupled_pairs(300, 1), coupled_pairs(400, 2)
    opts = dict(out_dir=tmp_path, training=NetTraining(lr=1e-2, max_epochs=40, patience=40, batch_size=128),
                logging=RunLogging(wandb_mode="disabled"))
    window, _ = train_net("transformer", train, val, arch={"d_model": 16, "layers": 1, "heads": 2}, **opts)
    mlp, _ = train_net("mlp", train, val, arch={"hidden": [16]}, **opts)
    assert accuracy(window, test, "transformer") > 0.9
    assert accuracy(mlp, test, "mlp") < 0.6  # the bound: y_i is independent of φ_i


def test_window_net_ignores_padding_and_the_order_of_the_window():
    torch.manual_seed(0)
    net = WindowPolicyNet(F, d_model=8, layers=2, heads=2).double().eval()
    x = torch.randn(1, 3, F, dtype=torch.float64)
    valid = torch.tensor([[True, True, False]])
    out = net(x, valid)
    x2 = x.clone()
    x2[0, 2] = 100.0  # a padding slot's features do not matter
    assert torch.allclose(net(x2, valid)[0, :2], out[0, :2])
    perm = torch.tensor([1, 0, 2])
    assert torch.allclose(net(x[:, perm], valid[:, perm])[0, :2], out[0, perm[:2]])
    # one window alone equals the same window inside a wider batch
    wide = torch.zeros(2, 5, F, dtype=torch.float64)
    wide[1, :3] = x[0]
    wv = torch.zeros(2, 5, dtype=torch.bool)
    wv[1, :3] = valid[0]
    wv[0, 0] = True
    assert torch.allclose(net(wide, wv)[1, :2], out[0, :2])


def test_transformer_policy_file_round_trip_and_controller(tmp_path):
    net = WindowPolicyNet(F, d_model=8, layers=1, heads=2)
    path = save_policy(net, tmp_path / "transformer.pt", kind="transformer", threshold=0.7)
    pol = load_policy(path)
    assert pol.kind == "transformer" and pol.threshold == 0.7 and pol.net.arch() == {"d_model": 8,
                                                                                     "layers": 1, "heads": 2}
    x, v = torch.randn(2, 4, F), torch.ones(2, 4, dtype=torch.bool)
    assert torch.allclose(pol.prob(x, v), torch.sigmoid(net.double()(x.double(), v)))
    with pytest.raises(ValueError, match="does not match"):
        save_policy(PolicyNet(F, (4,)), tmp_path / "x.pt", kind="transformer")
    with pytest.raises(Exception, match="learned_window"):
        build_controller("learned", policy=str(path)).validate()
    ctrl = build_controller("learned_window", policy=str(path))
    res = decode(CouplingDenoiser(), [[5], [5]], ctrl, DecodeConfig(gen_length=4))
    assert res.generated.shape == (2, 4) and (res.generated != CouplingDenoiser().mask_token_id).all()


class RightToLeft(Controller):
    """Commits the rightmost eligible position each step (a policy that visits other states)."""

    params = {}

    def decide(self, f, state):
        pos = torch.where(f.eligible, f.position, torch.full_like(f.position, -1))
        return Decision(commit=f.eligible & (pos == pos.amax(1, keepdim=True)))


def test_dagger_labels_come_from_the_visited_states():
    """Right to left, the coupled pair's second word is committed first as 3 (pair B). From that
    state the reference continues with 2 at position 0, so DAgger labels 0's prediction 2 safe;
    labelled against the reference trajectory (which ends with pair A, 0 1), it would be unsafe."""
    model, cfg = CouplingDenoiser(), DecodeConfig(gen_length=4)
    d = collect_on_policy(model, [[5]], RightToLeft(), cfg, visit=DaggerVisit.build(states_per_rollout=4))
    assert d.step.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 3]
    assert d.position.tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 0]
    assert d.y.tolist() == [1, 0, 1, 1, 1, 0, 1, 1, 0, 1]
    off_policy = collect_rollouts(model, [[5]], cfg, rollout=RightToLeft())
    assert off_policy.y.tolist()[-1] == 0  # the reference trajectory's label for the same row
    # states_per_rollout keeps that many visited steps (seeded), all rows of each
    few = collect_on_policy(model, [[5]], RightToLeft(), cfg,
                            visit=DaggerVisit.build(states_per_rollout=2, seed=3))
    assert len(set(few.step.tolist())) == 2
    with pytest.raises(ValueError, match="states_per_rollout=0 is out of range"):
        collect_on_policy(model, [[5]], RightToLeft(), cfg, visit=DaggerVisit(states_per_rollout=0))
    with pytest.raises(ValueError, match="states_per_rollout=0 is out of range"):
        DaggerVisit.build(states_per_rollout=0)


def test_decode_continues_from_an_initial_state():
    model, cfg = CouplingDenoiser(), DecodeConfig(gen_length=4)
    m = model.mask_token_id
    res = decode(model, [[5]], build_controller("sequential"), cfg, initial=torch.tensor([[m, 3, m, m]]))
    assert res.generated.tolist()[0][:2] == [2, 3] and res.nfe.tolist() == [3]
    with pytest.raises(ValueError, match="initial has shape"):
        decode(model, [[5]], build_controller("sequential"), cfg, initial=torch.zeros(1, 3, dtype=torch.long))


def test_rl_update_increases_expected_reward_on_a_designed_bandit():
    """Two positions; reward 1 only for committing position 0 and not position 1. E[R] =
    p0·(1 − p1) exactly; REINFORCE steps with a group baseline must raise it."""
    torch.manual_seed(0)
    net = PolicyNet(F, (8,))
    x = torch.zeros(1, 2, F)
    x[0, 0, 0], x[0, 1, 1] = 1.0, 1.0
    valid = torch.ones(1, 2, dtype=torch.bool)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)

    def expected() -> float:
        with torch.no_grad():
            p = torch.sigmoid(net(x, valid))[0]
        return float(p[0] * (1 - p[1]))

    before = expected()
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        with torch.no_grad():
            p = torch.sigmoid(net(x, valid)).expand(32, 2)
        a = (torch.rand(32, 2, generator=g) < p).float()
        r = (a[:, 0] == 1) & (a[:, 1] == 0)
        adv = group_advantages(r.double(), torch.zeros(32, dtype=torch.long))
        loss = reinforce_loss(net, x.expand(32, 2, F), valid.expand(32, 2), a, adv)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert expected() > before + 0.3


def test_rl_pieces_by_hand():
    z = torch.tensor([[0.0, 2.0, -1.0]])
    a = torch.tensor([[1.0, 0.0, 1.0]])
    v = torch.tensor([[True, True, False]])
    want = torch.log(torch.sigmoid(torch.tensor(0.0))) + torch.log(1 - torch.sigmoid(torch.tensor(2.0)))
    assert bernoulli_log_prob(z, a, v).item() == pytest.approx(want.item(), abs=1e-6)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1]), normalise=False)
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]
    assert group_advantages(torch.tensor([1.0, 0.0]),
                            torch.tensor([0, 0])).tolist() == pytest.approx([1, -1], abs=1e-5)
    c, n = torch.tensor([1.0, 0.0]), torch.tensor([8.0, 4.0])
    assert reward(c, n, 16, 0.5).tolist() == [0.75, -0.125]
    assert reward(c, n, 16, 1.0, "multiplicative").tolist() == pytest.approx([0.6065306597, 0.0])
    with pytest.raises(ValueError, match="allowed: additive, multiplicative"):
        reward(c, n, 16, 0.5, "both")
    with pytest.raises(ValueError, match="lambda=-1"):
        reward(c, n, 16, -1.0)


def test_windows_group_rows_by_sample_and_step():
    d = RolloutDataset(X=torch.arange(5.0)[:, None].expand(5, F).clone(), y=torch.tensor([1.0, 0, 1, 1, 0]),
                       sample=torch.tensor([1, 0, 0, 1, 0]), step=torch.tensor([0, 0, 0, 0, 1]),
                       position=torch.tensor([3, 2, 1, 0, 2]))
    w = to_windows(d)
    assert w.valid.tolist() == [[True, True], [True, False], [True, True]]
    assert w.X[:, :, 0].tolist() == [[2.0, 1.0], [4.0, 0.0], [3.0, 0.0]]  # by position within a window
    assert w.group.tolist() == [0, 0, 1]


@pytest.mark.parametrize("argv, message", [
    (["--method", "dagger", "--rounds", "0"],
     "--rounds: rounds=0 with method=dagger; allowed: an integer ≥ 1"),
    (["--policy", "nope"], "--policy: policy=nope; allowed: mlp, logreg, transformer"),
    (["--method", "rl", "--rl-group", "1"], "--rl-group=1 ≥ 2"),
    (["--window-arch", "30,2,4"], "D a multiple of HEADS"),
    (["--dagger-threshold", "1.5"], "--dagger-threshold=1.5; allowed: 0 to 1"),
    (["--method", "rl", "--rl-verify", "1.5"], "--rl-verify=1.5; allowed: 0 to 1"),
    (["--method", "dagger", "--rl-verify", "0.9"],
     "has no effect with --method dagger; it needs --method rl"),
])
def test_bad_values_fail_before_any_work(argv, message, monkeypatch):
    import adaptive_decoding.framework.training.zoo
    from adaptive_decoding.framework.cli import train_controller as cmd
    from adaptive_decoding.framework.cli.errors import CLIError

    def no_work(*a, **k):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(adaptive_decoding.framework.training.zoo, "load_model", no_work)
    monkeypatch.setattr(adaptive_decoding.framework.training.zoo, "load_model_for_task", no_work)
    parser = argparse.ArgumentParser(prog="adec")
    cmd.register(parser.add_subparsers())
    args = parser.parse_args(["train-controller", "--task", "addition", *argv])
    with pytest.raises(CLIError) as err:
        args.func(args)
    assert message in str(err.value)


def _cli(argv, monkeypatch):
    import adaptive_decoding.framework.training.zoo
    from adaptive_decoding.framework.cli import train_controller as cmd
    from adaptive_decoding.framework.testing.carry import carry_model

    monkeypatch.setattr(adaptive_decoding.framework.training.zoo, "load_model_for_task",
                        lambda task, model=None, **k: (carry_model(), model or "carry"))
    parser = argparse.ArgumentParser(prog="adec")
    cmd.register(parser.add_subparsers())
    args = parser.parse_args(["train-controller", "--task", "addition", "--task-param", "digits=2",
                              "--wandb", "disabled", "--n-train", "32", "--n-val", "16", "--n-test", "16",
                              "--max-epochs", "3", *argv])
    assert args.func(args) == 0


def test_dagger_and_window_policy_through_the_cli(tmp_path, monkeypatch):
    """On the carry toy (the oracle label is "confidence ≥ 0.9"), DAgger adds on-policy rows each
    round and both policies keep sequential's accuracy with fewer forwards."""
    import json

    out = tmp_path / "d"
    _cli(["--out", str(out), "--method", "dagger", "--rounds", "2", "--policy", "mlp,transformer",
          "--window-arch", "8,1,2"], monkeypatch)
    s = json.loads((out / "summary.json").read_text())
    assert [(r["round"], r["policy"]) for r in s["rounds"]] == [(1, "mlp"), (1, "transformer"), (2, "mlp"),
                                                                (2, "transformer")]
    assert all(r["rows"] > 0 for r in s["rounds"])
    assert s["rounds"][2]["total_rows"] == s["dataset"]["train_rows"] + s["rounds"][0]["rows"] + s["rounds"][2]["rows"]
    for name in ("learned", "learned_window"):
        assert s["test"][name]["accuracy"] >= s["test"]["sequential"]["accuracy"] - 0.01
        assert s["test"][name]["nfe"] < s["test"]["sequential"]["nfe"]
    assert load_policy(out / "transformer.pt").kind == "transformer"


def test_rl_fine_tune_logs_checkpoints_and_resumes(tmp_path, monkeypatch):
    import json

    out = tmp_path / "r"
    _cli(["--out", str(out), "--method", "rl", "--policy", "mlp", "--rl-iterations", "2", "--rl-prompts", "4",
          "--rl-group", "2", "--no-calibrate"], monkeypatch)
    s = json.loads((out / "summary.json").read_text())
    rl = s["training"]["mlp"]["rl"]
    assert [h["epoch"] for h in rl["history"]] == [0, 1] and not rl["resumed"]  # fresh rollouts every epoch
    assert (out / "mlp" / "rl" / "checkpoints" / "last.ckpt").is_file()
    csv = list((out / "mlp" / "rl" / "lightning" / "csv").rglob("metrics.csv"))
    assert csv and "reward" in csv[0].read_text().splitlines()[0]
    # a second run with more iterations resumes after the finished epoch
    _cli(["--out", str(out), "--method", "rl", "--policy", "mlp", "--rl-iterations", "3", "--rl-prompts", "4",
          "--rl-group", "2", "--no-calibrate"], monkeypatch)
    rl = json.loads((out / "summary.json").read_text())["training"]["mlp"]["rl"]
    assert [h["epoch"] for h in rl["history"]] == [2] and rl["resumed"]


def test_rl_with_verification_rolls_out_inside_verified_and_decodes_so(tmp_path, monkeypatch):
    import json

    import adaptive_decoding.framework.learning.rl as rl_mod

    seen = []
    real = rl_mod.ActionRecorder.__init__

    def spy(self, inner, gen_length, *rest):
        seen.append((inner.display_name(), bool(getattr(inner, "verifies", False))))
        real(self, inner, gen_length, *rest)

    monkeypatch.setattr(rl_mod.ActionRecorder, "__init__", spy)
    out = tmp_path / "v"
    _cli(["--out", str(out), "--method", "rl", "--policy", "mlp", "--rl-iterations", "1", "--rl-prompts", "4",
          "--rl-group", "2", "--rl-verify", "0.9", "--n-test", "8"], monkeypatch)
    assert seen and all(s == ("verified", True) for s in seen)  # every rollout batch, with verification
    rec = rl_mod.ActionRecorder(build_controller("verified", inner="fast_dllm"), 4)
    assert rec.verifies  # the loop sees through the recorder and computes the hidden-slot probabilities
    s = json.loads((out / "summary.json").read_text())
    assert set(s["test"]) == {"sequential",
                              "verified learned"}  # the test decode wraps the policy the same way
    assert s["calibration"]["mlp"]["sweep"]  # and so does the calibration
    assert s["verify_threshold"] == 0.9


def test_sampled_commits_centre_on_the_threshold_rule():
    from adaptive_decoding.controllers.learned import commit_probability

    p = torch.tensor([0.9, 0.99, 0.999])
    q = commit_probability(p, 0.99)
    assert q[1].item() == pytest.approx(0.5) and q[0] < 0.1 and q[2] > 0.9
    cold = commit_probability(p, 0.99, temperature=0.01)
    assert cold[0] < 1e-6 and cold[2] > 1 - 1e-6  # T → 0: the threshold rule
    # the RL loss uses the same logits: at a = 1 and p = τ, log π = log 0.5
    net = PolicyNet(F, ())
    with torch.no_grad():
        net.net[0].weight.zero_()
        net.net[0].bias.fill_(float(torch.logit(torch.tensor(0.99))))
    loss = reinforce_loss(net, torch.zeros(1, 1, F), torch.ones(1, 1, dtype=torch.bool), torch.ones(1, 1),
                          torch.ones(1), threshold=0.99)
    assert loss.item() == pytest.approx(-math.log(0.5), abs=1e-5)


def test_the_window_policy_is_tuned_by_name(tmp_path, monkeypatch):
    """``adec tune`` tunes a learned controller's threshold like any other controller's."""
    from adaptive_decoding.framework.testing.carry import carry_model
    from adaptive_decoding.framework.tuning.options import TuneOptions
    from adaptive_decoding.framework.tuning.study import tune_controller

    out = tmp_path / "p"
    _cli(["--out", str(out), "--policy", "transformer", "--window-arch", "8,1,2", "--no-calibrate",
          "--n-test", "0"],
         monkeypatch)
    options = TuneOptions.from_flat({"n_trials": 3, "n_val": 16, "n_test": 16, "batch_size": 16,
                                     "out_dir": str(tmp_path / "tune"), "study_name": "w", "plot": False,
                                     "verbose": False, "fixed": {"policy": str(out / "transformer.pt")},
                                     "storage": "memory"})
    res = tune_controller("learned_window", "addition", options, loaded=carry_model(), task_params={"digits": 2})
    assert res.ran == 3 and 0.5 <= res.params["threshold"] <= 0.999
    assert res.test["accuracy"] >= res.reference_test["accuracy"] - 0.01


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_an_untrained_residual_policy_is_the_confidence_rule(kind, tmp_path):
    """logit p(safe) = logit(confidence) + g, g zero at the start: learned at τ decodes exactly as
    fast_dllm at τ (commit where confidence > τ, else the most confident)."""
    from adaptive_decoding.framework.learning.nets import build_net

    net = build_net(kind, {"residual": True,
                           **({"d_model": 8, "layers": 1, "heads": 2} if kind == "transformer" else {})})
    path = save_policy(net, tmp_path / f"{kind}.pt", kind=kind, threshold=0.9)
    assert load_policy(path).net.residual
    name = "learned_window" if kind == "transformer" else "learned"
    model, cfg = CouplingDenoiser(), DecodeConfig(gen_length=4)
    for tau in (0.5, 0.9, 0.999):
        a = decode(model, [[5], [5]], build_controller(name, policy=str(path), threshold=tau), cfg,
                   trace=True)
        b = decode(model, [[5], [5]], build_controller("fast_dllm", threshold=tau), cfg, trace=True)
        assert torch.equal(a.generated, b.generated) and torch.equal(a.nfe, b.nfe)
        assert all(torch.equal(x["commit"], y["commit"]) for x, y in zip(a.trace, b.trace))


def test_negative_weight_scales_the_unsafe_rows():
    from adaptive_decoding.framework.learning.train import masked_bce

    z, y, v = torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool)
    assert masked_bce(z, y, v).item() == pytest.approx(math.log(2))
    z2 = torch.tensor([[0.0, 1.0]])
    l1, l2 = masked_bce(z2, y, v, 1.0).item(), masked_bce(z2, y, v, 3.0).item()
    want = (math.log(2) + 3 * math.log(1 + math.e)) / 4
    assert l2 == pytest.approx(want) and l2 > l1


def test_bad_rl_settings_fail_before_the_imitation_rollouts():
    from adaptive_decoding.framework.core.params import ParameterError
    from adaptive_decoding.framework.learning.options import PolicyOptions

    for rl, message in (({"group": 1}, r"rl.group=1 is out of range; allowed: integer in \[2, inf\)"),
                        ({"threshold": 1.0}, r"rl.threshold=1.0 is out of range; allowed: strictly between 0"),
                        ({"verify_threshold": 2}, r"rl.verify_threshold=2 is out of range; allowed: number in "
                                                  r"\[0, 1\] or null")):
        with pytest.raises(ParameterError, match=message):  # when the options are built: before any work
            PolicyOptions.from_dict({"rounds": {"method": "rl"}, "rl": rl})
