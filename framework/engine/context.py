"""The typed decoding context: what a controller, the lookahead or a scorer may read about a call
beyond the step's features.

Every field is declared here, so a plugin never fishes in an untyped dict. Tensor fields are
row-aligned with the :class:`~framework.engine.controller.DecodeState` that carries the context
(``[b, …]`` for the rows being decided); :meth:`DecodeContext.rows` selects them together with the
state's rows. List fields (``prompt_text``, ``meta``, ``prompt_ids``) describe the whole call and are
indexed by ``sample_index`` (the row of each sample in the call).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Optional, Sequence

import torch


@dataclass
class DecodeContext:
    """Read-only facts about a decode call, plus the two per-step views the loop refreshes.

    Attributes:
        tokenizer: the model's tokenizer (text scorers, digit guards), or ``None``.
        prompt_ids: the call's prompts as token-id lists (one per sample of the call).
        prompt_text: the call's prompts as text, or ``None``.
        meta: one task ``meta`` dict per sample of the call (rule verifiers), or ``None``.
        eos_token_ids: every id that ends a text (the model's EOS and, for chat models, end-of-turn).
        span_mask: bool ``[b, G]``, generation positions the task marks (``number_guard``'s ``rule=meta``).
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
