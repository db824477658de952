"""Labels for sets, not positions: which positions are safe to commit *together* at a visited state.

A per-position label ("its prediction equals the token the reference decode ends with") cannot
teach dependence: with exchangeable modes ("New York" / "San Francisco" / "Los Angeles") the
reference picks which word of a slot comes first at random, so the two words of a slot get
labels that look alike, and a policy learns to commit both or neither. A set label asks instead
whether a position can be committed *with the others committed at the same step*:

    walk the step's eligible positions by descending confidence p(x0); keep position i when the
    partial answer (what is already decided, the kept positions, and x0_i at i) can still be
    completed to a correct answer; y_i = 1 ⇔ i was kept.

"Can still be completed" is the task's verifier :meth:`adaptive_decoding.framework.tasks.base.Task.completable` (it
reads the answer: for labelling and bounds only, never at decoding time). The kept set is the
greedy maximal jointly safe set along the confidence ranking: of two dependent uncertain words the
more confident is kept and the other is not (its label says "not in the same step"); independent
positions are all kept. Labels are computed at every state a controller visits (no reference decode
is needed), so DAgger rounds label the policy's own states. A state whose decided tokens already
cannot end correct (an earlier mistake) has no safe set and gives no rows.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from adaptive_decoding.framework.core.options import ExampleDraw
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.learning.dagger import _StateRecorder
from adaptive_decoding.framework.learning.rollouts import RolloutDataset
from adaptive_decoding.framework.models.structure import task_generation_structure

#: ``check(tokens, committed) -> bool | None``: a task's verifier bound to one example
Check = Callable[[Sequence[int], Sequence[bool]], Optional[bool]]


class SetLabelError(ValueError):
    """The task has no verifier (``completable`` returned ``None``), so sets cannot be labelled."""


def greedy_safe_set(check: Check, generation: Sequence[int], mask_id: int,
                    candidates: Sequence[tuple[int, int]]) -> Optional[list[bool]]:
    """Keep flags of ``candidates`` (``(position, token)`` in rank order): a candidate is kept when
    committing it together with the kept ones and everything already decided still passes ``check``.
    ``None`` when the state itself already fails (no set is safe there)."""
    tokens = [int(t) for t in generation]
    committed = [t != mask_id for t in tokens]
    start = check(tokens, committed)
    if start is None:
        raise SetLabelError("the task cannot tell whether a partial answer can still end correct "
                            "(Task.completable returned None); set labels need a task that implements it")
    if not start:
        return None
    together = list(tokens), list(committed)
    for pos, tok in candidates:
        together[0][pos], together[1][pos] = int(tok), True
    if check(*together):  # the whole ranking is jointly safe: one check instead of one per candidate
        return [True] * len(candidates)
    keep = []
    for pos, tok in candidates:
        old = tokens[pos]
        tokens[pos], committed[pos] = int(tok), True
        ok = bool(check(tokens, committed))
        if not ok:
            tokens[pos], committed[pos] = old, False
        keep.append(ok)
    return keep


def _label_step(record: tuple, checks: Sequence[Check], mask_id: int) -> Optional[tuple[torch.Tensor, ...]]:
    """The set-labelled rows of one recorded step (every row of the step), or ``None`` if none."""
    X, rows, pos, x0, step, rows_all, _, gen = record
    keep_rows = torch.zeros(len(rows), dtype=torch.bool)
    y = torch.zeros(len(rows))
    for r, g in zip(rows_all.tolist(), gen):
        mine = (rows == r).nonzero(as_tuple=True)[0]
        if not len(mine):
            continue
        order = mine[torch.argsort(X[mine, 0], descending=True, stable=True)]  # column 0: confidence
        flags = greedy_safe_set(checks[r], g.tolist(), mask_id,
                                [(int(pos[i]), int(x0[i])) for i in order])
        if flags is None:
            continue
        keep_rows[order] = True
        y[order] = torch.tensor(flags, dtype=torch.float)
    if not keep_rows.any():
        return None
    return X[keep_rows], y[keep_rows], rows[keep_rows], step[keep_rows], pos[keep_rows]


@torch.no_grad()
def collect_set_labelled(model: Any, prompts: Sequence[Sequence[int]], controller: Any, config: DecodeConfig,
                         checks: Sequence[Check], *, seeds: Any = None,
                         structure: Optional[dict] = None, context: Optional[DecodeContext] = None) -> RolloutDataset:
    """Decode ``prompts`` with ``controller`` (and the call's decode ``context``,
    :meth:`DecodeContext.for_batch`) and set-label every state it visits (module docstring);
    ``checks[r]`` is prompt ``r``'s verifier; ``structure`` the generation's declared one (peer features)."""
    rec = _StateRecorder(controller, config.gen_length, structure)
    decode(model, prompts, rec, config, seeds=seeds, context=context)
    parts = [p for p in (_label_step(r, checks, model.mask_token_id) for r in rec.records) if p is not None]
    if not parts:
        return RolloutDataset.empty()
    X, y, rows, step, pos = (torch.cat(t) for t in zip(*parts))
    return RolloutDataset(X=X, y=y, sample=rows, step=step, position=pos)


def build_set_dataset(loaded: Any, task: Any, controller: Any, draw: ExampleDraw, *,
                      config: Optional[DecodeConfig] = None, progress: Any = None) -> RolloutDataset:
    """:func:`collect_set_labelled` over ``draw``'s examples of a task
    (:class:`~adaptive_decoding.framework.core.options.ExampleDraw`: ``n`` of a split, ``batch_size`` at a time; seeds as
    in evaluation); ``progress`` (a tqdm bar) counts prompts."""
    from adaptive_decoding.framework.engine.evaluate import item_seeds

    draw.validate()
    config = config or DecodeConfig(gen_length=task.gen_length, block_length=task.default_block_length)
    examples = task.examples(draw.split, draw.n, seed=draw.data_seed)
    structure = task_generation_structure(task)
    parts = []
    for start in range(0, len(examples), draw.batch_size):
        chunk = examples[start:start + draw.batch_size]
        checks = [lambda t, c, ex=ex: task.completable(ex, t, c) for ex in chunk]
        parts.append(collect_set_labelled(loaded.denoiser, [loaded.tokenizer.encode(ex.prompt) for ex in chunk],
                                          controller, config, checks,
                                          seeds=item_seeds([ex.id for ex in chunk], config.seed),
                                          structure=structure,
                                          context=DecodeContext.for_batch(loaded.tokenizer, chunk, task=task,
                                                                          gen_length=config.gen_length)))
        if progress is not None:
            progress.update(len(chunk))
    return RolloutDataset.concat(parts)
