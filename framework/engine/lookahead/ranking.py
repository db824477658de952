"""How a lookahead step's rollouts are ranked (:class:`Ranking`), and the winner picked.

Each completed rollout becomes a row of the scorer's :class:`~adaptive_decoding.framework.engine.scorer.Candidates`:
its generation, with a log-probability per position the step began with masked. With
``rescore='pll'`` those are the denoiser's pseudo-likelihood of the block, log p(v_i | every other
token) (one shadow-block forward per candidate on models that have one, else one forward per
position), so candidates are compared on the same positions by a joint measure; with ``'none'``
they are the probabilities recorded when each token was chosen. With two or more branch positions,
``branch_pll`` first replaces each branch token's marginal by log p(v_i | the other branch tokens)
(one forward per branch position and candidate). The scorer ranks the rollouts; ``hold_bonus`` is
added to the hold candidate's score. With ``lazy`` the candidates are scored in order (the hold, each
escalation, the branch candidates) and a row stops at the first that reaches the scorer's upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adaptive_decoding.framework.core.measure import synced_clock
from adaptive_decoding.framework.core.params import Configurable, Param, ParameterError
from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.denoise import (
    supports_shadow,
    suppress_mask_logit,
    token_logprob,
    verification_logits,
    window_logits,
)
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.lookahead.candidates import CandidatePlan
from adaptive_decoding.framework.engine.lookahead.rollout import RolloutRows
from adaptive_decoding.framework.engine.lookahead.window import write_window
from adaptive_decoding.framework.engine.scorer import Candidates, Scorer, ScoringContext

RESCORES = ("pll", "none")


class Ranking(Configurable):
    """How the rollouts are scored and in which order they are tried.

    Args:
        scorer: a :class:`adaptive_decoding.framework.engine.scorer.Scorer` or a ``--scorer`` spec string.
        rescore: ``pll`` scores completed rollouts by the pseudo-likelihood of the block; ``none`` by
            the probabilities recorded when each token was chosen.
        hold_bonus: added to the hold candidate's score, so committing anything else must win by more
            (scores lie in [−1, 0] per scorer weight): a guard against rollouts that look coherent only
            because they were conditioned on the guess.
        lazy: roll the candidates out in order (the hold, each escalation, then the branch candidates)
            and stop a row at the first whose score (plus ``hold_bonus`` for the hold) reaches the
            scorer's upper bound (0 for the built-in scorers): no later one can beat it, so the winner
            is the same, with fewer forwards.
        branch_pll: with two or more branch positions, replace each branch token's first-forward
            (marginal) log-probability by log p(v_i | the other branch tokens), one forward per branch
            position and candidate (counted), so joint candidates are ranked by their
            pseudo-likelihood rather than by a product of marginals. Kept though no configured
            experiment sets ``positions`` ≥ 2: without it the garden toy's joint mode is lost.
    """

    params = {
        "rescore": Param(str, choices=RESCORES, doc="joint score of completed rollouts: pll | none"),
        "hold_bonus": Param(float, low=0.0, doc="added to the hold candidate's score (another must win by more)"),
        "lazy": Param(bool, doc="roll candidates out in order; a sample stops at one that reaches the scorer's bound"),
        "branch_pll": Param(bool,
                            doc="with positions ≥ 2, rank branch tokens by pseudo-likelihood (m NFE a candidate)"),
    }

    def __init__(self, scorer: "Scorer | str" = "logprob", rescore: str = "none", hold_bonus: float = 0.0,
                 lazy: bool = True, branch_pll: bool = True) -> None:
        self.scorer = scorer
        self.rescore = rescore
        self.hold_bonus = hold_bonus
        self.lazy = lazy
        self.branch_pll = branch_pll

    def check_combination(self) -> None:
        if not isinstance(self.scorer, (Scorer, str)):
            raise ParameterError(f"Lookahead.scorer={self.scorer!r} is not allowed; allowed: a Scorer or a spec string")

    def get_scorer(self) -> Scorer:
        """The scorer (a spec string is parsed once and kept until it changes)."""
        return resolve_scorer(self)

    @staticmethod
    def scoring_context(state: DecodeState, model: Any) -> ScoringContext:
        """The scorer's context: the call's tokenizer, prompts and metas (``state.context``) and the model."""
        return ScoringContext.of_decode(state.context, model)

    def cost_per_candidate(self, model: Any, f: StepFeatures, plan: CandidatePlan) -> torch.Tensor:
        """Forwards each candidate of a plan row costs beyond its rollout ``[R]``: the branch
        pseudo-likelihood (m with ``branch_pll`` and m ≥ 2) and the re-scoring (``pll``; not counted
        without a ``model``)."""
        m_ok = plan.branch_ok.sum(1)
        cost = torch.where((m_ok >= 2) & bool(self.branch_pll), m_ok, torch.zeros_like(m_ok))
        if self.rescore == "none" or model is None:
            return cost
        if supports_shadow(model):
            return cost + 1
        return cost + f.eligible[plan.rows].sum(1)

    def phases(self, rows: RolloutRows, n_levels: int) -> list[torch.Tensor]:
        """The candidate rows scored together, in order: all at once, or lazily the hold, each
        escalation level, then the branch candidates."""
        if not self.lazy:
            return [torch.ones_like(rows.is_hold)]
        branch = ~rows.is_hold & ~rows.is_escalation
        return [rows.is_hold] + [rows.level == e for e in range(1, n_levels + 1)] + [branch]


@dataclass
class Scores:
    """The candidate rows' scores as they are filled in, phase by phase."""

    value: torch.Tensor  #: float ``[N]`` the scorer's score, −inf until scored
    bonus: torch.Tensor  #: float ``[N]`` ``hold_bonus`` on the hold candidate, 0 elsewhere
    n_plan_rows: int

    def settled(self, rows: RolloutRows, upper: float) -> torch.Tensor:
        """Candidate rows ``[N]`` whose plan row already has a candidate at the scorer's upper bound:
        no later one can beat it (ties go to the earlier)."""
        sure = torch.zeros(self.n_plan_rows, dtype=torch.bool, device=self.value.device)
        sure[rows.plan_row[self.value + self.bonus >= upper]] = True
        return sure[rows.plan_row]


def branch_pseudo_likelihood(model: Any, rows: RolloutRows, sel: torch.Tensor, spent: torch.Tensor,
                             mask_id: int) -> float:
    """log p(v_i | x with the other branch tokens) of the branch tokens of rows ``sel``, written into
    ``rows.lp_rec`` in place, one counted forward per (candidate, branch position); the seconds spent."""
    m = rows.branch_pos.shape[1]
    ok = rows.branch_ok & sel[:, None]
    pairs = ok.reshape(-1).nonzero().squeeze(1)  # (candidate, branch position) pairs, one forward each
    cand, j = pairs // m, pairs % m
    pos = rows.branch_pos[cand, j]
    probe = rows.win[cand].clone()
    probe[torch.arange(pairs.numel(), device=probe.device), pos] = mask_id
    at_col = rows.cols[cand].gather(1, pos[:, None])  # [n·m, 1] the probed canvas column
    dev = probe.device
    t0 = synced_clock(dev)
    at = window_logits(model, write_window(rows.canvas[cand], rows.cols[cand], probe, rows.real[cand]),
                       rows.attn[cand], at_col)[:, 0]
    secs = synced_clock(dev) - t0
    spent.index_add_(0, rows.src[cand], torch.ones_like(cand))
    lp = torch.log_softmax(at.float(), dim=-1).gather(1, rows.branch_tok[cand, j].unsqueeze(1)).squeeze(1)
    rows.lp_rec[cand, pos] = lp
    return secs


def rescore_pll(model: Any, rows: RolloutRows, idx: torch.Tensor, done: torch.Tensor, spent: torch.Tensor,
                mask_id: int) -> float:
    """Replace the recorded log-probabilities of rows ``idx`` (completed canvases ``done``) by the
    block's pseudo-likelihood, in place; the seconds its forwards took (counted in ``spent``)."""
    inside = rows.region[idx] & rows.real[idx]
    t0 = synced_clock(done.device)
    pll, cost = verification_logits(model, done, rows.attn[idx], rows.cols[idx], inside)
    secs = synced_clock(done.device) - t0
    spent.index_add_(0, rows.src[idx], cost)
    if pll is not None:
        rows.lp_rec[idx] = torch.where(inside, token_logprob(suppress_mask_logit(pll, mask_id), rows.win[idx]),
                                       rows.lp_rec[idx])
        rows.lp_mask[idx] = inside
    return secs


def rollouts_as_candidates(rows: RolloutRows, idx: torch.Tensor, done: torch.Tensor, f: StepFeatures,
                           state: DecodeState, x: torch.Tensor) -> Candidates:
    """The rollouts ``idx`` (completed canvases ``done`` ``[n, L]``) as the scorer's :class:`Candidates`:
    their generation regions and prompts; log-probabilities are recorded for the window only."""
    mask_id = int(state.mask_token_id)
    cols, real, src = rows.cols[idx], rows.real[idx], rows.src[idx]
    g = state.config.gen_length
    start = (cols[:, 0] - f.position[src][:, 0]).clamp(min=0)  # gen_start per candidate row
    lp_rec = write_window(torch.zeros(done.shape, dtype=rows.lp_rec.dtype, device=done.device), cols,
                          rows.lp_rec[idx], real)
    lp_mask = write_window(torch.zeros(done.shape, dtype=torch.bool, device=done.device), cols, rows.lp_mask[idx], real)
    gidx = (start[:, None] + torch.arange(g, device=done.device)[None, :]).clamp(max=done.shape[1] - 1)
    gen = done.gather(1, gidx)
    p = int(start.max()) if start.numel() else 0
    pidx = torch.arange(p, device=done.device)[None, :].expand(done.shape[0], p)
    prompt = x[src].gather(1, pidx) if p else torch.zeros(done.shape[0], 0, dtype=torch.long, device=done.device)
    sample = state.context.sample_index
    source = sample[src] if isinstance(sample, torch.Tensor) else src
    return Candidates(tokens=gen, source=source.long(), prompt_ids=prompt, prompt_mask=pidx < start[:, None],
                      decided=gen != mask_id, logprobs=lp_rec.gather(1, gidx), logprob_mask=lp_mask.gather(1, gidx))


def best_candidates(rows: RolloutRows, scores: Scores, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per plan row, the winning candidate slot ``[R]`` (ties: the earlier) and its candidate row ``[R]``."""
    r_cnt, dev = scores.n_plan_rows, scores.value.device
    grid = torch.full((r_cnt, width), float("-inf"), device=dev)
    grid[rows.plan_row, rows.slot] = scores.value + scores.bonus
    best = grid.argmax(1)
    at = torch.full((r_cnt, width), -1, dtype=torch.long, device=dev)
    at[rows.plan_row, rows.slot] = torch.arange(rows.slot.numel(), device=dev)
    return best, at[torch.arange(r_cnt, device=dev), best]


def resolve_scorer(owner: Any) -> Scorer:
    """``owner.scorer`` as a :class:`Scorer`: a spec string is parsed once and kept on ``owner`` until it changes."""
    if isinstance(owner.scorer, str):
        from adaptive_decoding.framework.engine.scorer import parse_scorer_spec

        if getattr(owner, "_scorer_spec", None) != owner.scorer:
            owner._scorer_obj, owner._scorer_spec = parse_scorer_spec(owner.scorer), owner.scorer
        return owner._scorer_obj
    return owner.scorer
