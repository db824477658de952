"""The typed decoding context: what a controller, the lookahead or a scorer may read about a call
beyond the step's features.

Every field is declared here, so a plugin never fishes in an untyped dict. Tensor fields are
row-aligned with the :class:`~adaptive_decoding.framework.engine.controller.DecodeState` that carries the context
(``[b, …]`` for the rows being decided); :meth:`DecodeContext.rows` selects them together with the
state's rows. List fields (``prompt_text``, ``meta``, ``prompt_ids``) describe the whole call and are
indexed by ``sample_index`` (the row of each sample in the call).

Every workflow that decodes (``adec decode``, ``evaluate``, batch jobs, the lookahead sweep, the
oracle's reference decode, lm-eval's model class, tuning, the learned-policy pipelines) builds its
context with :meth:`DecodeContext.for_batch`; a controller that reads a field the call did not give
raises :class:`MissingContextError` (:meth:`DecodeContext.require`) instead of acting as another decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import ParameterError


class MissingContextError(ParameterError):
    """A controller needs a field of the decode context that the decode call did not give."""


@dataclass
class DecodeContext:
    """Read-only facts about a decode call, plus the two per-step views the loop refreshes.

    Attributes:
        tokenizer: the model's tokenizer (text scorers, digit guards), or ``None``.
        prompt_ids: the call's prompts as token-id lists (one per sample of the call).
        prompt_text: the call's prompts as text, or ``None``.
        meta: one task ``meta`` dict per sample of the call (rule verifiers), or ``None``.
        eos_token_ids: every id that ends a text (the model's EOS and, for chat models, end-of-turn).
        span_mask: bool ``[b, G]``, generation positions the task marks (``Task.span_mask``; ``number_guard``'s
            ``rule=meta``), or ``None`` where the task marks none.
        reference_tokens: long ``[b, G]``, a reference generation y* (the ``oracle`` controller's).
        sample_index: long ``[b]``, the row of each decided sample in the call.
        canvas: long ``[b, W]``, this step's window tokens (the mask id where undecided); set by the loop.
        generation: long ``[b, G]``, this step's whole generation; set by the loop (DAgger's recorder).
    """

    tokenizer: Any = None
    prompt_ids: Optional[Sequence[Sequence[int]]] = None
    prompt_text: Optional[Sequence[str]] = None
    meta: Optional[Sequence[dict]] = None
    eos_token_ids: tuple[int, ...] = ()
    span_mask: Optional[torch.Tensor] = None
    reference_tokens: Optional[torch.Tensor] = None
    sample_index: Optional[torch.Tensor] = None
    canvas: Optional[torch.Tensor] = None
    generation: Optional[torch.Tensor] = None

    @classmethod
    def for_batch(cls, tokenizer: Any, items: Sequence[Any], *, task: Any = None, gen_length: Optional[int] = None,
                  reference_tokens: Optional[torch.Tensor] = None) -> "DecodeContext":
        """The context of one decode call over ``items``, one per prompt of the call.

        Args:
            tokenizer: the model's tokenizer.
            items: prompt texts, or task examples / job items (``.prompt`` and ``.meta``).
            task: the task the items belong to, if any: each ``meta`` gets ``"task"`` (its name) and
                ``span_mask`` comes from ``task.span_mask(item, gen_length)``.
            gen_length: the call's G (default the task's), the width of ``span_mask``.
            reference_tokens: a reference generation y* ``[B, G]`` (the oracle's), if any.
        """
        texts = [item if isinstance(item, str) else str(item.prompt) for item in items]
        metas = [item_meta(item, task) for item in items]
        return cls(tokenizer=tokenizer, prompt_text=texts, meta=metas,
                   span_mask=task_span_mask(task, items, gen_length), reference_tokens=reference_tokens)

    def require(self, owner: str, name: str, why: str = "") -> Any:
        """The field ``name``; raises :class:`MissingContextError` naming ``owner`` when it is ``None``."""
        value = getattr(self, name)
        if value is None:
            raise MissingContextError(
                f"{owner} needs the {name} in the decode context{f' ({why})' if why else ''} and the call gave "
                f"none; call decode(..., context=DecodeContext.for_batch(tokenizer, prompts_or_examples, "
                f"task=...)) (evaluate, adec decode/bench/run/tune/generate do)")
        return value

    def subset(self, rows: Sequence[int]) -> "DecodeContext":
        """The context of a new call over the prompts ``rows`` of this one (lists and row-aligned
        tensors picked in that order; the loop's per-call fields left for that call to fill)."""
        lists = {name: None if getattr(self, name) is None else [getattr(self, name)[r] for r in rows]
                 for name in ("prompt_ids", "prompt_text", "meta")}
        index = torch.as_tensor(list(rows), dtype=torch.long)
        tensors = {name: None if getattr(self, name) is None else getattr(self, name)[index.to(getattr(self, name).device)]
                   for name in ("span_mask", "reference_tokens")}
        return replace(self, **lists, **tensors, sample_index=None, canvas=None, generation=None)

    def rows(self, index: torch.Tensor) -> "DecodeContext":
        """The context of a subset of rows: every tensor field selected by ``index``, lists kept whole."""
        picked = {f.name: getattr(self, f.name)[index] for f in fields(self)
                  if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **picked)

    def sample_rows(self, values: Optional[Sequence[Any]]) -> Optional[list[Any]]:
        """A call-wide list (``prompt_text``, ``meta``, ``prompt_ids``) in this context's row order."""
        if values is None:
            return None
        if self.sample_index is None:
            return list(values)
        return [values[int(i)] for i in self.sample_index.tolist()]


def item_meta(item: Any, task: Any = None) -> dict:
    """A copy of ``item``'s task meta (``{}`` for a prompt text), with ``"task"`` (the task's name) when a task is given."""
    meta = {} if isinstance(item, str) else dict(getattr(item, "meta", None) or {})
    if task is not None:
        meta.setdefault("task", getattr(task, "name", str(task)))
    return meta


def task_span_mask(task: Any, items: Sequence[Any], gen_length: Optional[int]) -> Optional[torch.Tensor]:
    """Bool ``[B, G]``: the positions ``task.span_mask`` marks for each item; ``None`` when the task marks none."""
    if task is None or not hasattr(task, "span_mask"):
        return None
    g = int(gen_length if gen_length is not None else task.gen_length)
    rows = [None if isinstance(item, str) else task.span_mask(item, g) for item in items]
    if all(r is None for r in rows):
        return None
    out = torch.zeros(len(items), g, dtype=torch.bool)
    for b, row in enumerate(rows):
        if row is not None:
            marks = torch.as_tensor(list(row)[:g], dtype=torch.bool)
            out[b, : marks.numel()] = marks
    return out
