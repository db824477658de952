"""Adaptive multi-step lookahead: branch at uncertain positions, roll out, score jointly, commit.

At a step where the controller asks for depth ``d_b > 0`` (``Decision.depth``) and keeps
``k > 1`` candidates at uncertain positions (eligible, not committed), the loop calls
:meth:`Lookahead.refine`. For every such row b:

1. **Branch positions**: the ``positions`` uncertain positions U_b with the lowest margin
   top1 − top2 (``branch='lowest'``, the riskiest) or the highest (``'highest'``: the ones the
   controller would commit next, so the question becomes "commit one more now, and which token?").
2. **Candidate first steps**: with ``hold`` (the default) candidate 0 is the controller's own
   decision with U_b left masked; the others add a joint assignment of U_b, each position taking
   one of its top-k_i tokens (k_i = ``Decision.k``, capped by ``width``), ranked by summed
   log-probability, the all-top-1 assignment first. With ``escalate`` [τ_1, τ_2, …] an escalation
   candidate per level follows the hold: its first step and its rollout commit what Fast-dLLM's
   threshold rule at τ_e commits (at least one position), a stricter rule than the controller's, so
   the search can answer "commit less here" as well as "commit this token". ``width`` counts every
   candidate. With two
   or more branch positions, ``verify`` re-scores each branch token given the others
   (pseudo-likelihood, one forward per branch position), since marginals cannot see coupling.
3. **Rollouts as extra batch rows**: candidate c starts from x_t with its first step written,
   then runs up to d forwards of a fill policy (greedy tokens, sampled as the loop samples at
   temperature > 0; a rollout whose block is full
   stops early): ``threshold`` fills the positions with confidence > ``rollout_threshold`` (at
   least one), ``sequential`` the most confident one, ``controller`` what the step's controller
   decides on a copy of its memory. After the last forward the rest of the block is filled
   greedily (``complete``, no extra forward). Rollouts stay inside the current block.
4. **Joint scoring**: with ``rescore='pll'`` (the default) each completed rollout is re-scored
   by the denoiser's pseudo-likelihood of the block: log p(v_i | every other token), for every
   position the step began with masked (one shadow-block forward per candidate on models that
   have one, else one forward per position), so candidates are compared on the same positions by
   a joint measure, not by the one-shot fill's marginals. ``rescore='none'`` keeps the
   probabilities recorded when each token was chosen. The scorer ranks the rollouts
   (:class:`framework.engine.scorer.Candidates`).
5. **Commit the first step of the best rollout**, nothing more: if the hold candidate wins, the
   branch positions stay masked. The winner's first rollout forward ran on exactly the canvas
   the loop decodes next, so its logits are handed back (``LookaheadResult.next_logits``) and
   the loop uses them instead of running that forward again. With ``advance`` a > 1 the winner's
   rollout is committed further: its first step and what its first a − 1 rollout forwards filled
   (never the greedy completion after its last forward), and its a-th forward (or its last, if it
   ran fewer) is the one handed back. At temperature > 0 a rollout samples its tokens as the loop
   does (keyed by sample, the rollout's step and position); the controller's memory does not see
   the rollout steps committed this way.

Cost: every rollout, verification and re-scoring forward is one NFE of its row (``extra_nfe``);
the reused forward is not run twice. Budget: a row with ``budget_left`` extra NFE runs its C
candidates for ``d = min(d_b, budget_left // C − v − r)`` steps (v verification, r re-scoring
forwards per candidate); if that is 0, C is cut to what one step affords, and a row that cannot
afford two candidates commits directly. Memory: the canvases ``[N, L]``, the recorded
log-probabilities ``[N, W]`` and each candidate's first-forward window logits ``[N, W, V]``
(for the reuse) are kept across rollout steps.

Failure: if planning, a rollout, the rollout controller or the scorer raises, the rows fall back
to the controller's own decision for this step (``fallback``), the failure is logged on the
``framework.engine.lookahead`` logger, and the NFE already spent is still counted.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from framework.core.measure import synced_clock
from framework.core.params import Configurable, Param, ParameterError
from framework.engine.controller import Decision, DecodeState
from framework.engine.denoise import (suppress_mask_logit, supports_shadow, token_logprob, verification_logits,
                                     window_logits)
from framework.engine.features import StepFeatures, sample_tokens
from framework.engine.scorer import Scorer, ScoringContext
from framework.engine.lookahead_rows import (alternatives, controller_fill, rollout_candidates, stable_positions,
                                             step_token_logprob, threshold_fill, verify_branch_tokens, window_index,
                                             window_valid, write_window)
from framework.engine.selection import select_topk

logger = logging.getLogger(__name__)

ROLLOUTS = ("threshold", "sequential", "controller")
RESCORES = ("pll", "none")
BRANCHES = ("lowest", "highest")


@dataclass
class LookaheadResult:
    """What :meth:`Lookahead.refine` hands back to the loop (rows of the step's sub-batch)."""

    tokens: torch.Tensor
    commit: torch.Tensor
    extra_nfe: torch.Tensor
    fallback: torch.Tensor
    forward_seconds: float = 0.0
    info: dict[str, torch.Tensor] = field(default_factory=dict)
    #: long ``[b]``: rollout steps of the winner committed on top of this step (``advance``), 0 where none
    advanced: Optional[torch.Tensor] = None
    #: bool ``[b]``: the winner was an escalation candidate
    escalated: Optional[torch.Tensor] = None
    #: rows (of the sub-batch) whose next forward already ran: the winner's first rollout forward
    next_rows: Optional[torch.Tensor] = None
    #: its canvas ``[R, L]`` (what the loop must see next for the reuse to hold) and window logits ``[R, W, V]``
    next_canvas: Optional[torch.Tensor] = None
    next_logits: Optional[torch.Tensor] = None


@dataclass
class _Plan:
    rows: torch.Tensor  # [R] sub-batch rows that branch
    branch_pos: torch.Tensor  # [R, m] positions
    branch_ok: torch.Tensor  # [R, m] position used
    cand_tokens: torch.Tensor  # [R, W, m] tokens per candidate
    cand_logp: torch.Tensor  # [R, W, m] their log-probabilities
    cand_ok: torch.Tensor  # [R, W] candidate exists
    depth: torch.Tensor  # [R] rollout steps
    hold: torch.Tensor  # [R, W] candidate leaves the branch positions masked
    esc: torch.Tensor  # [R, W] escalation level (1, 2, …) of an escalation candidate, 0 otherwise


class Lookahead(Configurable):
    """Branch at uncertain positions, roll candidates out as extra rows, commit the best rollout's first step.

    Args:
        scorer: a :class:`framework.engine.scorer.Scorer` or a ``--scorer`` spec string.
        width: most candidates per row (W).
        positions: branch positions per row (m); candidates are joint assignments of them.
        branch: ``lowest`` branches at the uncertain positions of lowest margin, ``highest`` at those
            of highest margin (the controller's next commits).
        rollout: fill policy of the rollouts (``threshold``, ``sequential``, ``controller``).
        rollout_threshold: confidence above which the ``threshold`` policy fills a position.
        max_depth: cap on the controller's depth d.
        complete: fill the rest of the block greedily after the last rollout forward.
        verify: with two or more branch positions, replace each branch token's first-forward
            (marginal) log-probability by log p(v_i | the other branch tokens), one forward per
            branch position and candidate (counted), so joint candidates are ranked by their
            pseudo-likelihood rather than by a product of marginals.
        hold: include the candidate that commits only the controller's decision (the branch
            positions stay masked); without it a branch token is always committed.
        hold_bonus: added to the hold candidate's score, so committing a branch token must win by
            more than this (scores lie in [−1, 0] per scorer weight): a guard against rollouts that
            look coherent only because they were conditioned on the guess.
        rescore: ``pll`` scores completed rollouts by the pseudo-likelihood of the block (one
            forward per candidate with a shadow block); ``none`` by the recorded probabilities.
        advance: steps of the winning rollout committed (a): 1 commits its first step only; a > 1
            also what its first a − 1 rollout forwards filled, so the forwards that chose them are
            decode steps, not discarded work.
        lazy: roll the candidates out in order (the hold, each escalation, then the branch candidates)
            and stop a row at the first whose score (plus ``hold_bonus`` for the hold) reaches the
            scorer's upper bound (0 for the built-in scorers): no later one can beat it, so the winner
            is the same, with fewer forwards.
        escalate: confidence thresholds τ_e in (0, 1] of escalation candidates, in order: each commits
            and rolls out by the threshold rule at τ_e (e.g. ``[0.99]``: when the controller's own
            continuation fails the scorer, try committing only what is near-certain); ``width`` must
            leave room for them.
        context: a :class:`framework.engine.scorer.ScoringContext` (tokenizer, prompt texts, meta);
            per-call values in ``state.context`` (``tokenizer``, ``meta``, ``prompt_text``) win.
    """

    params = {
        "width": Param(int, low=1, high=64, doc="most candidates per sample (W)", tune=(2, 8)),
        "positions": Param(int, low=1, high=4, doc="branch positions per sample (m)", tune=(1, 2)),
        "branch": Param(str, choices=BRANCHES, doc="branch at the lowest- or highest-margin uncertain positions"),
        "rollout": Param(str, choices=ROLLOUTS, doc="fill policy of the rollouts"),
        "rollout_threshold": Param(float, low=0.0, high=1.0, doc="confidence the threshold policy fills at"),
        "max_depth": Param(int, low=1, high=64, doc="cap on the lookahead depth d", tune=(1, 7)),
        "complete": Param(bool, doc="fill the rest of the block greedily after the last rollout step"),
        "verify": Param(bool, doc="with positions ≥ 2, re-score branch tokens by pseudo-likelihood (m NFE)"),
        "hold": Param(bool, doc="include the candidate that leaves the branch positions masked"),
        "hold_bonus": Param(float, low=0.0, doc="added to the hold candidate's score (a branch commit must win by more)"),
        "rescore": Param(str, choices=RESCORES, doc="joint score of completed rollouts: pll | none"),
        "advance": Param(int, low=1, high=64, doc="rollout steps of the winner committed (1: its first step only)"),
        "lazy": Param(bool, doc="roll candidates out in order; a sample stops at one that reaches the scorer's bound"),
        "escalate": Param(list, nullable=True,
                          doc="thresholds τ_e in (0, 1] of escalation candidates (stricter commit rules), after the hold"),
    }

    def __init__(
        self,
        scorer: "Scorer | str" = "logprob",
        width: int = 4,
        positions: int = 1,
        branch: str = "lowest",
        rollout: str = "threshold",
        rollout_threshold: float = 0.9,
        max_depth: int = 8,
        complete: bool = True,
        verify: bool = True,
        hold: bool = True,
        hold_bonus: float = 0.0,
        rescore: str = "pll",
        advance: int = 1,
        lazy: bool = False,
        escalate: Optional[list] = None,
        context: Optional[ScoringContext] = None,
    ) -> None:
        self.scorer = scorer
        self.width = width
        self.positions = positions
        self.branch = branch
        self.rollout = rollout
        self.rollout_threshold = rollout_threshold
        self.max_depth = max_depth
        self.complete = complete
        self.verify = verify
        self.hold = hold
        self.hold_bonus = hold_bonus
        self.rescore = rescore
        self.advance = advance
        self.lazy = lazy
        self.escalate = escalate
        self.context = context

    def check_combination(self) -> None:
        if not isinstance(self.scorer, (Scorer, str)):
            raise ParameterError(f"Lookahead.scorer={self.scorer!r} is not allowed; allowed: a Scorer or a spec string")
        if self.rollout != "threshold" and self.rollout_threshold != 0.9:
            self.warn_no_effect("rollout_threshold", f"rollout={self.rollout!r} does not use a threshold")
        esc = self.levels()
        bad = [t for t in esc if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t <= 1.0]
        if bad:
            raise ParameterError(f"Lookahead.escalate={self.escalate!r} is not allowed (bad: {bad!r}); allowed: a list "
                                 f"of confidence thresholds in (0, 1], e.g. [0.99]")
        if esc and int(self.hold) + len(esc) > self.width:
            raise ParameterError(f"Lookahead.width={self.width} leaves no room for escalate={esc!r}"
                                 f"{' and the hold candidate' if self.hold else ''}; allowed: width >= "
                                 f"{int(self.hold) + len(esc)}")
        if self.advance > self.max_depth:
            self.warn_no_effect("advance", f"a rollout runs at most max_depth={self.max_depth} forwards")

    def levels(self) -> list:
        """The escalation thresholds τ_e in order (a single number reads as one level)."""
        esc = self.escalate
        return [] if esc is None else list(esc) if isinstance(esc, (list, tuple)) else [esc]

    def get_scorer(self) -> Scorer:
        if isinstance(self.scorer, str):
            from framework.engine.scorer import parse_scorer_spec

            if getattr(self, "_scorer_spec", None) != self.scorer:
                self._scorer_obj, self._scorer_spec = parse_scorer_spec(self.scorer), self.scorer
            return self._scorer_obj
        return self.scorer

    # ------------------------------------------------------------------ the hook
    @torch.no_grad()
    def budget_left(self, state: DecodeState, spent: torch.Tensor) -> torch.Tensor:
        """Extra NFE each row may still spend on rollouts ``[b]``, given what it has ``spent``."""
        return state.config.lookahead_budget - spent

    def refine(
        self, model: Any, x: torch.Tensor, attn: torch.Tensor, feats: StepFeatures, decision: Decision,
        commit: torch.Tensor, tokens: torch.Tensor, state: DecodeState, budget_left: torch.Tensor,
        controller: Any = None,
    ) -> LookaheadResult:
        """Tokens and commits ``[B, W]`` of this step's window for the sub-batch whose canvas is ``x``
        ``[B, L]`` (see the module doc); ``feats.window_index`` maps window slots to canvas columns."""
        b = x.shape[0]
        spent = torch.zeros(b, dtype=torch.long, device=x.device)
        fallback = torch.zeros(b, dtype=torch.bool, device=x.device)
        out = LookaheadResult(tokens=tokens, commit=commit, extra_nfe=spent, fallback=fallback)
        wanted = (decision.depth.to(x.device) > 0) if decision.depth is not None else fallback
        try:
            self.validate()
            plan = self.plan(feats, decision, commit, budget_left, self._rescore_cost(model, feats, commit))
            if plan is None:
                return out
            best, secs, first = self._rollout_and_rank(model, x, attn, feats, commit, tokens, state, plan, spent,
                                                       controller)
        except Exception as exc:  # noqa: BLE001 - any plug-in failure falls back, logged
            rows = wanted.nonzero().squeeze(1).tolist()
            logger.warning("lookahead failed (%s: %s); rows %s fall back to plain decoding this step",
                           type(exc).__name__, exc, rows)
            logger.debug("lookahead failure", exc_info=True)
            out.fallback = wanted.clone()
            return out
        r = plan.rows
        ar = torch.arange(r.numel(), device=x.device)
        # the winner's window as committed: its first step (the step's commits and, unless it holds, its
        # branch tokens) and, with advance > 1, what its rollout filled before the forward handed back
        win, canvas, logits, ran, advanced = first
        new_tokens, new_commit = tokens.clone(), commit.clone()
        take = feats.eligible[r] & (win != int(state.mask_token_id))
        new_tokens[r] = torch.where(take, win, tokens[r])
        new_commit[r] = take
        info = {name: torch.full((b,), -1 if name == "best" else 0, dtype=torch.long, device=x.device)
                for name in ("best", "candidates", "depth", "held", "advanced", "escalated")}
        info["best"][r], info["candidates"][r], info["depth"][r] = best, plan.cand_ok.sum(1), plan.depth
        info["held"][r], info["advanced"][r] = plan.hold[ar, best].long(), advanced
        info["escalated"][r] = plan.esc[ar, best]
        out = LookaheadResult(tokens=new_tokens, commit=new_commit, extra_nfe=spent, fallback=fallback,
                              forward_seconds=secs, info=info, advanced=info["advanced"],
                              escalated=info["escalated"] > 0)
        if logits is not None and ran.any():
            out.next_rows, out.next_canvas, out.next_logits = r[ran], canvas[ran], logits[ran]
        return out

    def _rescore_cost(self, model: Any, f: StepFeatures, commit: torch.Tensor) -> torch.Tensor:
        """Forwards the joint re-scoring costs per candidate of each row ``[B]``."""
        if self.rescore == "none":
            return torch.zeros(f.x0.shape[0], dtype=torch.long, device=f.x0.device)
        if supports_shadow(model):
            return torch.ones(f.x0.shape[0], dtype=torch.long, device=f.x0.device)
        return f.eligible.sum(1)

    # ------------------------------------------------------------------ 1-2: the candidate set
    def plan(self, f: StepFeatures, decision: Decision, commit: torch.Tensor,
             budget_left: torch.Tensor, rescore_cost: Optional[torch.Tensor] = None) -> Optional[_Plan]:
        """Rows that branch, their branch positions and candidates, and the depth they can afford."""
        b, l = f.x0.shape
        dev = f.x0.device
        depth = (decision.depth.to(dev).long() if decision.depth is not None
                 else torch.zeros(b, dtype=torch.long, device=dev)).clamp(0, int(self.max_depth))
        k = decision.k.to(dev).long() if decision.k is not None else torch.ones_like(f.x0)
        uncertain = f.eligible & ~commit & (k > 1)
        # an escalation needs no branch position: with escalations any row with a masked position may search
        can = f.eligible.any(1) if self.levels() else uncertain.any(1)
        rows = ((depth > 0) & can & (budget_left.to(dev) >= 2)).nonzero().squeeze(1)
        if rows.numel() == 0:
            return None
        unc, kk = uncertain[rows], k[rows]
        m = min(int(self.positions), l)
        sign = 1.0 if self.branch == "highest" else -1.0
        key = torch.where(unc, sign * f.margin[rows].float(), torch.full_like(f.margin[rows], float("-inf"), dtype=torch.float))
        pos, ok = stable_positions(key, unc, m)  # ties to the lower index
        kmax = max(1, min(int(self.width), int(kk.max())))
        alt_ids, alt_lp = alternatives(f, rows, pos, kmax)  # [R, m, K]
        k_at = kk.gather(1, pos).clamp(max=kmax)  # [R, m]
        k_at = torch.where(ok, k_at, torch.ones_like(k_at))
        combos = torch.tensor(list(itertools.product(range(kmax), repeat=m)), dtype=torch.long, device=dev)  # [C, m]
        c = combos.shape[0]
        idx = combos.t().unsqueeze(0).expand(rows.numel(), m, c)  # [R, m, C]
        lp = alt_lp.gather(2, idx)  # [R, m, C]
        lp = torch.where(ok[:, :, None], lp, torch.zeros_like(lp)).sum(1)  # [R, C]
        valid = (combos.t().unsqueeze(0) < k_at[:, :, None]).all(1)  # [R, C]
        held, n_esc = int(bool(self.hold)), len(self.levels())
        w = min(int(self.width) - held - n_esc, c)
        ranked = torch.where(valid, lp, torch.full_like(lp, float("-inf")))
        order = torch.argsort(ranked, dim=1, descending=True, stable=True)[:, :w]  # combo 0 (all top-1) first
        # candidate 0: the controller's decision alone; then the escalations (their tokens are placeholders)
        order = torch.cat([order.new_zeros(order.shape[0], held + n_esc), order], dim=1)
        cand_ok = valid.gather(1, order)
        cand_ok[:, : held + n_esc] = True
        cand_ok[:, held + n_esc:] &= ok.any(1, keepdim=True)  # no branch position, no branch candidate
        hold = torch.zeros_like(cand_ok)
        hold[:, :held] = True
        esc = torch.zeros_like(order)
        esc[:, held: held + n_esc] = torch.arange(1, n_esc + 1, device=dev)
        w += held + n_esc
        cand_idx = combos[order]  # [R, W, m]
        cand_tokens = alt_ids.unsqueeze(1).expand(-1, w, -1, -1).gather(3, cand_idx.unsqueeze(-1)).squeeze(-1)
        cand_logp = alt_lp.unsqueeze(1).expand(-1, w, -1, -1).gather(3, cand_idx.unsqueeze(-1)).squeeze(-1)
        # budget: C candidates × (d steps + v verification + r re-scoring forwards) ≤ budget_left
        n = cand_ok.sum(1)
        bl = budget_left.to(dev)[rows].long()
        m_ok = ok.sum(1)
        v = torch.where((m_ok >= 2) & bool(self.verify), m_ok, torch.zeros_like(m_ok))
        v = v + (rescore_cost.to(dev)[rows].long() if rescore_cost is not None else 0)
        d = torch.minimum(depth[rows], bl // n.clamp(min=1) - v)
        cut = (d < 1) & (bl >= 2 * (1 + v))
        n = torch.where(cut, torch.minimum(n, bl // (1 + v)), n)
        d = torch.where(cut, torch.ones_like(d), d)
        cand_ok = cand_ok & (torch.arange(w, device=dev)[None, :] < n[:, None])
        keep = (d >= 1) & (cand_ok.sum(1) >= 2)
        if not keep.any():
            return None
        return _Plan(rows=rows[keep], branch_pos=pos[keep], branch_ok=ok[keep], cand_tokens=cand_tokens[keep],
                     cand_logp=cand_logp[keep], cand_ok=cand_ok[keep], depth=d[keep], hold=hold[keep], esc=esc[keep])

    # ------------------------------------------------------------------ 3-5: rollouts, joint scores, ranking
    def _rollout_and_rank(
        self, model: Any, x: torch.Tensor, attn: torch.Tensor, f: StepFeatures, commit: torch.Tensor,
        tokens: torch.Tensor, state: DecodeState, plan: _Plan, spent: torch.Tensor, controller: Any,
    ) -> tuple[torch.Tensor, float, tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor,
                                          torch.Tensor]]:
        """The winner per plan row, the seconds spent in forwards, and the winner's committed window
        ``[R, W]``, canvas ``[R, L]``, the window logits of its handed-back forward ``[R, W, V]`` (None if
        no rollout ran a forward), whether that forward ran ``[R]`` and its rollout fills committed ``[R]``."""
        dev = x.device
        mask_id = int(state.mask_token_id)
        r_cnt, w = plan.cand_ok.shape
        flat = plan.cand_ok.reshape(-1).nonzero().squeeze(1)  # candidate rows, no Python loop over them
        src_plan = flat // w  # index into plan rows
        src = plan.rows[src_plan]  # index into the step's sub-batch
        cand_j = flat % w
        cols = window_index(f)[src]  # [N, W] the window's canvas columns, per candidate
        real = window_valid(f)[src]
        # the first step: controller commits + this candidate's branch tokens (none for the hold candidate)
        base_lp = step_token_logprob(f, tokens)  # [B, W] log p of the step's tokens at the first forward
        win = torch.where(commit, tokens, x.gather(1, window_index(f)))[src]
        lp_rec = torch.where(commit, base_lp, torch.zeros_like(base_lp))[src]
        lp_mask = commit[src].clone()
        lvl = plan.esc[src_plan, cand_j]  # escalation level per candidate row, 0 for the others
        is_esc, n_esc = lvl > 0, len(self.levels())
        taus = torch.tensor([0.0] + [float(t) for t in self.levels()], device=dev)[lvl]  # [N] τ_e
        if is_esc.any():  # an escalation's first step: Fast-dLLM's threshold rule at τ_e on the step's tokens
            e = is_esc.nonzero().squeeze(1)
            first = threshold_fill(f.confidence[src[e]].float(), f.eligible[src[e]], taus[e])
            win[e] = torch.where(first, f.x0[src[e]], x[src[e]].gather(1, window_index(f)[src[e]]))
            lp_rec[e] = torch.where(first, step_token_logprob(f, f.x0)[src[e]], torch.zeros_like(lp_rec[e]))
            lp_mask[e] = first
        bpos = plan.branch_pos[src_plan]
        bok = plan.branch_ok[src_plan] & ~(plan.hold[src_plan, cand_j] | is_esc)[:, None]
        btok = plan.cand_tokens[src_plan, cand_j]
        blp = plan.cand_logp[src_plan, cand_j]
        win.scatter_(1, bpos, torch.where(bok, btok, win.gather(1, bpos)))
        lp_rec.scatter_(1, bpos, torch.where(bok, blp, lp_rec.gather(1, bpos)))
        lp_mask.scatter_(1, bpos, lp_mask.gather(1, bpos) | bok)
        region = f.eligible[src]
        depth = plan.depth[src_plan]
        attn_c = attn[src]
        canvas = x[src]
        # the snapshot handed back: the window a rollout forward ran on (its first, up to its a-th)
        snap_win, snap_logits = win.clone(), None
        snap_ran = torch.zeros(win.shape[0], dtype=torch.bool, device=dev)
        snap_t = torch.zeros(win.shape[0], dtype=torch.long, device=dev)
        secs = 0.0
        complete = bool(self.complete) or self.rescore == "pll"
        temperature = float(state.config.temperature)
        scorer, context = self.get_scorer(), self._context(state, model)
        scores = torch.full((win.shape[0],), float("-inf"), device=dev)
        is_hold = plan.hold[src_plan, cand_j]
        bonus = float(self.hold_bonus) * is_hold.float()
        phases = ([is_hold] + [lvl == i for i in range(1, n_esc + 1)] + [~is_hold & ~is_esc] if self.lazy
                  else [torch.ones_like(is_hold)])  # lazy: the hold, each escalation, then the branch candidates
        for phase in phases:
            # a row stops at a candidate that reaches the scorer's bound: no later one beats it (ties go first)
            sure = torch.zeros(r_cnt, dtype=torch.bool, device=dev)
            sure[src_plan[scores + bonus >= scorer.bounds()[1]]] = True
            sel = phase & ~sure[src_plan]
            if not sel.any():
                continue
            if self.verify and bpos.shape[1] >= 2:
                secs += verify_branch_tokens(model, canvas, cols, real, win, attn_c, bpos, bok & sel[:, None], btok,
                                             lp_rec, src, spent, mask_id)
            for t in range(int(depth[sel].max())):
                open_ = ((win == mask_id) & region).any(1)
                act = ((depth > t) & open_ & sel).nonzero().squeeze(1)  # a finished rollout stops early
                if act.numel() == 0:
                    break
                t0 = synced_clock(dev)
                logits = window_logits(model, write_window(canvas[act], cols[act], win[act], real[act]), attn_c[act],
                                       cols[act])
                secs += synced_clock(dev) - t0
                spent.index_add_(0, src[act], torch.ones_like(act))
                if t < int(self.advance):  # kept: the winner's is the loop's next forward
                    if snap_logits is None:
                        snap_logits = logits.new_zeros((win.shape[0], *logits.shape[1:]))
                    snap_logits[act], snap_win[act], snap_ran[act], snap_t[act] = logits, win[act], True, t
                still = (win[act] == mask_id) & region[act]
                logits = suppress_mask_logit(logits, mask_id)
                logp = torch.log_softmax(logits.float(), dim=-1)
                by_controller = self.rollout == "controller" and controller is not None
                if by_controller:  # its features already hold the step's sample (x0) at temperature > 0
                    fill, x0 = controller_fill(controller, logits, still, win[act], src[act], f, state, t)
                if temperature > 0:  # the loop's own sampler, keyed by (sample, the rollout's step, position)
                    pred = x0 if by_controller else sample_tokens(
                        logits, temperature, state.seeds[src[act]], f.step[src[act]] + t + 1, f.position[src[act]])
                    best_lp = logp.gather(-1, pred.unsqueeze(-1)).squeeze(-1)
                else:
                    best_lp, pred = logp.max(-1)
                if not by_controller:
                    fill = self._policy_fill(best_lp.exp(), still)
                if is_esc[act].any():  # an escalation rolls out under its own threshold rule
                    fill = torch.where(is_esc[act][:, None], threshold_fill(best_lp.exp(), still, taus[act]), fill)
                del logp
                last = depth[act] == t + 1
                if complete:
                    fill = fill | (still & last[:, None])
                fill = fill & still
                win[act] = torch.where(fill, pred, win[act])
                lp_rec[act] = torch.where(fill, best_lp, lp_rec[act])
                lp_mask[act] = lp_mask[act] | fill
            idx = sel.nonzero().squeeze(1)
            done = write_window(canvas[idx], cols[idx], win[idx], real[idx])
            if self.rescore == "pll":
                t0 = synced_clock(dev)
                pll, cost = verification_logits(model, done, attn_c[idx], cols[idx], region[idx] & real[idx])
                secs += synced_clock(dev) - t0
                spent.index_add_(0, src[idx], cost)
                if pll is not None:
                    inside = region[idx] & real[idx]
                    lp_rec[idx] = torch.where(inside, token_logprob(suppress_mask_logit(pll, mask_id), win[idx]),
                                              lp_rec[idx])
                    lp_mask[idx] = inside
            cands = rollout_candidates(done, cols[idx], real[idx], lp_rec[idx], lp_mask[idx], f, src[idx], state,
                                       mask_id, x)
            scores[idx] = scorer.score(cands, context).to(dev).float()
        grid = torch.full((r_cnt, w), float("-inf"), device=dev)
        grid[src_plan, cand_j] = scores + bonus
        best = grid.argmax(1)
        at = torch.full((r_cnt, w), -1, dtype=torch.long, device=dev)
        at[src_plan, cand_j] = torch.arange(flat.numel(), device=dev)
        pick = at[torch.arange(r_cnt, device=dev), best]
        chosen = snap_win[pick]
        logits_out = snap_logits[pick] if snap_logits is not None else None
        return best, secs, (chosen, write_window(canvas[pick], cols[pick], chosen, real[pick]), logits_out,
                            snap_ran[pick], snap_t[pick])

    def _policy_fill(self, conf: torch.Tensor, still: torch.Tensor) -> torch.Tensor:
        best = select_topk(conf, still, 1)
        if self.rollout == "sequential":
            return best
        return (still & (conf > self.rollout_threshold)) | best

    def _context(self, state: DecodeState, model: Any) -> ScoringContext:
        base = self.context or ScoringContext()
        ctx = state.context
        return ScoringContext(
            tokenizer=ctx.tokenizer if ctx.tokenizer is not None else base.tokenizer,
            denoiser=base.denoiser if base.denoiser is not None else model,
            prompt_text=ctx.prompt_text if ctx.prompt_text is not None else base.prompt_text,
            meta=ctx.meta if ctx.meta is not None else base.meta,
            resources=base.resources,
            special_ids=base.special_ids,
        )
