"""The oracle controller: the upper bound on tokens per forward at no loss.

Given the final tokens y* of a reference decode of the same prompts (one-token-per-step
``sequential`` by default), each step commits exactly the eligible positions whose current
prediction already equals the reference: ``commit = eligible ∧ (x0 = y*)``. When no eligible
position matches, it commits the most confident one with its reference token (a "forced" step),
so every step commits at least one token and the output always equals the reference output.

Where y* comes from: the caller. The oracle declares ``reference_param = "reference"``
(:attr:`~adaptive_decoding.framework.engine.controller.Controller.reference_param`), so a caller decodes the same
prompts, configuration and seeds with the reference controller first and passes its generation as
``DecodeContext.reference_tokens`` (long ``[B, G]``): ``evaluate`` does,
:func:`adaptive_decoding.framework.engine.reference.decode_with_reference` does, and :func:`oracle_decode` does both
steps and returns both results; over a task split it is ``evaluate`` like any controller. Tokens bound with
:meth:`Oracle.bind_reference` serve when the context has none. Without either, ``reset`` fails with
:class:`MissingReferenceError`. The reference's forward passes are not counted in the oracle's NFE,
which is the cost *if* the final tokens were known. At ``reset`` the reference is copied into
``state.memory`` (per sample), so the loop's row subsetting carries it along.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.selection import select_topk

MEMORY_KEY = "oracle.reference"


class MissingReferenceError(ParameterError):
    """The oracle was asked to decode without the reference's final tokens."""


@CONTROLLERS.register("oracle")
class Oracle(Controller):
    """Oracle: commit exactly the positions whose prediction equals the reference's final token."""

    kind = "oracle"
    params = {"reference": Param(str, doc="controller whose output is the target (one token per step)")}
    reference_param = "reference"

    def __init__(self, reference: str = "sequential") -> None:
        self.reference = reference

    def check_combination(self) -> None:
        if self.reference == "oracle":
            raise ParameterError("oracle.reference='oracle' is circular; allowed: any other controller")
        CONTROLLERS.get(self.reference)  # unknown names list the known ones

    def bind_reference(self, tokens: Optional[torch.Tensor]) -> "Oracle":
        """Set (or clear, with ``None``) the reference tokens ``[B, G]`` of the next decode call."""
        self._bound = tokens
        return self

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        ref = state.context.reference_tokens
        if ref is None:
            ref = getattr(self, "_bound", None)
        G = state.config.gen_length
        if ref is None:
            raise MissingReferenceError(
                f"oracle needs the final tokens y* [batch, gen_length] of a reference decode "
                f"(reference={self.reference!r}) and was given none; decode the same prompts, config and seeds "
                f"with {self.reference!r} first and pass decode(..., context=DecodeContext(reference_tokens="
                f"result.generated)), or let adaptive_decoding.framework.engine.reference.decode_with_reference(model, prompts, "
                f"oracle, config), evaluate(...), adaptive_decoding.controllers.oracle.oracle_decode(...) "
                f"run it for you")
        ref = torch.as_tensor(ref, dtype=torch.long, device=state.seeds.device)
        if tuple(ref.shape) != (state.batch_size, G):
            raise MissingReferenceError(f"oracle reference tokens have shape {tuple(ref.shape)}; this "
                                        f"decode needs [batch, gen_length] = [{state.batch_size}, {G}]")
        state.memory[MEMORY_KEY] = ref.clone()

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        ref = state.memory[MEMORY_KEY]
        G = ref.shape[1]
        in_gen = (f.position >= 0) & (f.position < G)
        target = torch.where(in_gen, ref.gather(1, f.position.clamp(0, G - 1)), f.x0)
        match = f.eligible & in_gen & (f.x0 == target)
        forced = f.eligible.any(1) & ~match.any(1)
        commit = match | (select_topk(f.confidence, f.eligible, 1) & forced[:, None])
        return Decision(commit=commit, tokens=torch.where(commit, target, f.x0), info={"forced": forced.long()})


@torch.no_grad()
def oracle_decode(model: Any, prompts: Sequence[Sequence[int]], config: Any, seeds: Any = None,
                  reference: str = "sequential", context: Optional[DecodeContext] = None) -> tuple[Any, Any]:
    """Decode ``prompts`` with ``reference`` and then with the oracle, both with ``context`` (the
    batch's :meth:`DecodeContext.for_batch`); returns (oracle, reference)
    :class:`~adaptive_decoding.framework.engine.loop.DecodeResult` s. ``trace`` info ``forced`` counts forced steps."""
    context = context or DecodeContext()
    ref = decode(model, prompts, build_controller(reference), config, seeds=seeds, context=context)
    oracle = build_controller("oracle", reference=reference)
    out = decode(model, prompts, oracle, config, seeds=seeds, trace=True,
                 context=replace(context, reference_tokens=ref.generated))
    return out, ref
