"""Which candidates a lookahead step compares (:class:`Branching`) and the plan of one step.

At a step where the controller asks for depth d_b > 0 (``Decision.depth``) the candidates of row b
are, in this order:

* the **hold** (``hold``): the controller's own decision, the branch positions left masked;
* one **escalation** per threshold τ_e of ``escalate``: its first step (and its rollout) commits what
  Fast-dLLM's threshold rule at τ_e commits, at least one position: "commit less here";
* **branch candidates**: the controller's decision plus a joint assignment of the ``positions`` (m)
  uncertain positions U_b of lowest margin top1 − top2 (``branch='lowest'``) or highest
  (``'highest'``), each position taking one of its top-k_i tokens (k_i = ``Decision.k``, capped by
  ``width``), ranked by summed log-probability, the all-top-1 assignment first.

``width`` (W) counts every candidate. The plan then cuts the depth (and if need be the candidates)
to what the row's budget affords.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any, Optional

import torch

from adaptive_decoding.framework.core.params import Configurable, Param, ParameterError
from adaptive_decoding.framework.engine.controller import Decision
from adaptive_decoding.framework.engine.features import StepFeatures

BRANCHES = ("lowest", "highest")


@dataclass
class CandidatePlan:
    """The rows that search at this step and their candidates (R rows, W candidate slots, m positions)."""

    rows: torch.Tensor  #: long ``[R]`` sub-batch rows that search
    branch_pos: torch.Tensor  #: long ``[R, m]`` branch positions (window slots)
    branch_ok: torch.Tensor  #: bool ``[R, m]`` the position exists
    cand_tokens: torch.Tensor  #: long ``[R, W, m]`` each candidate's tokens at the branch positions
    cand_logp: torch.Tensor  #: float ``[R, W, m]`` their log-probabilities at the step's forward
    cand_ok: torch.Tensor  #: bool ``[R, W]`` the candidate exists (and is affordable)
    depth: torch.Tensor  #: long ``[R]`` rollout forwards d each candidate may run
    hold: torch.Tensor  #: bool ``[R, W]`` the hold candidate
    esc: torch.Tensor  #: long ``[R, W]`` escalation level e (1, 2, …) of an escalation candidate, 0 otherwise

    def select(self, keep: torch.Tensor) -> "CandidatePlan":
        """The plan of the rows ``keep`` (a bool ``[R]`` or an index)."""
        return CandidatePlan(**{f.name: getattr(self, f.name)[keep] for f in fields(self)})


def stable_positions(key: torch.Tensor, ok: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The m highest ``key`` positions per row (ties: lower index), and which of them exist."""
    order = torch.argsort(key, dim=1, descending=True, stable=True)[:, :m]
    return order, ok.gather(1, order)


def alternatives(f: StepFeatures, rows: torch.Tensor, pos: torch.Tensor,
                 kmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``kmax`` token ids and log-probabilities ``[R, m, K]`` at the branch positions."""
    if f.logits is not None:
        lg = f.logits[rows].gather(1, pos[:, :, None].expand(-1, -1, f.logits.shape[-1]))
        logp = torch.log_softmax(lg.float(), dim=-1)
        top = logp.topk(min(kmax, logp.shape[-1]), dim=-1)
        ids, lp = top.indices, top.values
    else:  # only the top-2 statistics are known
        ids = torch.stack([f.top1_id[rows].gather(1, pos), f.top2_id[rows].gather(1, pos)], -1)
        p = torch.stack([f.top1_prob[rows].gather(1, pos), f.top2_prob[rows].gather(1, pos)], -1)
        ids, lp = ids[..., :kmax], p[..., :kmax].float().clamp(min=1e-30).log()
    if ids.shape[-1] < kmax:  # a vocabulary smaller than k: pad with impossible alternatives
        pad = kmax - ids.shape[-1]
        ids = torch.cat([ids, ids[..., :1].expand(*ids.shape[:-1], pad)], -1)
        lp = torch.cat([lp, torch.full((*lp.shape[:-1], pad), float("-inf"), device=lp.device)], -1)
    return ids, lp


class Branching(Configurable):
    """Which candidates a lookahead step rolls out: the hold, the escalations, the branch candidates.

    Args:
        width: most candidates per row (W), the hold and the escalations included.
        hold: include the candidate that commits only the controller's decision (the branch
            positions stay masked); without it a branch token is always committed.
        escalate: confidence thresholds τ_e in (0, 1] of escalation candidates, in order: each commits
            and rolls out by Fast-dLLM's threshold rule at τ_e (e.g. ``[0.99]``); ``width`` must leave
            room for them. A single number reads as one level.
        positions: branch positions per row (m); candidates are joint assignments of them. Kept though
            no configured experiment sets it: with m = 2 the garden toy's joint mode is found where one
            position cannot (``test_two_branch_positions_find_the_joint_mode_through_pseudo_likelihood``).
        branch: ``lowest`` branches at the uncertain positions of lowest margin, ``highest`` at those of
            highest margin (the controller's next commits). Kept though no configured experiment sets
            it: docs/lookahead.md's findings compare both.
    """

    params = {
        "width": Param(int, low=1, high=64, doc="most candidates per sample (W), hold and escalations included",
                       tune=(2, 8)),
        "hold": Param(bool, doc="include the candidate that leaves the branch positions masked"),
        "escalate": Param(list, nullable=True,
                          doc="thresholds τ_e in (0, 1] of escalation candidates (stricter commit rules), "
                              "after the hold"),
        "positions": Param(int, low=1, high=4, tune=(1, 2),
                           doc="branch positions per sample (m); kept for the joint (m ≥ 2) search"),
        "branch": Param(str, choices=BRANCHES,
                        doc="branch at the lowest- or highest-margin uncertain positions (findings compare both)"),
    }

    def __init__(self, width: int = 2, hold: bool = True, escalate: Optional[list] = None, positions: int = 1,
                 branch: str = "lowest") -> None:
        self.width = width
        self.hold = hold
        self.escalate = escalate
        self.positions = positions
        self.branch = branch

    def check_combination(self) -> None:
        esc = self.levels()
        bad = [t for t in esc if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t <= 1.0]
        if bad:
            raise ParameterError(f"Lookahead.escalate={self.escalate!r} is not allowed (bad: {bad!r}); allowed: a list "
                                 f"of confidence thresholds in (0, 1], e.g. [0.99]")
        if esc and int(self.hold) + len(esc) > self.width:
            raise ParameterError(f"Lookahead.width={self.width} leaves no room for escalate={esc!r}"
                                 f"{' and the hold candidate' if self.hold else ''}; allowed: width >= "
                                 f"{int(self.hold) + len(esc)}")

    def levels(self) -> list:
        """The escalation thresholds τ_e in order (a single number reads as one level)."""
        esc = self.escalate
        return [] if esc is None else list(esc) if isinstance(esc, (list, tuple)) else [esc]

    def plan(self, f: StepFeatures, decision: Decision, commit: torch.Tensor, budget_left: torch.Tensor, *,
             max_depth: int, per_candidate: Optional[Any] = None) -> Optional[CandidatePlan]:
        """Rows that search, their candidates, and the depth their budget affords; ``None`` if no row does.

        ``per_candidate(plan)`` gives the forwards each candidate costs beyond its rollout ``[R]``
        (branch pseudo-likelihood and re-scoring, :meth:`Ranking.cost_per_candidate`)."""
        dev = f.x0.device
        b = f.x0.shape[0]
        depth = (decision.depth.to(dev).long() if decision.depth is not None
                 else torch.zeros(b, dtype=torch.long, device=dev)).clamp(0, int(max_depth))
        k = decision.k.to(dev).long() if decision.k is not None else torch.ones_like(f.x0)
        uncertain = f.eligible & ~commit & (k > 1)
        # an escalation needs no branch position: with escalations any row with a masked position may search
        can = f.eligible.any(1) if self.levels() else uncertain.any(1)
        rows = ((depth > 0) & can & (budget_left.to(dev) >= 2)).nonzero().squeeze(1)
        if rows.numel() == 0:
            return None
        plan = self._candidates(f, rows, uncertain[rows], k[rows], depth[rows])
        extra = per_candidate(plan) if per_candidate is not None else torch.zeros_like(plan.depth)
        return afford(plan, budget_left.to(dev)[rows].long(), extra)

    def _candidates(self, f: StepFeatures, rows: torch.Tensor, unc: torch.Tensor, kk: torch.Tensor,
                    depth: torch.Tensor) -> CandidatePlan:
        """The hold, the escalations and the best joint assignments of the branch positions, per row."""
        dev, m = f.x0.device, min(int(self.positions), f.x0.shape[1])
        sign = 1.0 if self.branch == "highest" else -1.0
        margin = f.margin[rows].float()
        key = torch.where(unc, sign * margin, torch.full_like(margin, float("-inf")))
        pos, ok = stable_positions(key, unc, m)  # ties to the lower index
        kmax = max(1, min(int(self.width), int(kk.max())))
        alt_ids, alt_lp = alternatives(f, rows, pos, kmax)  # [R, m, K]
        k_at = kk.gather(1, pos).clamp(max=kmax)  # [R, m]
        k_at = torch.where(ok, k_at, torch.ones_like(k_at))
        combos = torch.tensor(list(itertools.product(range(kmax), repeat=m)), dtype=torch.long, device=dev)  # [C, m]
        idx = combos.t().unsqueeze(0).expand(rows.numel(), m, combos.shape[0])  # [R, m, C]
        lp = alt_lp.gather(2, idx)  # [R, m, C]
        lp = torch.where(ok[:, :, None], lp, torch.zeros_like(lp)).sum(1)  # [R, C]
        valid = (combos.t().unsqueeze(0) < k_at[:, :, None]).all(1)  # [R, C]
        held, n_esc = int(bool(self.hold)), len(self.levels())
        w = min(int(self.width) - held - n_esc, combos.shape[0])
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
        cand_idx = combos[order].unsqueeze(-1)  # [R, W, m, 1]
        w += held + n_esc
        return CandidatePlan(
            rows=rows, branch_pos=pos, branch_ok=ok, cand_ok=cand_ok, depth=depth, hold=hold, esc=esc,
            cand_tokens=alt_ids.unsqueeze(1).expand(-1, w, -1, -1).gather(3, cand_idx).squeeze(-1),
            cand_logp=alt_lp.unsqueeze(1).expand(-1, w, -1, -1).gather(3, cand_idx).squeeze(-1))


def afford(plan: CandidatePlan, budget: torch.Tensor, extra: torch.Tensor) -> Optional[CandidatePlan]:
    """The plan cut to the budget: C candidates × (d rollout forwards + ``extra``) ≤ ``budget`` ``[R]``.

    d = min(d_b, budget // C − extra); if that is 0, C is cut to what one forward each affords. A row
    left with fewer than two candidates or no forward commits directly (dropped); ``None`` if none is left."""
    w = plan.cand_ok.shape[1]
    n = plan.cand_ok.sum(1)
    d = torch.minimum(plan.depth, budget // n.clamp(min=1) - extra)
    cut = (d < 1) & (budget >= 2 * (1 + extra))
    n = torch.where(cut, torch.minimum(n, budget // (1 + extra)), n)
    d = torch.where(cut, torch.ones_like(d), d)
    cand_ok = plan.cand_ok & (torch.arange(w, device=d.device)[None, :] < n[:, None])
    keep = (d >= 1) & (cand_ok.sum(1) >= 2)
    if not keep.any():
        return None
    plan.depth, plan.cand_ok = d, cand_ok
    return plan.select(keep)
