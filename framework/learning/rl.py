"""Reinforcement-learning fine-tune of a commit policy: REINFORCE with a group baseline (GRPO-style).

**Actions.** At every step the policy commits each eligible position i with probability
q_i = σ((g(·)_i − logit τ) / T), a Bernoulli policy centred on the threshold rule "p(safe) > τ"
that decoding uses (``learned`` with ``sample=true``; sampling p(safe) itself would commit far
more than the deployed rule and learn from states it never meets); when it draws none, the loop
commits the most likely one, a deterministic function of the draw, so
log π(a | s) = Σ_i [a_i log q_i + (1 − a_i) log(1 − q_i)] over the eligible positions is exact.

**Reward** of a whole decode, correctness first and forward passes second (c ∈ {0, 1} the task's
score, NFE its forward passes, G the generation length, λ ≥ 0):

* ``additive``:        R = c − λ · NFE / G
* ``multiplicative``:  R = c · exp(−λ · NFE / G)   (0 for every wrong answer, whatever its speed)

**Update.** K rollouts per prompt (different seeds); the advantage of rollout j of prompt g is
A_j = R_j − mean_g(R) (divided by std_g(R) + 1e-6 with ``normalise``, as GRPO does); the loss is
−mean over the rollouts' steps of A · log π(a | s). Training runs in Lightning: every epoch draws
fresh prompts and rollouts with the current policy (when its training data is first read), logs
reward, accuracy and NFE to CSV and W&B (offline by default), and checkpoints (``last.ckpt``), so
an interrupted run resumes where it stopped.

**With verification** (``verify_threshold`` τ₂): the rollouts run the sampled policy inside
``verified`` (WINO's hidden-slot check), so earlier commits that fail τ₂ return to the mask. The
actions are still the policy's Bernoulli draws; the re-masks are part of the environment. A
policy trained so is meant to be decoded inside ``verified`` at the same τ₂.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.learning.rollouts import RolloutDataset, StepRecorder
from adaptive_decoding.framework.learning.windows import as_windows

REWARDS = ("additive", "multiplicative")


def reward(correct: torch.Tensor, nfe: torch.Tensor, gen_length: int, lam: float,
           form: str = "additive") -> torch.Tensor:
    """R per rollout (see the module docstring)."""
    if form not in REWARDS:
        raise ValueError(f"reward form {form!r}; allowed: {', '.join(REWARDS)}")
    if not (lam >= 0 and math.isfinite(lam)):
        raise ValueError(f"lambda={lam}; allowed: a finite number ≥ 0")
    c, cost = correct.double(), nfe.double() / float(gen_length)
    return c - lam * cost if form == "additive" else c * torch.exp(-lam * cost)


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, normalise: bool = True) -> torch.Tensor:
    """A = R − mean of R over the rollouts of the same prompt (``groups``), / (std + 1e-6) if
    ``normalise``."""
    _, inv = torch.unique(groups, return_inverse=True)
    n = torch.bincount(inv).double()
    mean = torch.zeros_like(n).index_add_(0, inv, rewards.double()) / n
    adv = rewards.double() - mean[inv]
    if normalise:
        var = torch.zeros_like(n).index_add_(0, inv, adv ** 2) / n
        adv = adv / (var.sqrt()[inv] + 1e-6)
    return adv


def bernoulli_log_prob(logits: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log π of each window's actions: Σ over valid slots of a·log σ(z) + (1 − a)·log σ(−z); ``[N]``."""
    a = actions.to(logits.dtype)
    lp = a * nn.functional.logsigmoid(logits) + (1 - a) * nn.functional.logsigmoid(-logits)
    return (lp * valid).sum(-1)


def centred_logits(z: torch.Tensor, tau: float, temperature: float = 1.0) -> torch.Tensor:
    """(z − logit τ) / T: the commit logits of the threshold-centred Bernoulli policy, from the
    policy's logits z of p(safe) (τ clamped inside (0, 1))."""
    t = min(max(float(tau), 1e-6), 1 - 1e-6)
    return (z - math.log(t / (1 - t))) / temperature


def reinforce_loss(net: nn.Module, x: torch.Tensor, valid: torch.Tensor, actions: torch.Tensor,
                   advantages: torch.Tensor, threshold: float = 0.5,
                   temperature: float = 1.0) -> torch.Tensor:
    """−mean_n A_n · log π(a_n | s_n) over windows n (each carries its rollout's advantage), with the
    action logits :func:`centred_logits` of the threshold-centred Bernoulli policy."""
    logits = centred_logits(net(x, valid), threshold, temperature)
    return -(advantages.to(x.dtype) * bernoulli_log_prob(logits, actions, valid)).mean()


class ActionRecorder(StepRecorder):
    """Wraps the sampling controller; records φ and the Bernoulli draw of every eligible position."""

    def record(self, f: StepFeatures, state: DecodeState, rows: torch.Tensor, decision: Any) -> tuple:
        b, i = f.eligible.nonzero(as_tuple=True)
        return (self.features(f)[b, i].cpu(), rows[b].cpu(), f.step[b].cpu(),
                f.position[b, i].cpu(), decision.info["sampled"][b, i].float().cpu())

    def dataset(self) -> RolloutDataset:
        """The recorded rows, ``y`` = the action taken, ``sample`` = the rollout's row in the decode call."""
        X, rows, step, pos, a = (torch.cat(t) for t in zip(*self.records))
        return RolloutDataset(X=X, y=a, sample=rows, step=step, position=pos)


def rl_windows(kind: str, data: RolloutDataset, advantages: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(x, valid, actions, advantage)`` per window (one window per row for per-position kinds)."""
    w = as_windows(kind, data)
    return w.X, w.valid, w.y, advantages[w.group].float()


def rollout_prompts(task: Any, n_prompts: int, epoch: int, data_seed: int) -> Sequence[Any]:
    """A fresh draw of training prompts for each epoch (seeded by the epoch)."""
    return task.examples("train", n_prompts, seed=data_seed + 7919 * (epoch + 1))
