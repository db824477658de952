"""The recent published adaptive decoders, as controllers (``kind = "baseline"``).

* ``fast_dllm_factor``: Fast-dLLM's factor rule (Wu et al. 2025, NVlabs/Fast-dLLM
  ``get_transfer_index_dynamic``). With the eligible confidences sorted descending
  ``c_(1) ≥ … ≥ c_(m)``, commit the largest ``n`` with ``(n + 1)·(1 − c_(n)) < f``, at least one.
* ``fast_dllm_pp``: Fast-dLLM++ Fréchet profile decoding (Kasa et al. 2026, Ringo-Star/
  FastdLLM_plusplus ``get_transfer_index_frechet_profile``). Score the whole sorted profile,
  ``G_n = max(0, Σ_{j≤n} c_(j) − (n − 1)) − (1 − c_(n))`` (Fréchet lower bound on joint correctness
  minus the competing-event bound), commit the largest ``n`` with ``G_n > δ``, at least one.
  With equal confidences ``c = 1 − ε``, ``G_n = 1 − (n + 1)ε``: exactly the factor rule with
  ``f = 1 − δ``; otherwise it commits a superset (the heterogeneity bonus ``Σ_{j<n} c_(j) − c_(n)``).
* ``cadllm``: CadLLM's adaptive block size ``B_t``, step budget ``S_t`` and threshold ``τ_t`` from
  running confidence (Shen et al. 2025, juchengshen/CadLLM ``generate_cadllm``).
* ``leap``: LEAP-style early convergence: a threshold rule plus every position whose prediction
  stayed the same for ``n_stable`` consecutive steps (Zhang et al. 2026, arXiv 2605.10980; the
  paper's lookahead filtering and multi-sequence superposition are not implemented here).

End-of-text prediction (learning-to-parallel-decode's EOS early stop) is an option of the loop,
``DecodeConfig.eos_fill`` / ``eos_fill_threshold``: it combines with every controller, so there is no
wrapper controller for it.

Both Fast-dLLM rules compare in float64 with a 1e-9 tolerance against the strict inequality, so
an exactly-on-the-boundary profile (e.g. ``ε = 0.1, n = 9, f = 1``) is decided the same way by both.
"""

from __future__ import annotations

import inspect

import torch

from framework.core.params import Param, ParameterError
from framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from framework.engine.features import StepFeatures
from framework.engine.selection import select_topk

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
    """Fast-dLLM factor rule: commit the largest n with (n + 1)(1 − c_(n)) < f (at least one)."""

    kind = "baseline"
    params = {
        "factor": Param(float, low=0.0, low_exclusive=True, doc="factor f (larger = more parallel)",
                        tune=(0.25, 2.0)),
    }

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        c, valid, n = sorted_profile(f)
        ok = valid & ((n + 1.0) * (1.0 - c) < self.factor - TOL)
        commit, n_star = commit_largest_n(f, ok, n)
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


@CONTROLLERS.register("leap", aliases=("early_convergence",))
class LEAP(Controller):
    """LEAP-style early convergence: commit p(x0) > τ, plus predictions unchanged for n steps.

    Per sample and position the controller keeps the last prediction and the length of its current
    run, ``run_t = run_{t−1} + 1`` if ``x0_t = x0_{t−1}`` else 1, over every masked position of the
    canvas (so a later block starts with its history). A position is committed when it is eligible
    and either ``p(x0) > τ`` (Fast-dLLM's threshold rule, at least the most confident) or
    ``run_t ≥ n_stable`` with ``p(x0) ≥ min_confidence``. The paper detects convergence with
    lookahead filtering and multi-sequence superposition; this is the temporal-stability variant.
    """

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, doc="base rule: Fast-dLLM threshold τ", tune=(0.7, 0.99)),
        "n_stable": Param(int, low=2, doc="commit a prediction unchanged for n consecutive steps", tune=(2, 6)),
        "min_confidence": Param(float, low=0.0, high=1.0, doc="floor on p(x0) for a stability commit",
                                tune=(0.0, 0.5)),
    }

    def __init__(self, threshold: float = 0.9, n_stable: int = 3, min_confidence: float = 0.0) -> None:
        self.threshold = threshold
        self.n_stable = n_stable
        self.min_confidence = min_confidence

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        mem = state.memory
        prev = mem.get("leap.prev_x0", torch.zeros_like(f.x0))
        run = mem.get("leap.run", torch.zeros_like(f.x0))
        same = (f.x0 == prev) & (run > 0)
        run = torch.where(f.masked, torch.where(same, run + 1, torch.ones_like(run)), torch.zeros_like(run))
        mem["leap.prev_x0"], mem["leap.run"] = f.x0.clone(), run
        base = (f.eligible & (f.confidence > self.threshold)) | select_topk(f.confidence, f.eligible, 1)
        stable = f.eligible & (run >= self.n_stable) & (f.confidence >= self.min_confidence)
        return Decision(commit=base | stable, info={"stable_commits": (stable & ~base).sum(1)})

