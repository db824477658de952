"""On-policy training data (DAgger): label the states a policy itself visits.

Imitation rows come from one-token-per-step decoding, but a parallel policy reaches states that
decoding never visits (several tokens committed per step, some of them wrong). DAgger (Ross et
al. 2011) decodes with the current policy, and labels each visited state with the oracle *from
that state*:

    y = 1  ⇔  the position's current prediction x0 equals the token that the reference
              (one-token-per-step ``sequential``) ends with when it continues from this state,

so a position that only became safe because of an earlier mistake, or that a mistake made unsafe,
is labelled as it is now. The rounds aggregate these rows with the earlier ones and retrain.
At most ``states_per_rollout`` visited steps per prompt are labelled (each costs one reference
decode from that state), chosen with a seeded generator.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.options import ExampleDraw
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.loop import decode, sample_seeds
from adaptive_decoding.framework.learning.options import DaggerVisit
from adaptive_decoding.framework.learning.rollouts import RolloutDataset, StepRecorder, over_split
from adaptive_decoding.framework.models.structure import task_generation_structure


class _StateRecorder(StepRecorder):
    """Records every step's eligible rows and the generation the step saw."""

    def record(self, f: StepFeatures, state: DecodeState, rows: torch.Tensor, decision: Any) -> tuple:
        b, i = f.eligible.nonzero(as_tuple=True)
        return (self.features(f)[b, i].cpu(), rows[b].cpu(), f.position[b, i].cpu(),
                f.x0[b, i].cpu(), f.step[b].cpu(), rows.cpu(), f.step.cpu().clone(),
                state.context.generation.cpu().clone())


@torch.no_grad()
def collect_on_policy(model: Any, prompts: Sequence[Sequence[int]], controller: Any, config: DecodeConfig, *,
                      seeds: Any = None, visit: Optional[DaggerVisit] = None, structure: Optional[dict] = None,
                      context: Optional[DecodeContext] = None) -> RolloutDataset:
    """Decode ``prompts`` with ``controller``; label up to ``visit.states_per_rollout`` visited steps per
    prompt with the ``visit.reference`` decode continued from each (see the module docstring;
    :class:`~adaptive_decoding.framework.learning.options.DaggerVisit`, default every default); ``structure``: the
    generation's declared structure, for the peer features; ``context``: the call's decode context
    (:meth:`DecodeContext.for_batch`; each continuation gets its rows)."""
    visit = visit if visit is not None else DaggerVisit()
    visit.validate()
    G = config.gen_length
    rec = _StateRecorder(controller, G, structure)
    context = context or DecodeContext()
    decode(model, prompts, rec, config, seeds=seeds, context=context)
    row_seeds = sample_seeds(seeds, len(prompts), config.seed)
    # one entry per visited (row, step): its generation snapshot; each row's steps in order
    visited: dict[tuple[int, int], torch.Tensor] = {}
    steps_of: list[list[int]] = [[] for _ in prompts]
    for *_, rows, steps, gen in rec.records:
        for r, s, g in zip(rows.tolist(), steps.tolist(), gen):
            visited[(r, s)] = g
            steps_of[r].append(s)
    gen_ = torch.Generator().manual_seed(int(visit.seed))
    chosen: list[tuple[int, int]] = []
    for r, mine in enumerate(steps_of):
        pick = torch.randperm(len(mine), generator=gen_)[:visit.states_per_rollout].tolist()
        chosen += [(r, mine[j]) for j in sorted(pick)]
    finals: dict[tuple[int, int], torch.Tensor] = {}
    ref = build_controller(visit.reference)
    for start in range(0, len(chosen), visit.batch_size):
        part = chosen[start:start + visit.batch_size]
        out = decode(model, [prompts[r] for r, _ in part], ref, config, seeds=row_seeds[[r for r, _ in part]],
                     initial=torch.stack([visited[k] for k in part]), context=context.subset([r for r, _ in part]))
        finals.update({k: out.generated[j].cpu() for j, k in enumerate(part)})
    parts: list[tuple[torch.Tensor, ...]] = []
    for X, rows, pos, x0, step, *_ in rec.records:
        keep = torch.tensor([(r, s) in finals for r, s in zip(rows.tolist(), step.tolist())],
                            dtype=torch.bool)
        if not keep.any():
            continue
        X, rows, pos, x0, step = X[keep], rows[keep], pos[keep], x0[keep], step[keep]
        target = torch.stack([finals[(r, s)][p]
                              for r, s, p in zip(rows.tolist(), step.tolist(), pos.tolist())])
        parts.append((X, (x0 == target).float(), rows, step, pos))
    if not parts:
        return RolloutDataset.empty()
    X, y, rows, step, pos = (torch.cat(t) for t in zip(*parts))
    return RolloutDataset(X=X, y=y, sample=rows, step=step, position=pos)


def build_on_policy_dataset(loaded: Any, task: Any, controller: Any, draw: ExampleDraw,
                            visit: Optional[DaggerVisit] = None, *, config: Optional[DecodeConfig] = None,
                            progress: Any = None) -> RolloutDataset:
    """:func:`collect_on_policy` over ``draw``'s examples of a task (seeds as in evaluation); the batch
    starting at example ``start`` draws its visited steps with ``visit.seed + start``."""
    visit = visit if visit is not None else DaggerVisit()
    visit.validate()
    structure = task_generation_structure(task)
    return over_split(loaded, task,
                      lambda prompts, seeds, cfg, start, context: collect_on_policy(
                          loaded.denoiser, prompts, controller, cfg, seeds=seeds,
                          visit=visit.replace(seed=visit.seed + start), structure=structure, context=context),
                      draw, config=config, progress=progress)
