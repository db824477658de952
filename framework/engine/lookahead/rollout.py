"""How a candidate is rolled out (:class:`Rollout`): its first step, then up to d forwards of a fill rule.

Every candidate of every searching row is one extra batch row (:class:`RolloutRows`). It starts from
x_t with its first step written (the controller's commits plus its branch tokens; an escalation's
threshold-rule commits), then runs up to d forwards of the fill rule ``rollout``, greedy or sampled as
the loop samples at temperature > 0, and stops early once its block is full:

* ``threshold``: the positions with confidence > ``rollout_threshold`` (at least one),
* ``sequential``: the most confident one,
* ``controller``: what the step's controller decides on a copy of its memory (rollouts never leak
  into it).

An escalation candidate rolls out by Fast-dLLM's threshold rule at its own τ_e instead. After the last
forward the rest of the block is filled greedily (``complete``, no extra forward). Rollouts stay inside
the current block. The forward that ran on the canvas after the winner's first ``advance`` steps is
kept (:class:`Handback`): the loop uses its logits instead of running it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from adaptive_decoding.framework.core.measure import synced_clock
from adaptive_decoding.framework.core.params import Configurable, Param
from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.denoise import suppress_mask_logit, window_logits
from adaptive_decoding.framework.engine.features import (
    FeatureOptions,
    StepFeatures,
    StepWindow,
    compute_features,
    sample_tokens,
)
from adaptive_decoding.framework.engine.lookahead.candidates import CandidatePlan
from adaptive_decoding.framework.engine.lookahead.window import (
    step_token_logprob,
    window_index,
    window_valid,
    write_window,
)
from adaptive_decoding.framework.engine.selection import ensure_progress, select_topk

ROLLOUTS = ("threshold", "sequential", "controller")


class Rollout(Configurable):
    """How each candidate is rolled out and how much of the winner's rollout is committed.

    Args:
        rollout: fill rule of the rollouts (``threshold``, ``sequential``, ``controller``).
        rollout_threshold: confidence above which the ``threshold`` rule fills a position.
        max_depth: cap on the controller's depth d (rollout forwards per candidate).
        advance: steps of the winning rollout committed (a): 1 commits its first step only; a > 1 also
            what its first a − 1 rollout forwards filled, so the forwards that chose them are decode
            steps, not discarded work.
        complete: fill the rest of the block greedily after the last rollout forward (always done
            with ``rescore='pll'``). Kept though no configured experiment turns it off: without it a
            scorer sees the rollout as far as it got (the NFE-counting tests use that).
    """

    params = {
        "rollout": Param(str, choices=ROLLOUTS, doc="fill rule of the rollouts"),
        "rollout_threshold": Param(float, low=0.0, high=1.0, doc="confidence the threshold rule fills at"),
        "max_depth": Param(int, low=1, high=64, doc="cap on the lookahead depth d", tune=(1, 7)),
        "advance": Param(int, low=1, high=64, doc="rollout steps of the winner committed (1: its first step only)"),
        "complete": Param(bool, doc="fill the rest of the block greedily after the last rollout step; "
                                    "false shows the scorer the unfinished rollout"),
    }

    def __init__(self, rollout: str = "controller", rollout_threshold: float = 0.9, max_depth: int = 64,
                 advance: int = 64, complete: bool = True) -> None:
        self.rollout = rollout
        self.rollout_threshold = rollout_threshold
        self.max_depth = max_depth
        self.advance = advance
        self.complete = complete

    def check_combination(self) -> None:
        if self.rollout != "threshold" and self.rollout_threshold != 0.9:
            self.warn_no_effect("rollout_threshold", f"rollout={self.rollout!r} does not use a threshold")
        if self.advance > self.max_depth:
            self.warn_no_effect("advance", f"a rollout runs at most max_depth={self.max_depth} forwards")

    def policy_fill(self, conf: torch.Tensor, still: torch.Tensor) -> torch.Tensor:
        """What the ``threshold`` or ``sequential`` rule fills among the open positions ``still``."""
        best = select_topk(conf, still, 1)
        if self.rollout == "sequential":
            return best
        return (still & (conf > self.rollout_threshold)) | best


@dataclass
class RolloutRows:
    """The candidate rows of one lookahead step, N of them (one per plan row and existing candidate)."""

    plan_row: torch.Tensor  #: long ``[N]`` row of the plan
    src: torch.Tensor  #: long ``[N]`` row of the step's sub-batch
    slot: torch.Tensor  #: long ``[N]`` candidate slot (0 … W−1 of the plan)
    canvas: torch.Tensor  #: long ``[N, L]`` the step's canvas x_t (never written: windows are written on copies)
    attn: torch.Tensor  #: ``[N, L]`` attention mask
    cols: torch.Tensor  #: long ``[N, W]`` the window's canvas columns
    real: torch.Tensor  #: bool ``[N, W]`` real window slots
    region: torch.Tensor  #: bool ``[N, W]`` the positions the step began with eligible
    win: torch.Tensor  #: long ``[N, W]`` the rollout's window tokens (the mask id where still open)
    lp_rec: torch.Tensor  #: float ``[N, W]`` log-probability recorded for each filled token
    lp_mask: torch.Tensor  #: bool ``[N, W]`` where one is recorded
    depth: torch.Tensor  #: long ``[N]`` rollout forwards allowed
    level: torch.Tensor  #: long ``[N]`` escalation level e, 0 for the others
    tau: torch.Tensor  #: float ``[N]`` τ_e of an escalation (0 for the others)
    is_hold: torch.Tensor  #: bool ``[N]`` the hold candidate
    branch_pos: torch.Tensor  #: long ``[N, m]`` branch positions
    branch_ok: torch.Tensor  #: bool ``[N, m]`` this candidate writes a branch token there
    branch_tok: torch.Tensor  #: long ``[N, m]`` the branch tokens

    @property
    def is_escalation(self) -> torch.Tensor:
        return self.level > 0


@dataclass
class Handback:
    """Per candidate row, the forward kept for the loop: the window it ran on, its logits, which rows ran one."""

    win: torch.Tensor  #: long ``[N, W]``
    ran: torch.Tensor  #: bool ``[N]``
    step: torch.Tensor  #: long ``[N]`` the rollout step t of that forward (= rollout fills committed with it)
    logits: Optional[torch.Tensor] = None  #: ``[N, W, V]``, allocated at the first forward

    @classmethod
    def empty(cls, rows: RolloutRows) -> "Handback":
        n, dev = rows.win.shape[0], rows.win.device
        return cls(win=rows.win.clone(), ran=torch.zeros(n, dtype=torch.bool, device=dev),
                   step=torch.zeros(n, dtype=torch.long, device=dev))

    def keep(self, act: torch.Tensor, win: torch.Tensor, logits: torch.Tensor, t: int) -> None:
        if self.logits is None:
            self.logits = logits.new_zeros((self.win.shape[0], *logits.shape[1:]))
        self.logits[act], self.win[act], self.ran[act], self.step[act] = logits, win, True, t


def rollout_rows(plan: CandidatePlan, f: StepFeatures, x: torch.Tensor, attn: torch.Tensor, commit: torch.Tensor,
                 tokens: torch.Tensor, levels: list) -> RolloutRows:
    """One row per candidate, its first step written: the controller's commits (``commit``, ``tokens``)
    and its branch tokens; an escalation's first step is Fast-dLLM's threshold rule at τ_e instead."""
    w = plan.cand_ok.shape[1]
    flat = plan.cand_ok.reshape(-1).nonzero().squeeze(1)  # candidate rows, no Python loop over them
    plan_row, slot = flat // w, flat % w
    src = plan.rows[plan_row]
    level = plan.esc[plan_row, slot]
    step_lp = step_token_logprob(f, tokens)  # [B, W] log p of the step's tokens at the first forward
    rows = RolloutRows(
        plan_row=plan_row, src=src, slot=slot, canvas=x[src], attn=attn[src], cols=window_index(f)[src],
        real=window_valid(f)[src], region=f.eligible[src],
        win=torch.where(commit, tokens, x.gather(1, window_index(f)))[src],
        lp_rec=torch.where(commit, step_lp, torch.zeros_like(step_lp))[src],
        lp_mask=commit[src].clone(), depth=plan.depth[plan_row], level=level,
        tau=torch.tensor([0.0] + [float(t) for t in levels], device=x.device)[level],
        is_hold=plan.hold[plan_row, slot], branch_pos=plan.branch_pos[plan_row],
        branch_ok=plan.branch_ok[plan_row] & ~(plan.hold[plan_row, slot] | (level > 0))[:, None],
        branch_tok=plan.cand_tokens[plan_row, slot])
    if rows.is_escalation.any():
        _escalation_first_step(rows, f, x)
    pos, ok = rows.branch_pos, rows.branch_ok
    rows.win.scatter_(1, pos, torch.where(ok, rows.branch_tok, rows.win.gather(1, pos)))
    rows.lp_rec.scatter_(1, pos, torch.where(ok, plan.cand_logp[plan_row, slot], rows.lp_rec.gather(1, pos)))
    rows.lp_mask.scatter_(1, pos, rows.lp_mask.gather(1, pos) | ok)
    return rows


def _escalation_first_step(rows: RolloutRows, f: StepFeatures, x: torch.Tensor) -> None:
    """An escalation's first step, in place: Fast-dLLM's threshold rule at τ_e on the step's tokens."""
    e = rows.is_escalation.nonzero().squeeze(1)
    se = rows.src[e]
    first = threshold_fill(f.confidence[se].float(), f.eligible[se], rows.tau[e])
    rows.win[e] = torch.where(first, f.x0[se], x[se].gather(1, window_index(f)[se]))
    rows.lp_rec[e] = torch.where(first, step_token_logprob(f, f.x0)[se], torch.zeros_like(rows.lp_rec[e]))
    rows.lp_mask[e] = first


def threshold_fill(conf: torch.Tensor, still: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Positions still open whose confidence is at least the row's threshold ``tau`` ``[N]``, and at
    least the most confident one: Fast-dLLM's threshold rule (``fast_dllm``), row by row."""
    return (still & (conf >= tau[:, None])) | select_topk(conf, still, 1)


def controller_fill(controller: Any, logits: torch.Tensor, still: torch.Tensor, win: torch.Tensor, src: torch.Tensor,
                    f: StepFeatures, state: DecodeState, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What the step's controller fills on a rollout's window at rollout step ``t``, on a copy of its
    memory (rollouts never leak into it), and that forward's predicted tokens (x0)."""
    window = StepWindow(
        eligible=still, masked=(win == state.mask_token_id) & f.eligible[src], rel=f.position[src],
        block_start=f.block_start[src], block_end=f.block_end[src], block_index=f.block_index[src],
        block_masked_at_start=f.block_masked_at_start[src], step=f.step[src] + t + 1,
        block_step=f.block_step[src] + t + 1, seeds=state.seeds[src], window_index=window_index(f)[src],
        block_of=None if f.block_of is None else f.block_of[src],
    )
    options = FeatureOptions(gen_length=state.config.gen_length, temperature=state.config.temperature)
    feats = compute_features(logits, window, options)
    sub = state.rows(src)
    sub.context.canvas = win
    d = controller.decide(feats, sub)
    return ensure_progress(d.commit & still, still, feats.confidence), feats.x0


@dataclass
class RolloutRun:
    """What one call of :func:`roll_out` needs besides the rows: the model, the step and the fill rule."""

    model: Any
    f: StepFeatures
    state: DecodeState
    rule: Rollout
    controller: Any
    complete: bool  #: fill the rest of the block after the last forward
    spent: torch.Tensor  #: long ``[B]`` extra NFE per sub-batch row, counted in place


def roll_out(run: RolloutRun, rows: RolloutRows, sel: torch.Tensor, handback: Handback) -> float:
    """Roll the candidate rows ``sel`` out, up to their depth; the seconds their forwards took."""
    mask_id = int(run.state.mask_token_id)
    secs = 0.0
    for t in range(int(rows.depth[sel].max())):
        open_ = ((rows.win == mask_id) & rows.region).any(1)
        act = ((rows.depth > t) & open_ & sel).nonzero().squeeze(1)  # a finished rollout stops early
        if act.numel() == 0:
            break
        t0 = synced_clock(rows.win.device)
        logits = window_logits(run.model, write_window(rows.canvas[act], rows.cols[act], rows.win[act], rows.real[act]),
                               rows.attn[act], rows.cols[act])
        secs += synced_clock(rows.win.device) - t0
        run.spent.index_add_(0, rows.src[act], torch.ones_like(act))
        if t < int(run.rule.advance):  # kept: the winner's is the loop's next forward
            handback.keep(act, rows.win[act], logits, t)
        _fill(run, rows, act, logits, t)
    return secs


def _fill(run: RolloutRun, rows: RolloutRows, act: torch.Tensor, logits: torch.Tensor, t: int) -> None:
    """Rollout step ``t`` of the rows ``act``: choose tokens from ``logits`` and write what the rule fills."""
    mask_id = int(run.state.mask_token_id)
    src = rows.src[act]
    still = (rows.win[act] == mask_id) & rows.region[act]
    logits = suppress_mask_logit(logits, mask_id)
    logp = torch.log_softmax(logits.float(), dim=-1)
    by_controller = run.rule.rollout == "controller" and run.controller is not None
    if by_controller:  # its features already hold the step's sample (x0) at temperature > 0
        fill, x0 = controller_fill(run.controller, logits, still, rows.win[act], src, run.f, run.state, t)
    temperature = float(run.state.config.temperature)
    if temperature > 0:  # the loop's own sampler, keyed by (sample, the rollout's step, position)
        pred = x0 if by_controller else sample_tokens(
            logits, temperature, run.state.seeds[src], run.f.step[src] + t + 1, run.f.position[src])
        best_lp = logp.gather(-1, pred.unsqueeze(-1)).squeeze(-1)
    else:
        best_lp, pred = logp.max(-1)
    del logp
    if not by_controller:
        fill = run.rule.policy_fill(best_lp.exp(), still)
    esc = rows.is_escalation[act]
    if esc.any():  # an escalation rolls out under its own threshold rule
        fill = torch.where(esc[:, None], threshold_fill(best_lp.exp(), still, rows.tau[act]), fill)
    if run.complete:
        fill = fill | (still & (rows.depth[act] == t + 1)[:, None])
    fill = fill & still
    rows.win[act] = torch.where(fill, pred, rows.win[act])
    rows.lp_rec[act] = torch.where(fill, best_lp, rows.lp_rec[act])
    rows.lp_mask[act] = rows.lp_mask[act] | fill
