"""The recent published adaptive decoders, as controllers (``kind = "baseline"``).

* ``fast_dllm_factor``: Fast-dLLM's factor rule exactly as NVlabs/Fast-dLLM's code writes it
  (Wu et al. 2025, ``llada/generate.py`` ``get_transfer_index_dynamic``). With the ``m`` eligible
  confidences sorted descending ``c_(1) ≥ … ≥ c_(m)``, rank ``n`` passes when
  ``c_(n) ≥ 1 − f/(n + 1)`` (non-strict; rank 1 always passes); the scan stops at the first rank
  that fails and commits the ranks before it, except that when the first failure is the last
  rank ``m`` every one of the ``m`` is committed (their ``top_i == len(threshs) − 1`` branch; so
  with two eligible positions both are always committed).
* ``fast_dllm_pp``: Fast-dLLM++ Fréchet profile decoding (Kasa et al. 2026, Ringo-Star/
  FastdLLM_plusplus ``get_transfer_index_frechet_profile``). Score the whole sorted profile,
  ``G_n = max(0, Σ_{j≤n} c_(j) − (n − 1)) − (1 − c_(n))`` (Fréchet lower bound on joint correctness
  minus the competing-event bound), commit the largest ``n`` with ``G_n > δ``, at least one.
  With equal confidences ``c = 1 − ε``, ``G_n = 1 − (n + 1)ε``: the factor *paper's* strict
  inequality ``(n + 1)ε < f`` with ``f = 1 − δ``. NVlabs' code (``fast_dllm_factor`` above) commits
  a little more: on the boundary (non-strict) and when only the last rank fails (all of them).
* ``cadllm``: CadLLM's adaptive block size ``B_t``, step budget ``S_t`` and threshold ``τ_t`` from
  running confidence (Shen et al. 2025, juchengshen/CadLLM ``generate_cadllm``).

The temporal-stability rule that used to be registered here as ``leap`` is this project's
heuristic, not LEAP: it is ``temporal_stability`` in :mod:`adaptive_decoding.controllers.stability`.

End-of-text prediction (learning-to-parallel-decode's EOS early stop) is an option of the loop,
``DecodeConfig.eos_fill`` / ``eos_fill_threshold``: it combines with every controller, so there is no
wrapper controller for it.

``fast_dllm_factor`` compares float64 confidences with float64 thresholds ``1 − f/(n + 1)``
computed as NVlabs' Python floats are, with no tolerance. ``fast_dllm_pp`` compares in float64
with a 1e-9 tolerance against its strict inequality, so an exactly-on-the-boundary equal profile
(e.g. ``ε = 0.1, n = 9, δ = 0``) is not committed whatever the rounding of ``Σc``.
"""

from __future__ import annotations

import inspect

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk

TOL = 1e-9


def sorted_profile(f: StepFeatures) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eligible confidences sorted descending (float64 ``[B, L]``), validity mask, ``n = 1..L``."""
    conf = torch.where(f.eligible, f.confidence.double(), torch.full_like(f.confidence, -1.0, dtype=torch.float64))
    c_sorted = conf.sort(dim=1, descending=True, stable=True).values
    valid = torch.arange(conf.shape[1], device=conf.device)[None, :] < f.n_eligible[:, None]
    n = torch.arange(1, conf.shape[1] + 1, device=conf.device, dtype=torch.float64)[None, :]
    return torch.where(valid, c_sorted, torch.zeros_like(c_sorted)), valid, n


def commit_largest_n(f: StepFeatures, ok: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Commit the ``n*`` most confident eligible positions, ``n* = max{n : ok_n}`` (at least 1)."""
    n_star = (ok.double() * n).amax(1).long().clamp(min=1)
    n_star = torch.minimum(n_star, f.n_eligible)
    return select_topk(f.confidence, f.eligible, n_star), n_star


@CONTROLLERS.register("fast_dllm_factor", aliases=("fast_dllm_dynamic",))
class FastDLLMFactor(Controller):
    """Fast-dLLM factor rule (NVlabs' code): the ranks before the first c_(n) < 1 − f/(n+1); all if that is the last.

    Rank 1 always passes, so at least one position is committed (two when two are eligible).
    """

    kind = "baseline"
    params = {
        "factor": Param(float, low=0.0, low_exclusive=True, doc="factor f (larger = more parallel)",
                        tune=(0.25, 2.0)),
    }

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        c, valid, n = sorted_profile(f)
        thresh = 1.0 - self.factor / (n + 1.0)  # the same float64 operations as their Python floats
        fail = valid & (c < thresh)
        fail[:, 0] = False  # their threshs[0] = -1: the most confident always passes
        m = f.n_eligible
        first_fail = torch.where(fail.any(1), fail.long().argmax(1), m)  # 0-based index = ranks passed
        n_star = torch.where(first_fail >= m - 1, m, first_fail)  # last rank alone failing: commit all
        commit = select_topk(f.confidence, f.eligible, n_star)
        return Decision(commit=commit, info={"n_commit": n_star})


@CONTROLLERS.register("fast_dllm_pp", aliases=("frechet_profile", "fast_dllm_frechet"))
class FastDLLMPlusPlus(Controller):
    """Fast-dLLM++ Fréchet profile: largest n with max(0, Σc − (n−1)) − (1 − c_(n)) > δ (≥ one)."""

    kind = "baseline"
    params = {
        "margin": Param(float, low=0.0, high=1.0, doc="safety margin δ (= 1 − Fast-dLLM's factor f)",
                        tune=(0.0, 0.5)),
    }

    def __init__(self, margin: float = 0.25) -> None:
        self.margin = margin

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        c, valid, n = sorted_profile(f)
        lower = (c.cumsum(1) - (n - 1.0)).clamp(min=0.0)  # Fréchet–Hoeffding bound L_n
        upper = 1.0 - c  # competing event U_n = 1 − c_(n)
        ok = valid & (lower - upper > self.margin + TOL)
        commit, n_star = commit_largest_n(f, ok, n)
        return Decision(commit=commit, info={"n_commit": n_star})


def _mean_last_two(hist: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """CadLLM's ``mean(confidence_history[-2:])`` from ``hist = [c̄_{t-1}, c̄_t]`` and its length."""
    return torch.where(count >= 2, hist.mean(1), hist[:, 1])


@CONTROLLERS.register("cadllm")
class CadLLM(Controller):
    """CadLLM: block size, step budget and threshold adapted to the running mean confidence.

    Running confidence: ``c̄_t`` = mean ``p(x0)`` over the current block's masked positions at
    step t; ``r`` = mean of the last two ``c̄`` (CadLLM's ``confidence_history[-2:]``).

    * block size: ``B_next = clamp(B_min + ⌊(B_max − B_min)·r⌋, B_min, B_max)`` (the loop clamps it
      to the generation end); the first block is ``DecodeConfig.block_length`` (CadLLM's
      ``initial_block_length``, ``B_0``).
    * step budget, fixed at a block's first step: ``S = clamp(S_min + ⌊(S_max − S_min)(1 − r)⌋,
      S_min, S_max)``, scaled by the block's size, ``max(1, ⌊S·B/B_0⌋)``; ``S_min`` before any history.
    * threshold at in-block step i: ``τ_i = max(τ_lo, τ_hi(1 − i/S) + τ_lo·i/S)``; commit every
      eligible position with ``p(x0) ≥ τ_i``, at least the most confident.

    High confidence thus widens the next block and shortens ``S`` (so τ falls faster); low
    confidence narrows the block and keeps τ high longer. With ``adaptive_threshold=false`` τ stays
    ``τ_hi`` (CadLLM would fall back to LLaDA's fixed schedule instead). CadLLM's adaptive vocabulary
    (top-V softmax) is a throughput device that changes the confidence itself; it is left out.
    """

    kind = "baseline"
    params = {
        "min_block": Param(int, low=1, doc="B_min, narrowest block", tune=(2, 16)),
        "max_block": Param(int, low=1, doc="B_max, widest block", tune=(16, 128)),
        "initial_steps": Param(int, low=1, doc="S_min, step budget at full confidence", tune=(4, 32)),
        "max_steps": Param(int, low=1, doc="S_max, step budget at zero confidence", tune=(32, 128)),
        "threshold_high": Param(float, low=0.0, high=1.0, doc="τ_hi at a block's first step", tune=(0.6, 0.99)),
        "threshold_low": Param(float, low=0.0, high=1.0, doc="τ_lo, the floor after S steps", tune=(0.2, 0.6)),
        "adaptive_blocks": Param(bool, doc="adapt the block size (else DecodeConfig.block_length)"),
        "adaptive_steps": Param(bool, doc="adapt the step budget (else S_min)"),
        "adaptive_threshold": Param(bool, doc="decay τ over the step budget (else τ_hi)"),
    }

    def __init__(self, min_block: int = 4, max_block: int = 64, initial_steps: int = 24, max_steps: int = 90,
                 threshold_high: float = 0.85, threshold_low: float = 0.4, adaptive_blocks: bool = True,
                 adaptive_steps: bool = True, adaptive_threshold: bool = True) -> None:
        self.min_block = min_block
        self.max_block = max_block
        self.initial_steps = initial_steps
        self.max_steps = max_steps
        self.threshold_high = threshold_high
        self.threshold_low = threshold_low
        self.adaptive_blocks = adaptive_blocks
        self.adaptive_steps = adaptive_steps
        self.adaptive_threshold = adaptive_threshold

    def check_combination(self) -> None:
        for lo, hi in (("min_block", "max_block"), ("initial_steps", "max_steps"),
                       ("threshold_low", "threshold_high")):
            if getattr(self, lo) > getattr(self, hi):
                raise ParameterError(f"{self.display_name()}.{lo}={getattr(self, lo)!r} exceeds "
                                     f"{hi}={getattr(self, hi)!r}; allowed: {lo} ≤ {hi}")
        defaults = {k: p.default for k, p in inspect.signature(type(self).__init__).parameters.items()}
        for switch, names in (("adaptive_blocks", ("min_block", "max_block")), ("adaptive_steps", ("max_steps",)),
                              ("adaptive_threshold", ("threshold_low",))):
            for name in names:
                if not getattr(self, switch) and getattr(self, name) != defaults[name]:
                    self.warn_no_effect(name, f"{switch}=false")

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        b, dev = state.batch_size, state.seeds.device
        state.memory["cadllm.hist"] = torch.zeros(b, 2, dtype=torch.float64, device=dev)
        state.memory["cadllm.count"] = torch.zeros(b, dtype=torch.long, device=dev)
        state.memory["cadllm.budget"] = torch.full((b,), self.initial_steps, dtype=torch.long, device=dev)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        mem, b0 = state.memory, float(state.config.effective_block_length)
        hist, count = mem["cadllm.hist"], mem["cadllm.count"]
        blen = f.block_end - f.block_start
        if self.adaptive_steps:  # S for this block, fixed at its first step
            s = self.initial_steps + ((self.max_steps - self.initial_steps) * (1 - _mean_last_two(hist, count))).floor()
            s = (s.clamp(self.initial_steps, self.max_steps) * blen / b0).floor().long().clamp(min=1)
            s = torch.where(count > 0, s, torch.full_like(s, self.initial_steps))
        else:
            s = torch.full_like(blen, self.initial_steps)
        budget = torch.where(f.block_step == 0, s, mem["cadllm.budget"])
        if self.adaptive_threshold:
            frac = f.block_step.double() / budget.double()
            tau = (self.threshold_high * (1 - frac) + self.threshold_low * frac).clamp(min=self.threshold_low)
        else:
            tau = torch.full_like(budget, self.threshold_high, dtype=torch.float64)
        commit = f.eligible & (f.confidence.double() >= tau[:, None])
        commit = commit | select_topk(f.confidence, f.eligible, 1)

        conf = torch.where(f.eligible, f.confidence.double(), torch.zeros_like(f.confidence, dtype=torch.float64))
        c_bar = conf.sum(1) / f.n_eligible.clamp(min=1)
        hist = torch.stack([hist[:, 1], c_bar], 1)
        count = count + 1
        mem["cadllm.hist"], mem["cadllm.count"], mem["cadllm.budget"] = hist, count, budget
        info = {"threshold": tau, "step_budget": budget, "block_length": blen, "mean_confidence": c_bar}
        nxt = None
        if self.adaptive_blocks:
            r = _mean_last_two(hist, count)
            nxt = (self.min_block + ((self.max_block - self.min_block) * r).floor().long())
            nxt = nxt.clamp(self.min_block, self.max_block)
            info["next_block_length"] = nxt
        return Decision(commit=commit, next_block_length=nxt, info=info)
