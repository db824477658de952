"""The typed records of the decoding loop (:func:`framework.engine.loop.decode`): what a call keeps
from step to step (:class:`DecodeRun` with its :class:`Canvas`, :class:`Blocks` and
:class:`Counters`) and what one step hands from stage to stage (:class:`Window` ->
:class:`StepForward` -> :class:`StepChoice` -> :class:`StepOutcome`), stages in
:mod:`framework.engine.step`.

Shapes: ``B`` samples in the call, ``L`` canvas columns, ``G`` generated positions, ``b`` rows
decided this step (the unfinished ones), ``W`` the window (the widest current block of those rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from framework.engine.config import DecodeConfig
from framework.engine.controller import Decision, DecodeState
from framework.engine.denoise import CacheSession


@dataclass
class Canvas:
    """The call's canvas and what is fixed about its layout.

    Attributes:
        x: long ``[B, L]``, ``[prompt_b, generation, PAD …]`` (the mask id where undecided).
        attn: long ``[B, L]``, the attention mask (0 over the right padding).
        gen_start: long ``[B]``, each row's first generated column.
        gen_index: long ``[B, G]``, each row's generated columns.
        rel: long ``[B, L]``, each column's index in the generation (negative in the prompt).
        in_gen: bool ``[B, L]``, the generated columns.
        lengths: long ``[B]``, real tokens per row (prompt + G).
        revocable: bool ``[B, L]``, positions this decode committed (revocable decoding may re-mask them).
        remask_count: long ``[B, L]``, how often each position was re-masked.
    """

    x: torch.Tensor
    attn: torch.Tensor
    gen_start: torch.Tensor
    gen_index: torch.Tensor
    rel: torch.Tensor
    in_gen: torch.Tensor
    lengths: torch.Tensor
    revocable: torch.Tensor
    remask_count: torch.Tensor


@dataclass
class Blocks:
    """Each row's current semi-autoregressive block ``[start, end)`` of the generation, ``[B]`` each.

    ``next_length`` is the length of the row's next block (the controller's ``next_block_length``),
    ``masked_at_start`` the masked positions its current block had when it began.
    """

    start: torch.Tensor
    end: torch.Tensor
    next_length: torch.Tensor
    masked_at_start: torch.Tensor


@dataclass
class Counters:
    """Per-sample counters, long ``[B]`` each (:class:`~framework.engine.loop.DecodeResult` reports them).

    ``block_step`` counts steps in the current block, ``block_index`` the blocks begun, ``forced``
    the steps where the loop added a token, ``lookahead_nfe`` the rollout forwards (part of ``nfe``),
    ``fallbacks`` the lookahead steps that fell back to the decision, ``escalations`` the lookahead
    steps whose winner was an escalation candidate.
    """

    nfe: torch.Tensor
    steps: torch.Tensor
    block_step: torch.Tensor
    block_index: torch.Tensor
    forced: torch.Tensor
    lookahead_nfe: torch.Tensor
    remasks: torch.Tensor
    fallbacks: torch.Tensor
    escalations: torch.Tensor

    @classmethod
    def zeros(cls, batch: int, device: torch.device) -> "Counters":
        return cls(*(torch.zeros(batch, dtype=torch.long, device=device) for _ in range(9)))


#: one row's window logits a lookahead already computed: (its canvas [L], its window columns, logits [W, V])
PendingForward = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class DecodeRun:
    """Everything one :func:`~framework.engine.loop.decode` call keeps from step to step."""

    model: Any
    controller: Any
    config: DecodeConfig
    lookahead: Any
    session: CacheSession
    state: DecodeState
    canvas: Canvas
    blocks: Blocks
    counters: Counters
    mask_id: int
    eos_id: Optional[int]
    #: a controller that ``verifies`` gets WINO's shadow block in the step's own forward
    shadow_step: bool
    verifies: bool
    trace: bool
    #: canvas row -> a forward the lookahead ran on exactly the canvas the row decodes next
    pending: dict[int, PendingForward] = field(default_factory=dict)
    forward_seconds: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return self.canvas.x.device


@dataclass
class Window:
    """The rows decided this step and their window: each row's current block as ``[b, W]`` canvas columns.

    Attributes:
        rows: long ``[b]``, the unfinished rows (indices into the call).
        full: every row of the call is decided (then ``sub`` is the identity, no copies).
        columns: long ``[b, W]``, each slot's canvas column (pad slots repeat the block's last column).
        rel: long ``[b, W]``, each slot's index in the generation.
        valid: bool ``[b, W]``, slots inside the row's block.
        length: long ``[b]``, the row's block length.
        canvas: long ``[b, L]``, the rows' canvas (the call's own tensor when ``full``, else a copy).
        tokens: long ``[b, W]``, the window's tokens (the mask id where undecided).
        eligible: bool ``[b, W]``, masked slots inside the block (what may be committed).
        revocable: bool ``[b, W]``, decided slots this decode committed.
        n_masked: long ``[b]``, masked generation positions of the row, inside the window or not.
    """

    rows: torch.Tensor
    full: bool
    columns: torch.Tensor
    rel: torch.Tensor
    valid: torch.Tensor
    length: torch.Tensor
    canvas: torch.Tensor
    tokens: torch.Tensor
    eligible: torch.Tensor
    revocable: torch.Tensor
    n_masked: torch.Tensor

    def sub(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s rows of this step (``t`` itself when every row is decided)."""
        return t if self.full else t[self.rows]

    @property
    def width(self) -> int:
        return int(self.length.max())


@dataclass
class StepForward:
    """The step's forward: window logits ``[b, W, V]``, the shadow block's (or probes') logits at the
    revocable slots when the controller verifies, and which rows reused a lookahead's forward ``[b]``."""

    logits: torch.Tensor
    shadow: Optional[torch.Tensor]
    reused: torch.Tensor


@dataclass
class StepChoice:
    """What the step will write: the controller's decision, refined by the lookahead.

    ``tokens`` long ``[b, W]`` and ``commit`` bool ``[b, W]`` (within ``eligible``); ``state`` the
    decided rows' :class:`DecodeState`; ``adopted`` the rollout steps a lookahead committed on top of
    this one (``Lookahead.advance``; 0 for none, else a count or long ``[b]``).
    """

    decision: Decision
    state: DecodeState
    tokens: torch.Tensor
    commit: torch.Tensor
    adopted: Any = 0


@dataclass
class StepOutcome:
    """What the step wrote: the committed slots ``(row, slot)`` of the window and the re-masked
    ``(row, slot)`` with their canvas columns (``None`` without a ``Decision.remask``)."""

    commit: torch.Tensor
    commit_rows: torch.Tensor
    commit_slots: torch.Tensor
    remask_rows: Optional[torch.Tensor] = None
    remask_columns: Optional[torch.Tensor] = None
