"""The :class:`Lookahead` the loop calls: plan the candidates, roll them out, rank them, commit the winner.

At a step where the controller asks for depth d_b > 0 (``Decision.depth``), the loop calls
:meth:`Lookahead.refine`. For every row b that can afford two candidates:

1. **Which candidates** (:class:`~adaptive_decoding.framework.engine.lookahead.candidates.Branching`): the hold, the
   escalations, the branch candidates, at most ``width``.
2. **How each is rolled out** (:class:`~adaptive_decoding.framework.engine.lookahead.rollout.Rollout`): as an extra batch
   row, its first step written, then up to d forwards of the fill rule ``rollout``.
3. **How they are ranked** (:class:`~adaptive_decoding.framework.engine.lookahead.ranking.Ranking`): the scorer on the
   completed rollouts (re-scored by pseudo-likelihood with ``rescore='pll'``), ``hold_bonus`` on the
   hold, lazily in order with ``lazy``.
4. **Commit the winner's first step**, nothing more (with ``advance`` a > 1 also what its first
   a − 1 rollout forwards filled). The winner's a-th forward (its first with a = 1) ran on exactly the
   canvas the loop decodes next, so its logits are handed back (``LookaheadResult.next_logits``) and
   the loop does not run it again. At temperature > 0 a rollout samples as the loop does; the
   controller's memory does not see the rollout steps committed this way.

``Lookahead`` takes the three parts' options objects and ``budget``; :meth:`Lookahead.build` takes the
flat keys of ``--lookahead KEY=VALUE`` and a config's ``lookahead:`` mapping and routes them to the
parts. Its defaults are the escalating rules verifier of ``experiments/configs/lookahead_confirm.yaml``
less its scorer and escalation, so ``Lookahead.build(scorer="sudoku_rules", escalate=[0.99])`` (or
``Lookahead(Branching(escalate=[0.99]), ranking=Ranking(scorer="sudoku_rules"))``) is that lookahead.

Cost: every rollout, branch pseudo-likelihood and re-scoring forward is one NFE of its row
(``extra_nfe``); the handed-back forward is not run twice. Budget: a row may spend ``budget`` extra NFE
over the whole decode; with ``budget_left`` left it runs its C candidates for
``d = min(d_b, budget_left // C − v − r)`` forwards (v branch pseudo-likelihood, r re-scoring forwards
per candidate); if that is 0, C is cut to what one forward affords, and a row that cannot afford two
candidates commits directly.

Failure: if planning, a rollout, the rollout controller or the scorer raises, the rows fall back to the
controller's own decision for this step (``fallback``), the failure is logged on the
``adaptive_decoding.framework.engine.lookahead`` logger, and the NFE already spent is still counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from adaptive_decoding.framework.core.params import Configurable, Param, ParameterError, StopDecoding
from adaptive_decoding.framework.engine.controller import Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.lookahead.candidates import Branching, CandidatePlan
from adaptive_decoding.framework.engine.lookahead.ranking import (
    Ranking,
    Scores,
    best_candidates,
    branch_pseudo_likelihood,
    rescore_pll,
    rollouts_as_candidates,
)
from adaptive_decoding.framework.engine.lookahead.rollout import (
    Handback,
    Rollout,
    RolloutRows,
    RolloutRun,
    roll_out,
    rollout_rows,
)
from adaptive_decoding.framework.engine.lookahead.window import write_window
from adaptive_decoding.framework.engine.scorer import Scorer, ScoringContext

logger = logging.getLogger("adaptive_decoding.framework.engine.lookahead")

#: flat keys that were renamed: the old key fails with a message naming the new one
RENAMED = {"verify": "branch_pll"}


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
class SearchOutcome:
    """The winner of each plan row ``[R]`` and what of its rollout the step commits."""

    best: torch.Tensor  #: long ``[R]`` winning candidate slot
    seconds: float  #: time spent in forwards
    window: torch.Tensor  #: long ``[R, W]`` the winner's window as committed (first step, advanced fills)
    canvas: torch.Tensor  #: long ``[R, L]`` the canvas with that window written
    logits: Optional[torch.Tensor]  #: ``[R, W, V]`` its handed-back forward (None if no rollout ran one)
    ran: torch.Tensor  #: bool ``[R]`` that forward ran
    advanced: torch.Tensor  #: long ``[R]`` rollout fills committed on top of the first step


#: the lookahead's parts by attribute: which candidates, how each is rolled out, how they are ranked
PARTS: dict[str, type[Configurable]] = {"branching": Branching, "rollout_rule": Rollout, "ranking": Ranking}
#: each flat key (``--lookahead KEY=VALUE``, ``--scorer``) and the part it belongs to, in get_params' order
FLAT_KEYS: dict[str, str] = {"scorer": "ranking", **{k: "branching" for k in Branching.params},
                             **{k: "rollout_rule" for k in Rollout.params}, **{k: "ranking" for k in Ranking.params}}


class Lookahead(Configurable):
    """Branch, roll candidates out as extra rows, commit the best rollout's first step(s).

    Takes its three parts' options objects and ``budget``; :meth:`build` takes their flat keys instead
    (``--lookahead KEY=VALUE``, a config's ``lookahead:`` mapping) and routes each to its part.

    Args:
        branching: which candidates (:class:`Branching`: width, hold, escalate, positions, branch).
        rollout_rule: how a candidate is rolled out (:class:`Rollout`: rollout, rollout_threshold,
            max_depth, advance, complete).
        ranking: how the rollouts are ranked (:class:`Ranking`: scorer, rescore, hold_bonus, lazy,
            branch_pll); ``scorer`` is a :class:`adaptive_decoding.framework.engine.scorer.Scorer` or a ``--scorer`` spec.
        budget: most extra NFE per sample over the whole decode (0 = no lookahead).

    ``None`` for a part takes its defaults. A flat key reads and writes through to its part
    (``la.width`` is ``la.branching.width``), and :meth:`get_params` lists the flat keys, so results
    files' settings hashes and the ``lookahead:`` mappings keep their form. ``params`` declares the
    flat keys ``--lookahead`` accepts (``scorer`` comes from ``--scorer``).
    """

    params = {**Branching.params, **Rollout.params, **Ranking.params,
              "budget": Param(int, low=0, doc="most extra NFE per sample spent on lookahead (0 = none)")}

    def __init__(self, branching: Optional[Branching] = None, rollout_rule: Optional[Rollout] = None,
                 ranking: Optional[Ranking] = None, budget: int = 128) -> None:
        self.branching = Branching() if branching is None else branching
        self.rollout_rule = Rollout() if rollout_rule is None else rollout_rule
        self.ranking = Ranking() if ranking is None else ranking
        self.budget = budget

    @classmethod
    def flat_keys(cls) -> list[str]:
        """Every flat key :meth:`build` takes: the parts' keywords (``scorer`` included) and ``budget``."""
        return [*FLAT_KEYS, "budget"]

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of a flat key (its part's) or of ``budget``."""
        part = FLAT_KEYS.get(name)
        return PARTS[part].default(name) if part is not None else super().default(name)

    @classmethod
    def build(cls, **params: Any) -> "Lookahead":
        """Construct from flat keys, each routed to its part, and validate; an unknown key fails listing
        the known ones, a renamed key naming its new name."""
        for old, new in RENAMED.items():
            if old in params:
                raise ParameterError(f"Lookahead.{old} is now called {new}; allowed: {new}={params[old]!r}")
        unknown = [k for k in params if k not in cls.flat_keys()]
        if unknown:
            raise ParameterError(f"Lookahead has no parameter {unknown[0]!r}; known: {', '.join(cls.flat_keys())}")
        parts = {part: kind(**{k: params[k] for k in FLAT_KEYS if FLAT_KEYS[k] == part and k in params})
                 for part, kind in PARTS.items()}
        built = cls(**parts, **({"budget": params["budget"]} if "budget" in params else {}))
        built.validate()
        return built

    def get_params(self) -> dict[str, Any]:
        """The flat keys and their values (what ``--lookahead`` and ``lookahead:`` mappings set)."""
        return {name: getattr(self, name) for name in self.flat_keys()}

    def set_params(self, **params: Any) -> "Lookahead":
        """Set flat keys (each on its part) or whole parts by name; unknown names fail listing the known."""
        known = [*self.flat_keys(), *PARTS]
        for key, value in params.items():
            if key not in known:
                raise ParameterError(f"Lookahead has no parameter {key!r}; known: {', '.join(known)}")
            setattr(self, key, value)
        return self

    def __getattr__(self, name: str) -> Any:
        """A flat key reads its part's value (called only when ``name`` is not an attribute of its own)."""
        part = FLAT_KEYS.get(name)
        if part is None or part not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.__dict__[part], name)

    def __setattr__(self, name: str, value: Any) -> None:
        part = FLAT_KEYS.get(name)
        if part is not None and part in self.__dict__:
            setattr(self.__dict__[part], name, value)
        else:
            super().__setattr__(name, value)

    # ------------------------------------------------------------------ the three parts
    def check_combination(self) -> None:
        for name, kind in PARTS.items():
            part = getattr(self, name)
            if not isinstance(part, kind):
                raise ParameterError(f"Lookahead.{name}={part!r} is not allowed; allowed: a {kind.__name__} "
                                     f"(or None for its defaults)")
        for name in PARTS:
            getattr(self, name).check_combination()

    def levels(self) -> list:
        """The escalation thresholds τ_e in order (a single number reads as one level)."""
        return self.branching.levels()

    def get_scorer(self) -> Scorer:
        """The scorer (a spec string is parsed once and kept until it changes)."""
        return self.ranking.get_scorer()

    # ------------------------------------------------------------------ the hook
    def budget_left(self, state: DecodeState, spent: torch.Tensor) -> torch.Tensor:
        """Extra NFE each row may still spend on rollouts ``[b]``, given what it has ``spent``."""
        return self.budget - spent

    def plan(self, f: StepFeatures, decision: Decision, commit: torch.Tensor, budget_left: torch.Tensor,
             model: Any = None) -> Optional[CandidatePlan]:
        """Rows that search, their candidates and the depth they can afford (re-scoring forwards are
        counted against the budget only when the ``model`` is given)."""
        ranking, depth = self.ranking, int(self.rollout_rule.max_depth)
        return self.branching.plan(f, decision, commit, budget_left, max_depth=depth,
                                   per_candidate=lambda p: ranking.cost_per_candidate(model, f, p))

    @torch.no_grad()
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
            plan = self.plan(feats, decision, commit, budget_left, model=model)
            if plan is None:
                return out
            found = self._search(model, x, attn, feats, commit, tokens, state, plan, spent, controller)
        except StopDecoding:
            raise
        except Exception as exc:  # noqa: BLE001 - any plug-in failure falls back, logged
            rows = wanted.nonzero().squeeze(1).tolist()
            logger.warning("lookahead failed (%s: %s); rows %s fall back to plain decoding this step",
                           type(exc).__name__, exc, rows)
            logger.debug("lookahead failure", exc_info=True)
            out.fallback = wanted.clone()
            return out
        return self._commit_winner(out, plan, found, feats, state)

    # ------------------------------------------------------------------ the search
    def _search(self, model: Any, x: torch.Tensor, attn: torch.Tensor, f: StepFeatures, commit: torch.Tensor,
                tokens: torch.Tensor, state: DecodeState, plan: CandidatePlan, spent: torch.Tensor,
                controller: Any) -> SearchOutcome:
        """Roll the plan's candidates out phase by phase, score them, and pick each row's winner."""
        ranking, rule = self.ranking, self.rollout_rule
        levels = self.levels()
        rows = rollout_rows(plan, f, x, attn, commit, tokens, levels)
        handback = Handback.empty(rows)
        run = RolloutRun(model=model, f=f, state=state, rule=rule, controller=controller, spent=spent,
                         complete=bool(rule.complete) or ranking.rescore == "pll")
        scorer, context = ranking.get_scorer(), ranking.scoring_context(state, model)
        scores = Scores(value=torch.full((rows.src.numel(),), float("-inf"), device=x.device),
                        bonus=float(ranking.hold_bonus) * rows.is_hold.float(), n_plan_rows=plan.rows.numel())
        secs = 0.0
        for phase in ranking.phases(rows, len(levels)):
            sel = phase & ~scores.settled(rows, scorer.bounds()[1])
            if sel.any():
                secs += self._score_phase(run, ranking, rows, sel, handback, scores, context, x)
        best, pick = best_candidates(rows, scores, plan.cand_ok.shape[1])
        chosen = handback.win[pick]
        return SearchOutcome(best=best, seconds=secs, window=chosen,
                             canvas=write_window(rows.canvas[pick], rows.cols[pick], chosen, rows.real[pick]),
                             logits=handback.logits[pick] if handback.logits is not None else None,
                             ran=handback.ran[pick], advanced=handback.step[pick])

    @staticmethod
    def _score_phase(run: RolloutRun, ranking: Ranking, rows: RolloutRows, sel: torch.Tensor, handback: Handback,
                     scores: Scores, context: ScoringContext, x: torch.Tensor) -> float:
        """Roll out and score the candidate rows ``sel`` (``scores`` filled in place); the forward seconds."""
        mask_id = int(run.state.mask_token_id)
        secs = 0.0
        if ranking.branch_pll and rows.branch_pos.shape[1] >= 2:
            secs += branch_pseudo_likelihood(run.model, rows, sel, run.spent, mask_id)
        secs += roll_out(run, rows, sel, handback)
        idx = sel.nonzero().squeeze(1)
        done = write_window(rows.canvas[idx], rows.cols[idx], rows.win[idx], rows.real[idx])
        if ranking.rescore == "pll":
            secs += rescore_pll(run.model, rows, idx, done, run.spent, mask_id)
        cands = rollouts_as_candidates(rows, idx, done, run.f, run.state, x)
        scores.value[idx] = ranking.get_scorer().score(cands, context).to(x.device).float()
        return secs

    @staticmethod
    def _commit_winner(out: LookaheadResult, plan: CandidatePlan, found: SearchOutcome, feats: StepFeatures,
                       state: DecodeState) -> LookaheadResult:
        """The step's tokens and commits with each searching row's winner written, and what it cost."""
        r, dev, b = plan.rows, out.tokens.device, out.tokens.shape[0]
        ar = torch.arange(r.numel(), device=dev)
        new_tokens, new_commit = out.tokens.clone(), out.commit.clone()
        take = feats.eligible[r] & (found.window != int(state.mask_token_id))
        new_tokens[r] = torch.where(take, found.window, out.tokens[r])
        new_commit[r] = take
        info = {name: torch.full((b,), -1 if name == "best" else 0, dtype=torch.long, device=dev)
                for name in ("best", "candidates", "depth", "held", "advanced", "escalated")}
        info["best"][r], info["candidates"][r], info["depth"][r] = found.best, plan.cand_ok.sum(1), plan.depth
        info["held"][r], info["advanced"][r] = plan.hold[ar, found.best].long(), found.advanced
        info["escalated"][r] = plan.esc[ar, found.best]
        res = LookaheadResult(tokens=new_tokens, commit=new_commit, extra_nfe=out.extra_nfe, fallback=out.fallback,
                              forward_seconds=found.seconds, info=info, advanced=info["advanced"],
                              escalated=info["escalated"] > 0)
        if found.logits is not None and found.ran.any():
            ran = found.ran
            res.next_rows, res.next_canvas, res.next_logits = r[ran], found.canvas[ran], found.logits[ran]
        return res
