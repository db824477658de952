"""Adaptive multi-step lookahead: branch at uncertain positions, roll out, score jointly, commit.

The lookahead in three parts, each a small validated :class:`~adaptive_decoding.framework.core.params.Configurable`:

* :mod:`.candidates` — :class:`Branching`: **which candidates** (the hold, escalations
  ``escalate: [τ…]``, branch candidates: ``width``, ``positions``, ``branch``) and the step's
  :class:`CandidatePlan` cut to the budget;
* :mod:`.rollout` — :class:`Rollout`: **how a candidate is rolled out** (fill rule ``rollout``,
  ``rollout_threshold``, ``max_depth``, ``advance``, ``complete``) as extra batch rows;
* :mod:`.ranking` — :class:`Ranking`: **how they are ranked** (``scorer``, ``rescore``,
  ``hold_bonus``, ``lazy``, ``branch_pll``).

:mod:`.facade` holds :class:`Lookahead`, which the loop calls (``budget_left``, ``refine``) and which
takes the flat keys of ``--lookahead KEY=VALUE`` and a config's ``lookahead:`` mapping, ``budget``
among them; :mod:`.window` the window/canvas bookkeeping of candidate rows; :mod:`.sweep` the
benchmark's width/depth sweep. See docs/lookahead.md.
"""

from adaptive_decoding.framework.engine.lookahead.candidates import Branching, CandidatePlan
from adaptive_decoding.framework.engine.lookahead.facade import Lookahead, LookaheadResult
from adaptive_decoding.framework.engine.lookahead.ranking import Ranking
from adaptive_decoding.framework.engine.lookahead.rollout import Rollout

__all__ = ["Branching", "CandidatePlan", "Lookahead", "LookaheadResult", "Ranking", "Rollout"]
