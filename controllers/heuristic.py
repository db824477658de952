"""Heuristic controllers: margin top-k, entropy top-k, the confidence ladder, and compositions.

Symbols (the seeds' and the issue's): η the margin threshold, m a step's mean margin over the
eligible positions, k the number of candidates kept at an uncertain position for lookahead
(``Decision.k``, 1 = none kept), H the entropy in nats, k_base / α / τ / k_max of the entropy rule,
d the lookahead depth (``Decision.depth``).

* ``margin_topk``: commit where ``top1 − top2 > η``; keep k candidates elsewhere; η fixed or
  EMA-adapted per sample.
* ``entropy_topk``: ``k = clamp(round(k_base + α·H/τ), 1, k_max)``, bucketed; commit where the
  entropy term asks for no extra candidate.
* ``confidence_ladder``: lookahead depth from the least-confident top-1, wrapping any commit rule.
* ``switch`` / ``hybrid`` / ``compose``: sub-controllers given by config.

Sub-controllers are :class:`~adaptive_decoding.framework.core.params.ControllerSpec` parameters, given as a
registered name, ``"tuned:PATH"`` or ``{"name": NAME, "params": {...}}``; their parameters are
tuned by dotted names (``base.eta``, ``controllers.0.eta``, ``margin.eta``). Each child keeps its state in ``state.memory`` under the
prefix ``"<owner>/<slot>/"`` (e.g. ``hybrid/margin/margin_topk.eta``): the owner hands it a view
of its own keys and writes them back, so any controller can be a child without knowing it, and two
children of the same kind never share a key. Every decision commits a subset of
``features.eligible`` and at least one position per row that has eligible positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import ControllerSpec, NumberListParam, Param, ParameterError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.nesting import Composite
from adaptive_decoding.framework.engine.selection import select_topk


def _scatter_rows(f: StepFeatures, parts: Sequence[tuple[str, torch.Tensor, Decision]]) -> Decision:
    """One batch decision from per-row-subset decisions ``(slot, rows, decision)``."""
    b, l = f.x0.shape  # noqa: E741
    commit = torch.zeros_like(f.eligible)
    k = torch.ones_like(f.x0)
    tokens = depth = nbl = None
    info: dict[str, torch.Tensor] = {}
    for slot, rows, d in parts:
        commit[rows] = d.commit & f.eligible[rows]
        if d.tokens is not None:
            tokens = f.x0.clone() if tokens is None else tokens
            tokens[rows] = d.tokens
        if d.k is not None:
            k[rows] = d.k.to(k)
        if d.depth is not None:
            depth = torch.zeros(b, dtype=torch.long, device=k.device) if depth is None else depth
            depth[rows] = d.depth.to(depth)
        if d.next_block_length is not None:
            nbl = (f.block_end - f.block_start).clamp(min=1) if nbl is None else nbl
            nbl[rows] = d.next_block_length.to(nbl)
        for key, value in d.info.items():
            full = info.setdefault(f"{slot}.{key}", torch.zeros((b, *value.shape[1:]), dtype=value.dtype,
                                                                device=value.device))
            full[rows] = value
    return Decision(commit=commit, tokens=tokens, k=torch.where(f.eligible & ~commit, k, 1), depth=depth,
                    next_block_length=nbl, info=info)


def _depth_where_kept(k: torch.Tensor, depth: int) -> torch.Tensor:
    """``depth`` for rows that keep candidates somewhere (k > 1), else 0 (commit directly)."""
    return torch.where((k > 1).any(1), int(depth), 0).long()


def _eligible_mean(values: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    n = eligible.sum(1)
    return torch.where(eligible, values, torch.zeros_like(values)).sum(1) / n.clamp(min=1)


# ---------------------------------------------------------------------- margin top-k
@CONTROLLERS.register("margin_topk")
class MarginTopK(Controller):
    """Margin top-k: commit where top1 − top2 > η; keep the top-k candidates elsewhere.

    η is per sample (``state.memory["margin_topk.eta"]``, initial ``eta``). Step t decides with
    η_t; with ``adapt`` the row then updates ``η_{t+1} = β·η_t + (1 − β)·m_t``, m_t the mean margin
    over the row's eligible positions (the seed's ``η = 0.9·η + 0.1·margin``). The eligible position
    with the largest margin is always committed, so a row where no margin exceeds η still makes
    progress, and one where every margin does commits them all (k = 1 everywhere, no empty top-k).
    Rows that keep candidates ask for lookahead depth ``depth`` (``Decision.depth``), others 0.
    """

    params = {
        "eta": Param(float, low=0.0, high=1.0, doc="margin threshold η (initial η when adapt)", tune=(0.1, 0.5)),
        "k": Param(int, low=1, high=64, doc="candidates kept at each low-margin position", tune=(2, 5)),
        "adapt": Param(bool, doc="EMA-adapt η per sample from the step's mean margin", tune=(False, True)),
        "beta": Param(float, low=0.0, high=1.0, doc="EMA decay β in η ← β·η + (1 − β)·m"),
        "depth": Param(int, low=0, high=64, doc="lookahead depth d where candidates are kept (0 = none)"),
    }
    MEMORY = "margin_topk.eta"

    def __init__(self, eta: float = 0.3, k: int = 3, adapt: bool = False, beta: float = 0.9,
                 depth: int = 1) -> None:
        self.eta = eta
        self.k = k
        self.adapt = adapt
        self.beta = beta
        self.depth = depth

    def check_combination(self) -> None:
        if not self.adapt and self.beta != 0.9:
            self.warn_no_effect("beta", "adapt=false keeps η fixed")

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        state.memory[self.MEMORY] = torch.full((state.batch_size,), float(self.eta), device=state.seeds.device)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        eta = state.memory.get(self.MEMORY)
        if eta is None:  # decide() without reset(): start from the initial η
            eta = torch.full((f.batch_size,), float(self.eta), device=f.margin.device)
        commit = (f.eligible & (f.margin > eta[:, None])) | select_topk(f.margin, f.eligible, 1)
        k = torch.where(f.eligible & ~commit, self.k, 1)
        nxt = eta
        if self.adapt:
            m = _eligible_mean(f.margin.float(), f.eligible)
            nxt = torch.where(f.eligible.any(1), self.beta * eta + (1.0 - self.beta) * m, eta)
        state.memory[self.MEMORY] = nxt
        return Decision(commit=commit, k=k, depth=_depth_where_kept(k, self.depth), info={"eta": eta, "k": k.amax(1)})


# ---------------------------------------------------------------------- entropy top-k
def bucket_k(k: torch.Tensor, buckets: Sequence[int]) -> torch.Tensor:
    """Round each k up to the smallest allowed bucket ≥ k (the largest bucket if none is)."""
    table = torch.as_tensor(sorted(buckets), dtype=torch.long, device=k.device)
    idx = torch.searchsorted(table, k.long().contiguous()).clamp(max=table.numel() - 1)
    return table[idx]


def pow2_buckets(k_max: int) -> list[int]:
    """Powers of two below ``k_max``, then ``k_max``: 5 -> [1, 2, 4, 5], 8 -> [1, 2, 4, 8]."""
    out = [1 << i for i in range(k_max.bit_length()) if (1 << i) < k_max]
    return out + [k_max]


@CONTROLLERS.register("entropy_topk")
class EntropyTopK(Controller):
    """Entropy top-k: k = clamp(round(k_base + α·H/τ), 1, k_max), bucketed; commit the confident.

    ``round`` is half-up (``floor(x + 1/2)``). Commit rule: a position is committed when the
    entropy term adds no candidate, ``floor(k_base + α·H/τ + 1/2) = k_base`` (⇔ α·H/τ < 1/2; with
    k_base = 1 exactly "k would be 1"; read literally, k ≥ k_base ≥ 2 would never commit); at
    least the lowest-entropy eligible position. Uncertain positions keep ``bucket(k)`` candidates,
    the smallest of ``buckets`` (default: powers of two below k_max, then k_max) that is ≥ k, so a
    batch has few distinct k and rollouts stay batched. Rows that keep candidates ask for
    lookahead depth ``depth``, others 0.
    """

    params = {
        "k_base": Param(int, low=1, high=64, doc="k_base, candidates at zero entropy", tune=(3, 7)),
        "alpha": Param(float, low=0.0, low_exclusive=True, doc="α, candidates per unit of H/τ", tune=(1.0, 4.0)),
        "tau": Param(float, low=0.0, low_exclusive=True, doc="τ, entropy temperature (nats)", tune=(0.5, 2.0)),
        "k_max": Param(int, low=1, high=64, doc="k_max, most candidates at one position", tune=(3, 8)),
        "buckets": NumberListParam(nullable=True, doc="allowed k values; null = powers of two, k_max"),
        "depth": Param(int, low=0, high=64, doc="lookahead depth d where candidates are kept (0 = none)"),
    }

    def __init__(self, k_base: int = 3, alpha: float = 2.0, tau: float = 1.0, k_max: int = 5,
                 buckets: Optional[list[int]] = None, depth: int = 1) -> None:
        self.k_base = k_base
        self.alpha = alpha
        self.tau = tau
        self.k_max = k_max
        self.buckets = buckets
        self.depth = depth

    def check_combination(self) -> None:
        b = self.buckets
        if b is not None and (not b or any(not float(v).is_integer() or v < 1 for v in b)
                              or any(x >= y for x, y in zip(b, b[1:]))):
            raise ParameterError(f"entropy_topk.buckets={b!r} is not allowed; allowed: a strictly "
                                 f"increasing list of integers ≥ 1")

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        raw = self.k_base + self.alpha * f.entropy.double() / self.tau
        k_round = torch.floor(raw + 0.5).long()
        commit = (f.eligible & (k_round <= self.k_base)) | select_topk(-f.entropy, f.eligible, 1)
        buckets = [int(v) for v in self.buckets] if self.buckets is not None else pow2_buckets(self.k_max)
        k = bucket_k(k_round.clamp(1, self.k_max), buckets)
        k = torch.where(f.eligible & ~commit, k, 1)
        return Decision(commit=commit, k=k, depth=_depth_where_kept(k, self.depth), info={"k": k.amax(1)})


# ---------------------------------------------------------------------- confidence ladder
@CONTROLLERS.register("confidence_ladder", aliases=("ladder",))
class ConfidenceLadder(Composite):
    """Confidence ladder: lookahead depth 1 / 3 / d_max as the least-confident top-1 > 0.9 / 0.7.

    Per sample, s = the smallest (``statistic="min"``) or mean top-1 probability over the eligible
    positions; ``d = depth_high`` if s > high, ``depth_mid`` if s > mid, else ``d_max``. Commit,
    tokens and k come from ``base``, any controller spec (a row without eligible positions has
    s = 1). Depth only matters where some k > 1. Depths are ``Decision.depth`` rollout steps
    (0 = commit directly); the seed reads its "1" as plain decoding, which is ``depth_high=0`` here.
    """

    params = {
        "high": Param(float, low=0.0, high=1.0, doc="top-1 above which d = depth_high", tune=(0.8, 0.99)),
        "mid": Param(float, low=0.0, high=1.0, doc="top-1 above which d = depth_mid", tune=(0.5, 0.8)),
        "depth_high": Param(int, low=0, high=64, doc="depth for confident rows"),
        "depth_mid": Param(int, low=0, high=64, doc="depth for middling rows"),
        "d_max": Param(int, low=0, high=64, doc="depth for the least confident rows", tune=(3, 7)),
        "statistic": Param(str, choices=("min", "mean"), doc="how a row's top-1 values are summarised"),
        "base": ControllerSpec(doc="the commit rule (any controller)"),
    }

    def __init__(self, high: float = 0.9, mid: float = 0.7, depth_high: int = 1, depth_mid: int = 3,
                 d_max: int = 5, statistic: str = "min", base: Any = "margin_topk") -> None:
        self.high = high
        self.mid = mid
        self.depth_high = depth_high
        self.depth_mid = depth_mid
        self.d_max = d_max
        self.statistic = statistic
        self.base = base

    def check_combination(self) -> None:
        if self.mid > self.high:
            raise ParameterError(f"confidence_ladder.mid={self.mid} must be ≤ high={self.high}; change mid or high")
        if not self.depth_high <= self.depth_mid <= self.d_max:
            raise ParameterError(
                f"confidence_ladder depths must deepen as confidence drops: depth_high={self.depth_high} ≤ "
                f"depth_mid={self.depth_mid} ≤ d_max={self.d_max}; change one of them")
        super().check_combination()

    def depth(self, f: StepFeatures) -> torch.Tensor:
        """The ladder's depth d ``[B]`` from the top-1 probabilities of the eligible positions."""
        top1 = f.top1_prob.float()
        if self.statistic == "min":
            s = torch.where(f.eligible, top1, torch.ones_like(top1)).amin(1)
        else:
            s = torch.where(f.eligible.any(1), _eligible_mean(top1, f.eligible), torch.ones_like(top1[:, 0]))
        d = torch.where(s > self.mid, self.depth_mid, self.d_max)
        return torch.where(s > self.high, self.depth_high, d).long()

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        d = self.children()["base"].decide(f, state)
        depth = self.depth(f)
        info = {f"base.{key}": v for key, v in d.info.items()}
        info["depth"] = depth
        return dataclasses.replace(d, commit=d.commit & f.eligible, depth=depth, info=info)


# ---------------------------------------------------------------------- compositions by config
SWITCH_BY = ("step", "block_step", "progress")


@CONTROLLERS.register("switch")
class Switch(Composite):
    """Switch: row uses controllers[i] while its counter is in [at[i−1], at[i]) (all by config).

    The counter (``by``) is the decoding step, the step within the current block, or the
    progress (fraction of the generation decided), per sample. Each child decides only for its
    rows, so its state advances only while it is active.
    """

    params = {
        "controllers": ControllerSpec(many=True, doc="the sub-controllers, in order of use"),
        "at": NumberListParam(doc="increasing boundaries, one fewer than controllers"),
        "by": Param(str, choices=SWITCH_BY, doc="the per-sample counter compared with at"),
    }

    def __init__(self, controllers: Sequence[Any] = ("margin_topk", "entropy_topk"),
                 at: Sequence[float] = (4,), by: str = "step") -> None:
        self.controllers = controllers
        self.at = at
        self.by = by

    def _boundaries(self) -> list[float]:
        return list(self.at)

    def check_combination(self) -> None:
        at, n = self._boundaries(), len(self.nested_controllers(self.get_params()))
        if len(at) != n - 1 or any(a >= b for a, b in zip(at, at[1:])):
            raise ParameterError(f"{self.display_name()}: at={at!r} must be {n - 1} strictly increasing "
                                 f"boundaries for {n} controllers")
        super().check_combination()

    def phase(self, f: StepFeatures) -> torch.Tensor:
        """Index ``[B]`` of the active sub-controller of each row."""
        counter = {"step": f.step, "block_step": f.block_step, "progress": f.progress}[self.by].double()
        at = torch.as_tensor(self._boundaries(), dtype=torch.float64, device=counter.device)
        return (counter[:, None] >= at[None, :]).sum(1)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        phase = self.phase(f)
        parts = []
        for i, (slot, child) in enumerate(self.children().items()):
            rows = (phase == i).nonzero().squeeze(1)
            if rows.numel():
                parts.append((slot, rows, child.decide(f, state, rows)))
        d = _scatter_rows(f, parts)
        d.info["phase"] = phase
        return d


@CONTROLLERS.register("hybrid")
class Hybrid(Switch):
    """Hybrid: margin_topk for the first ``warmup`` steps, entropy_topk after (a two-phase switch)."""

    params = {
        "warmup": Param(int, low=0, high=4096, doc="steps decided by margin_topk", tune=(0, 16)),
        "by": Switch.params["by"],
        "margin": ControllerSpec(controller="margin_topk", nullable=True, doc="margin_topk parameters"),
        "entropy": ControllerSpec(controller="entropy_topk", nullable=True, doc="entropy_topk parameters"),
    }

    def __init__(self, warmup: int = 4, by: str = "step", margin: Optional[dict] = None,
                 entropy: Optional[dict] = None) -> None:
        self.warmup = warmup
        self.by = by
        self.margin = margin
        self.entropy = entropy

    def _boundaries(self) -> list[float]:
        return [self.warmup]


@CONTROLLERS.register("compose")
class Compose(Composite):
    """Compose: commit from one sub-controller, k and depth from others (all by config).

    ``commit`` gives the commit mask and tokens; ``k`` (if set) the candidate counts at the
    positions it leaves uncommitted; ``depth`` (if set) the lookahead depth. Every child decides
    every step on every row.
    """

    params = {
        "commit": ControllerSpec(doc="controller whose commit mask and tokens are used"),
        "k": ControllerSpec(nullable=True, doc="controller whose k is used (null: commit's)"),
        "depth": ControllerSpec(nullable=True, doc="controller whose depth is used (null: commit's)"),
    }

    def __init__(self, commit: Any = "margin_topk", k: Any = "entropy_topk", depth: Any = "confidence_ladder") -> None:
        self.commit = commit
        self.k = k
        self.depth = depth

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        out = {slot: child.decide(f, state) for slot, child in self.children().items()}
        base = out["commit"]
        commit = base.commit & f.eligible
        k = out["k"].k if "k" in out else base.k
        k = torch.ones_like(f.x0) if k is None else torch.where(f.eligible & ~commit, k.to(f.x0), 1)
        depth = out["depth"].depth if "depth" in out else base.depth
        info = {f"{slot}.{key}": v for slot, d in out.items() for key, v in d.info.items()}
        return Decision(commit=commit, tokens=base.tokens, k=k, depth=depth,
                        next_block_length=base.next_block_length, info=info)
