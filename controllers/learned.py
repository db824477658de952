"""Learned controllers: commit the positions a trained policy calls safe.

A policy file (``adec train-controller``, see :mod:`adaptive_decoding.framework.learning`) maps each eligible
position's feature vector φ to p(safe | φ), the probability that its current prediction x0 is
already the token one-token-per-step decoding ends with. Each step commits every eligible
position with p(safe) > τ, and at least the one with the highest p(safe), so no step stalls.

* ``learned``: the Lightning-trained MLP policy (``mlp.pt``; imitation, DAgger or RL-tuned);
* ``learned_window``: the window transformer (``transformer.pt``), whose p(safe) at a position
  depends on the features of every other eligible position of the step;
* ``logreg``: the scikit-learn logistic-regression baseline (``logreg.pt``).

With ``sample=true`` each eligible position is committed with probability
σ((logit p(safe) − logit τ) / T) instead (T = ``sample_temperature``; Bernoulli actions drawn per
sample from its seed, step and position): a stochastic policy centred on the threshold rule (it
commits a position at p(safe) = τ half the time, and tends to the rule as T → 0), the one the
reinforcement-learning fine-tune samples; ``info["sampled"]`` holds the draw.

τ = ``threshold``; ``null`` uses the threshold calibrated into the file. A missing or corrupt
policy file fails when the controller is built, with a message naming the file.
``conformance_params()`` points to a small random policy written to a temporary folder, so the
shared conformance suite can exercise these controllers without a trained file.
"""

from __future__ import annotations

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.core.rng import uniform_at
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.learning.features import feature_matrix
from adaptive_decoding.framework.learning.nets import CONTROLLER_OF
from adaptive_decoding.framework.learning.policy import load_policy, tiny_policy_file
from adaptive_decoding.framework.learning.rl import centred_logits


def commit_probability(p_safe: torch.Tensor, tau: float, temperature: float = 1.0) -> torch.Tensor:
    """σ((logit p − logit τ) / T): the sampled policy's commit probability (the RL fine-tune's)."""
    return torch.sigmoid(centred_logits(torch.logit(p_safe.clamp(1e-12, 1 - 1e-12)), tau, temperature))


@CONTROLLERS.register("learned", aliases=("learned_mlp",))
class Learned(Controller):
    """Learned MLP policy: commit eligible positions with p(safe) > τ (at least the most likely)."""

    kind = "learned"
    policy_kind = "mlp"
    params = {
        "policy": Param(str, doc="policy file written by 'adec train-controller' (mlp.pt / transformer.pt / logreg.pt)"),
        "threshold": Param(float, low=0.0, high=1.0, nullable=True, tune=(0.5, 0.999),
                           doc="τ: commit where p(safe) > τ; null = the file's calibrated threshold"),
        "sample": Param(bool, doc="commit with probability σ((logit p(safe) − logit τ)/T) (RL rollouts)"),
        "sample_temperature": Param(float, low=1e-3, high=100.0, doc="T of the sampled commits"),
    }
    SALT = 0x1EA7

    def __init__(self, policy: str = "", threshold: float | None = None, sample: bool = False,
                 sample_temperature: float = 1.0) -> None:
        self.policy = policy
        self.threshold = threshold
        self.sample = sample
        self.sample_temperature = sample_temperature

    @property
    def stochastic(self) -> bool:  # type: ignore[override]
        return bool(self.sample)

    def check_combination(self) -> None:
        owner = self.display_name()
        if not self.policy:
            raise ParameterError(f"{owner}.policy is required: the path of a policy file written by "
                                 f"'adec train-controller' (--set policy=runs/controllers/TASK-MODEL/"
                                 f"{self.policy_kind}.pt)")
        pol = load_policy(self.policy)
        if pol.kind != self.policy_kind:
            other = CONTROLLER_OF[pol.kind]
            raise ParameterError(f"{owner}.policy={self.policy!r} holds a {pol.kind} policy, not "
                                 f"{self.policy_kind}; use --controller {other}")

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        pol = load_policy(self.policy)
        p_safe = pol.prob(feature_matrix(f, state.config.gen_length, pol.structure), f.eligible)
        info = {}
        tau = pol.threshold if self.threshold is None else self.threshold
        if self.sample:
            u = uniform_at(state.seeds, f.step, self.SALT, f.position)
            chosen = f.eligible & (u < commit_probability(p_safe, tau, self.sample_temperature))
            info["sampled"] = chosen
        else:
            chosen = f.eligible & (p_safe > tau)
        commit = chosen | (select_topk(p_safe, f.eligible, 1) & ~chosen.any(1, keepdim=True))
        return Decision(commit=commit, info={"committed": commit.sum(1), **info})

    @classmethod
    def conformance_params(cls) -> dict:
        return {"policy": str(tiny_policy_file(cls.policy_kind)), "threshold": 0.5}


@CONTROLLERS.register("learned_window", aliases=("learned_transformer",))
class LearnedWindow(Learned):
    """Learned window transformer: p(safe) of a position sees the whole window; commit > τ."""

    policy_kind = "transformer"


@CONTROLLERS.register("logreg", aliases=("learned_logreg",))
class LogReg(Learned):
    """Learned logistic-regression policy (scikit-learn): commit where p(safe) > τ (at least one)."""

    policy_kind = "logreg"
