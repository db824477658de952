"""``slowfast``: Slow-Fast sampling (LiangrunFlora/Slow-Fast-Sampling,
``slow-fast-sampling/sampling_utils/generate_slow_fast_sampling.py``).

A block is decoded in sub-cycles. Each starts with a cautious (slow) exploration phase of a fixed
number of steps that estimates how far ahead the model is already fairly sure, the span
``[L_prev, L)``, and waits for the estimate to be stable; meanwhile it commits one token a step (or
every very confident one). A fast phase then fills the span in parallel: every confident position
at once, else the best one. The next sub-cycle starts where the span ended.
"""

from __future__ import annotations

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import ensure_progress, select_topk

KEYS = ("block", "last", "span", "explored", "determined", "hist_n")


def fill(conf: torch.Tensor, scope: torch.Tensor, threshold: float) -> torch.Tensor:
    """Slow-Fast's fill: every slot of ``scope`` with p ≥ threshold when there are more than one,
    else the most confident slot of ``scope``."""
    confident = scope & (conf >= threshold)
    return torch.where((confident.sum(1) > 1)[:, None], confident, select_topk(conf, scope, 1))


def history_stats(hist: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Population standard deviation and truncated mean of the last ``n`` entries of each row of ``hist``."""
    w = hist.shape[1]
    valid = torch.arange(w, device=hist.device)[None, :] >= (w - n)[:, None]
    h = hist.double()
    mean = torch.where(valid, h, 0.0).sum(1) / n.clamp(min=1)
    var = torch.where(valid, (h - mean[:, None]) ** 2, 0.0).sum(1) / n.clamp(min=1)
    return var.sqrt(), mean.floor().long()


@CONTROLLERS.register("slowfast", aliases=("slow_fast",))
class SlowFast(Controller):
    """Slow-Fast sampling: explore K steps for a stable span of p(x0) ≥ τ_span, then fill it in parallel.

    Exploration step (of ``exploration_steps`` K): the span estimate is ``L = 1 + `` the farthest
    masked index of the block at or after ``L_prev`` with ``p(x0) ≥ span_threshold`` (``L_prev + 1`` if
    none); once the last ``stability_window`` estimates have a standard deviation below
    ``stability_std`` the span is fixed at L, else at their truncated mean (fixed at the last
    exploration step). The step commits, from ``L_prev`` on, every masked position with ``p(x0) ≥
    threshold`` if there are more than one, else the most confident. Fast phase: the same fill inside
    ``[L_prev, L)`` until it is decided; then ``L_prev = L`` and a new sub-cycle.
    """

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="high_confidence_threshold: commit together where p(x0) ≥ it",
                           tune=(0.7, 0.99)),
        "span_threshold": Param(float, low=0.0, high=1.0, doc="cycle_len_confidence_threshold: the span reaches the "
                                "farthest p(x0) ≥ it", tune=(0.1, 0.6)),
        "exploration_steps": Param(int, low=1, doc="K (k_exploration_steps): slow steps a sub-cycle", tune=(1, 8)),
        "stability_window": Param(int, low=1, doc="span estimates compared (cycle_length_stability_window)"),
        "stability_std": Param(float, low=0.0, doc="the span is stable when their std < it", tune=(0.5, 4.0)),
    }
    differences = """
    Slow-Fast runs all K exploration steps even when the block has fewer masks left (steps that
    commit nothing), and in a batch its fast phase goes on for every row while any row's span has
    masks, re-writing a decided token of a finished row (top-1 over an all −inf span); here each
    row's sub-cycles are its own and a step always commits, so NFE can be lower. Its later fast
    steps run the model on the prefix up to the span's end only, reusing stale logits after it (a
    cache); here every forward follows the decode's cache mode.

    Defaults are the function's (τ = 0.9, τ_span = 0.3, K = 6, window 2, std 1.0; its scripts use
    block_length = gen_length). num_important_low_confidence_tokens is unused there and
    max_sub_cycles_per_block (256) never binds here (each sub-cycle advances the span).
    """

    def __init__(self, threshold: float = 0.9, span_threshold: float = 0.3, exploration_steps: int = 6,
                 stability_window: int = 2, stability_std: float = 1.0) -> None:
        self.threshold = threshold
        self.span_threshold = span_threshold
        self.exploration_steps = exploration_steps
        self.stability_window = stability_window
        self.stability_std = stability_std

    def load(self, f: StepFeatures, state: DecodeState) -> dict[str, torch.Tensor]:
        """The rows' sub-cycle state, reset where a new block began (span = the block)."""
        b, dev = f.x0.shape[0], f.x0.device
        mem = state.memory
        s = {k: mem.get(f"slowfast.{k}", torch.full((b,), -1 if k == "block" else 0, dtype=torch.long, device=dev))
             for k in KEYS}
        s["hist"] = mem.get("slowfast.hist", torch.zeros((b, self.stability_window), dtype=torch.long, device=dev))
        new = s["block"] != f.block_index
        for key, value in (("last", 0), ("explored", 0), ("determined", 0), ("hist_n", 0)):
            s[key] = torch.where(new, value, s[key])
        s["span"] = torch.where(new, f.block_end - f.block_start, s["span"])
        s["block"] = f.block_index.clone()
        return s

    def explore(self, s: dict[str, torch.Tensor], rest: torch.Tensor, j: torch.Tensor, f: StepFeatures,
                rows: torch.Tensor) -> None:
        """One span estimate for ``rows`` (exploring, undetermined): push it, fix the span when stable."""
        blen = f.block_end - f.block_start
        far = torch.where(rest & (f.confidence >= self.span_threshold), j, torch.full_like(j, -1)).amax(1)
        est = torch.minimum(torch.where(far >= 0, far + 1, s["last"] + 1), blen).clamp(min=1)
        s["hist"] = torch.where(rows[:, None], torch.cat([s["hist"][:, 1:], est[:, None]], 1), s["hist"])
        s["hist_n"] = torch.where(rows, (s["hist_n"] + 1).clamp(max=self.stability_window), s["hist_n"])
        std, mean = history_stats(s["hist"], s["hist_n"])
        full = rows & (s["hist_n"] >= self.stability_window)
        stable = std < self.stability_std
        s["span"] = torch.where(full, torch.where(stable, est, mean.clamp(min=1)).minimum(blen), s["span"])
        last_step = s["explored"] == self.exploration_steps - 1
        s["determined"] = torch.where(full & (stable | last_step), 1, s["determined"])

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        s = self.load(f, state)
        j = f.position - f.block_start[:, None]
        in_span = f.eligible & (j >= s["last"][:, None]) & (j < s["span"][:, None])
        done = (s["explored"] >= self.exploration_steps) & ~in_span.any(1)  # the span is decided: next sub-cycle
        s["last"] = torch.where(done, s["span"], s["last"])
        for key in ("explored", "determined", "hist_n"):
            s[key] = torch.where(done, 0, s[key])
        exploring = s["explored"] < self.exploration_steps
        rest = f.eligible & (j >= s["last"][:, None])
        self.explore(s, rest, j, f, exploring & (s["determined"] == 0))
        span = f.eligible & (j >= s["last"][:, None]) & (j < s["span"][:, None])
        commit = fill(f.confidence, torch.where(exploring[:, None], rest, span), self.threshold)
        s["explored"] = torch.where(exploring, s["explored"] + 1, s["explored"])
        unfixed = exploring & (s["explored"] == self.exploration_steps) & (s["determined"] == 0)
        blen = f.block_end - f.block_start
        mean = history_stats(s["hist"], s["hist_n"])[1].clamp(min=1).minimum(blen)
        s["span"] = torch.where(unfixed, torch.where(s["hist_n"] > 0, mean, blen // 2), s["span"])
        s["determined"] = torch.where(unfixed, 1, s["determined"])
        state.memory.update({f"slowfast.{k}": v for k, v in s.items()})
        return Decision(commit=ensure_progress(commit, f.eligible, f.confidence), info={"span_end": s["span"]})
