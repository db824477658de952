"""The controller contract: validated parameters in, one :class:`Decision` per step out.

A controller is built from keyword parameters (see :mod:`adaptive_decoding.framework.core.params`), then the loop calls

* ``reset(state)`` once per decode call; a stateful controller (EMA-adapted η, warm-up switch)
  puts its per-sample tensors into ``state.memory`` (leading dimension B), so that the engine can
  select, reorder or resume rows without knowing what they mean;
* ``decide(features, state) -> Decision`` every step.

Decisions are tensors over the step's **window** (each row's current block, ``[B, W]``, the same
slots as :class:`~adaptive_decoding.framework.engine.features.StepFeatures`): a commit mask ``[B, W]``, optional
candidate counts ``k`` ``[B, W]`` and lookahead depths ``[B]``, optional next block lengths ``[B]``.
No Python loop over samples. What a controller may read about the call beyond the features
(tokenizer, prompts, task meta, end-of-text ids, a reference) is the typed ``state.context``
(:class:`~adaptive_decoding.framework.engine.context.DecodeContext`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch

from adaptive_decoding.framework.core.params import Configurable
from adaptive_decoding.framework.core.registry import Registry
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.features import StepFeatures


@dataclass
class Decision:
    """What to do this step.

    Attributes:
        commit: bool ``[B, W]``, window slots to commit now (a subset of ``features.eligible``).
        tokens: long ``[B, W]`` tokens to write at committed slots (default ``features.x0``).
        k: long ``[B, W]`` candidates to keep at uncertain positions for lookahead (1 = none).
        depth: long ``[B]`` lookahead depth d (0 = commit directly, no rollout).
        next_block_length: long ``[B]`` length of the next semi-autoregressive block.
        remask: bool ``[B, W]``, decided slots to return to the mask (revocable decoding;
            only ``features.revocable`` slots count, within the loop's re-mask bounds).
        edit: bool ``[B, W]``, decided slots whose token is rewritten with ``tokens`` (token-to-token
            editing, LLaDA2.1's T2T; slots not committed this step, counted where the token changes).
        stay: bool ``[B]``, keep the row in its current block for another step although no position
            of it is masked (editing after the masks are gone), within the controller's
            :meth:`Controller.stay_limit` steps a block.
        info: per-sample tensors worth tracing (e.g. the current η), logged with ``trace=True``.
    """

    commit: torch.Tensor
    tokens: Optional[torch.Tensor] = None
    k: Optional[torch.Tensor] = None
    depth: Optional[torch.Tensor] = None
    next_block_length: Optional[torch.Tensor] = None
    remask: Optional[torch.Tensor] = None
    edit: Optional[torch.Tensor] = None
    stay: Optional[torch.Tensor] = None
    info: dict[str, torch.Tensor] = field(default_factory=dict)


def stay_limit_of(controller: Any) -> int:
    """:meth:`Controller.stay_limit` of ``controller``, 0 for a duck-typed one that has none."""
    limit = getattr(controller, "stay_limit", None)
    return int(limit()) if callable(limit) else 0


@dataclass
class DecodeState:
    """What the loop knows beyond the features: configuration, seeds, controller memory and the
    call's typed :class:`~adaptive_decoding.framework.engine.context.DecodeContext`."""

    config: Any
    seeds: torch.Tensor
    mask_token_id: int
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    memory: dict[str, torch.Tensor] = field(default_factory=dict)
    context: DecodeContext = field(default_factory=DecodeContext)

    @property
    def batch_size(self) -> int:
        return int(self.seeds.shape[0])

    def rows(self, index: torch.Tensor) -> "DecodeState":
        """A view of a subset of samples; write it back with :meth:`update_rows`."""
        return DecodeState(
            config=self.config,
            seeds=self.seeds[index],
            mask_token_id=self.mask_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            memory={k: v[index] for k, v in self.memory.items()},
            context=self.context.rows(index),
        )

    def update_rows(self, index: torch.Tensor, sub: "DecodeState") -> None:
        for key, value in sub.memory.items():
            if key in self.memory:
                self.memory[key][index] = value
            else:  # created during decide on a subset: materialise for the whole batch
                full = torch.zeros((self.batch_size, *value.shape[1:]), dtype=value.dtype, device=value.device)
                full[index] = value
                self.memory[key] = full


class Controller(Configurable, ABC):
    """Base class of every controller. Subclasses set ``params`` and implement :meth:`decide`, the
    one abstract method: a class without it cannot be built, and registering it fails at once with
    the name of what is missing (:class:`~adaptive_decoding.framework.core.registry.Registry`).

    ``kind`` is the benchmark family: ``reference``, ``baseline``, ``heuristic``, ``tuned``,
    ``learned`` or ``oracle``.
    """

    kind: ClassVar[str] = "heuristic"
    #: set by controllers whose decisions use randomness (they must draw it from ``state.seeds``)
    stochastic: ClassVar[bool] = False
    #: set by controllers that may return ``Decision.remask`` (revocable decoding)
    revocable: ClassVar[bool] = False
    #: set by controllers that read ``features.verify_prob`` (the loop then runs the verification)
    verifies: ClassVar[bool] = False
    #: set by controllers that may return ``Decision.edit`` (token-to-token editing of decided slots)
    edits: ClassVar[bool] = False
    #: set by controllers that need a reference decode y* (``state.context.reference_tokens``
    #: ``[B, G]``): the name of the parameter holding the reference controller's spec. Callers
    #: (``evaluate``, :func:`adaptive_decoding.framework.engine.reference.reference_tokens`) decode the same prompts,
    #: configuration and seeds with it first; its forwards are not the controller's.
    reference_param: ClassVar[Optional[str]] = None
    #: where this implementation of a published decoder differs from the published code, and why
    #: (and defects found in that code); ``adec list --markdown`` prints it under the parameters
    differences: ClassVar[str] = ""
    #: multi-block decoding by default: the loop's ``block_add_threshold`` when the configuration
    #: leaves it ``None`` (d3LLM's rule sets 0.1); ``None`` = one block at a time
    default_block_add_threshold: ClassVar[Optional[float]] = None

    def reset(self, state: DecodeState) -> None:
        """Called once per decode call, before the first step. Default: validate, no memory."""
        self.validate()

    @abstractmethod
    def decide(self, features: StepFeatures, state: DecodeState) -> Decision:
        """This step's :class:`Decision` for the rows of ``features`` (``[B, W]`` over the window)."""

    def stay_limit(self) -> int:
        """The most steps a row may stay in a block with no masked position (``Decision.stay``); the
        loop enforces it, so decoding always ends. Default 0: a block ends when it is decided."""
        return 0

    def describe(self) -> str:
        """One line for ``adec list``: the first docstring line."""
        return (self.__doc__ or "").strip().splitlines()[0] if self.__doc__ else ""


CONTROLLERS: Registry[Controller] = Registry(
    "controller",
    base=Controller,
    entry_point_group="adaptive_decoding.controllers",
    builtin_modules=("adaptive_decoding.controllers",),
)
