"""Named strategy suites: which controllers (with which parameters) a benchmark compares.

A strategy is ``(label, controller name, params)``. Parameters that depend on the task (the
number of steps) are given as fractions of the generation length and resolved per task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Strategy:
    label: str
    controller: str
    params: dict = field(default_factory=dict)
    decode: dict = field(default_factory=dict)
    #: :class:`adaptive_decoding.framework.engine.lookahead.Lookahead` options (``None``: no lookahead)
    lookahead: Optional[dict] = None
    #: the tasks this strategy is for (``None``: every task), e.g. a rules verifier's or a policy's
    tasks: Optional[tuple[str, ...]] = None
    #: the row's kind when the controller's own does not say it (a packaged learned policy, a lookahead)
    kind: Optional[str] = None

    def applies_to(self, task: str) -> bool:
        return self.tasks is None or task in self.tasks

    def resolve(self, gen_length: int, block_length: int) -> dict[str, Any]:
        """Controller parameters with ``steps_per_token`` turned into LLaDA/Dream ``steps``."""
        params = dict(self.params)
        if "steps_per_token" in params:
            frac = params.pop("steps_per_token")
            nb = gen_length // block_length
            steps = max(nb, int(round(gen_length * frac / nb)) * nb)
            params["steps"] = steps
        return params


BASELINES: tuple[Strategy, ...] = (
    Strategy("sequential", "sequential"),
    Strategy("llada (G/2 steps)", "llada", {"steps_per_token": 0.5}),
    Strategy("llada_random (G/2 steps)", "llada_random", {"steps_per_token": 0.5}),
    Strategy("dream_confidence (G/2 steps)", "dream_confidence", {"steps_per_token": 0.5}),
    Strategy("dream_margin (G/2 steps)", "dream_margin", {"steps_per_token": 0.5}),
    Strategy("dream_entropy (G/2 steps)", "dream_entropy", {"steps_per_token": 0.5}),
    Strategy("fast_dllm (τ=0.9)", "fast_dllm", {"threshold": 0.9}),
    Strategy("fast_dllm (τ=0.7)", "fast_dllm", {"threshold": 0.7}),
    Strategy("eb (γ=0.1)", "eb", {"gamma": 0.1}),
    Strategy("eb (γ=1.0)", "eb", {"gamma": 1.0}),
    Strategy("fast_dllm_factor (f=1)", "fast_dllm_factor", {"factor": 1.0}),
    Strategy("fast_dllm_pp (δ=0.25)", "fast_dllm_pp", {"margin": 0.25}),
    Strategy("cadllm", "cadllm", {}),
)
# The temporal-stability rule once listed here as "leap" is this project's heuristic, not LEAP (see
# controllers/stability.py); benchmark.yaml runs it with the other heuristics as temporal_stability.

#: the README's main job (``adec bench``): a few rows a newcomer should see: the reference, random
#: and confidence orders at four tokens per forward, two thresholds, EB, this project's three kinds
#: of controller (a heuristic rule, the packaged learned policy of the task, sudoku9 or phrases, and the
#: escalating rules-verifier lookahead around the margin rule and around the learned policy, on Sudoku
#: only), and the oracle
NEWCOMER: tuple[Strategy, ...] = (
    Strategy("sequential (1 token/step)", "sequential"),
    Strategy("llada_random (G/4 steps)", "llada_random", {"steps_per_token": 0.25}),
    Strategy("llada (G/4 steps)", "llada", {"steps_per_token": 0.25}),
    Strategy("dream_margin (G/4 steps)", "dream_margin", {"steps_per_token": 0.25}),
    Strategy("eb (γ=0.1)", "eb", {"gamma": 0.1}),
    Strategy("fast_dllm (τ=0.9)", "fast_dllm", {"threshold": 0.9}),
    Strategy("fast_dllm (τ=0.99)", "fast_dllm", {"threshold": 0.99}),
    Strategy("margin_topk (η=0.99)", "margin_topk", {"eta": 0.99}),
    Strategy("learned (τ=0.996)", "learned", {"policy": "sudoku9-set-peer", "threshold": 0.996},
             tasks=("sudoku9",)),
    Strategy("learned window (τ=0.98)", "learned_window", {"policy": "phrases-set-window", "threshold": 0.98},
             tasks=("phrases",)),
    Strategy("margin_topk + rules verifier (escalate 0.99)", "confidence_ladder",
             {"base": {"name": "margin_topk", "params": {"eta": 0.9}}, "depth_high": 64, "depth_mid": 64,
              "d_max": 64},
             lookahead={"scorer": "sudoku_rules", "escalate": [0.99]}, tasks=("sudoku9",), kind="heuristic"),
    Strategy("learned + rules verifier (escalate 0.99)", "confidence_ladder",
             {"base": {"name": "learned", "params": {"policy": "sudoku9-set-peer", "threshold": 0.99}},
              "depth_high": 64, "depth_mid": 64, "d_max": 64},
             lookahead={"scorer": "sudoku_rules", "escalate": [0.99]}, tasks=("sudoku9",), kind="learned"),
    Strategy("oracle", "oracle"),
)

#: end-of-text prediction on/off pairs: the same controller with ``eos_fill``
EOS_PAIRS: tuple[Strategy, ...] = (
    Strategy("fast_dllm (τ=0.9) + eos_fill", "fast_dllm", {"threshold": 0.9}, {"eos_fill": True}),
    Strategy("sequential + eos_fill", "sequential", {}, {"eos_fill": True}),
    Strategy("eb (γ=0.1) + eos_fill", "eb", {"gamma": 0.1}, {"eos_fill": True}),
)
