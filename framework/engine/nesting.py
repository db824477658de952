"""The one way to build a controller from others: :class:`Composite` (part of the controller contract;
``from framework import Composite, Wrapper, ControllerSpec, wrapped_params``).

A controller that contains others declares each of them as a
:class:`~adaptive_decoding.framework.core.params.ControllerSpec` parameter and subclasses :class:`Composite`. At
validation every nested controller is built into a :class:`Child` (keyed by its slot: ``base``,
``0``, ``margin``, ``inner``), so the same spec forms (``NAME``, ``tuned:PATH``,
``{name: NAME, params: {...}}``) and the same dotted tuning names (``inner.threshold``,
``base.eta``, ``controllers.0.eta``) work for every one of them.

**One memory rule.** A child keeps its per-sample state in ``state.memory`` under the prefix
``"<owner>/<slot>/"`` (e.g. ``hybrid/margin/margin_topk.eta``, ``verified/inner/...``): it sees
only its own keys, without the prefix, so any controller can be a child without knowing it, two
children of the same kind never share a key, and the owner's own keys never meet a child's.

Shapes of composite (same mechanism, same memory rule):

* several children combined (``confidence_ladder``, ``switch``, ``hybrid``, ``compose``): the
  composite is ``stochastic`` when a child is; its other flags are its own class's;
* :class:`Wrapper`, exactly one child ``inner`` (``inner`` + ``inner_params``, :func:`wrapped_params`)
  whose decision the wrapper post-processes (``number_guard``, ``compliance_entropy``,
  ``verified``): it also passes the child's flags through (``stochastic``, ``revocable``,
  ``verifies``, :meth:`~adaptive_decoding.framework.engine.controller.Controller.stay_limit`) unless its class sets them.

Three relations that are *not* nesting (nothing is a child, no memory is shared or prefixed):

* a **reference decode** (``Controller.reference_param``, the ``oracle``): the named controller
  decodes the same prompts *before* the call (:mod:`adaptive_decoding.framework.engine.reference`), and only its
  final tokens reach the controller, as ``state.context.reference_tokens``;
* a **lookahead rollout** (``--lookahead rollout=controller``): the loop asks the step's own
  controller again on a rollout's canvas, on a copy of its memory that is thrown away;
* the **jobs' guard** (:func:`adaptive_decoding.framework.jobs.guards.guarded_decode`): wraps the decode call and
  names which part failed; it never stands in for a controller.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from adaptive_decoding.framework.core.params import (
    ControllerSpec,
    MappingParam,
    NestedController,
    Param,
    ParameterError,
)
from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.engine.controller import Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import StepFeatures


def build_nested(owner: str, nested: NestedController) -> Controller:
    """Build and validate one nested controller; an error names ``owner.slot`` and the child's own."""
    try:
        return build_controller(nested.name, **nested.params)
    except (ParameterError, UnknownNameError, FileNotFoundError) as exc:
        raise ParameterError(f"{owner}.{nested.slot}: {exc}") from None


def wrapped_params(what: str = "the wrapped controller") -> dict[str, Param]:
    """A wrapper's ``inner`` (a controller spec) and ``inner_params`` (more of its parameters)."""
    return {
        "inner": ControllerSpec(params_in="inner_params",
                                doc=f"{what}: a name, 'tuned:PATH' or {{name: NAME, params: {{...}}}}"),
        "inner_params": MappingParam(nullable=True, doc=f"parameters of {what}"),
    }


# ---------------------------------------------------------------------- composites
class Child:
    """A sub-controller with its own namespace ``prefix`` in ``state.memory``."""

    def __init__(self, controller: Controller, prefix: str) -> None:
        self.controller = controller
        self.prefix = prefix

    def _view(self, state: DecodeState) -> DecodeState:
        n = len(self.prefix)
        mem = {k[n:]: v for k, v in state.memory.items() if k.startswith(self.prefix)}
        return dataclasses.replace(state, memory=mem)

    def _merge(self, state: DecodeState, view: DecodeState) -> None:
        for key, value in view.memory.items():
            state.memory[self.prefix + key] = value

    def reset(self, state: DecodeState) -> None:
        view = self._view(state)
        self.controller.reset(view)
        self._merge(state, view)

    def decide(self, f: StepFeatures, state: DecodeState, rows: Optional[torch.Tensor] = None) -> Decision:
        """The child's decision for all rows, or for ``rows`` only (its state advances only there)."""
        view = self._view(state)
        if rows is None:
            d = self.controller.decide(f, view)
        else:
            sub = view.rows(rows)
            d = self.controller.decide(f.rows(rows), sub)
            view.update_rows(rows, sub)
        self._merge(state, view)
        return d


class Composite(Controller):
    """Base of every controller built from others: one :class:`Child` per nested controller of its
    :class:`ControllerSpec` parameters, keyed by slot (``base``, ``0``, ``margin``, ``inner``), each
    with its memory under ``"<owner>/<slot>/"``; a null spec is an empty slot. Subclasses implement
    :meth:`decide` by calling their children's ``decide``."""

    def check_combination(self) -> None:
        owner = self.display_name()
        self._children = {n.slot: Child(build_nested(owner, n), f"{owner}/{n.slot}/")
                          for n in self.nested_controllers(self.get_params())}

    def children(self) -> dict[str, Child]:
        """The children by slot, in declaration order (built by validating, if not yet built)."""
        if "_children" not in self.__dict__:
            self.validate()
        return self._children

    @property
    def stochastic(self) -> bool:  # type: ignore[override]
        return any(bool(getattr(c.controller, "stochastic", False)) for c in self.children().values())

    def reset(self, state: DecodeState) -> None:
        super().reset(state)  # validates, which rebuilds fresh children
        for child in self._children.values():
            child.reset(state)


# ---------------------------------------------------------------------- wrappers
class Wrapper(Composite):
    """A :class:`Composite` with exactly one child, ``inner`` (its ControllerSpec, with
    ``inner_params`` merged), whose decisions the wrapper post-processes; the child's memory lives
    under ``"<owner>/inner/"`` like any child's, and its flags pass through."""

    def check_combination(self) -> None:
        nested = self.nested_controllers(self.get_params())
        if len(nested) != 1:
            raise TypeError(f"{type(self).__qualname__}: a Wrapper declares exactly one ControllerSpec parameter "
                            f"(found {len(nested)}); use wrapped_params()")
        super().check_combination()

    def wrapped(self) -> Child:
        """The one child (call its ``decide``: its memory is kept under the wrapper's prefix)."""
        return next(iter(self.children().values()))

    def inner_controller(self) -> Controller:
        """The wrapped controller itself (for its parameters and flags)."""
        return self.wrapped().controller

    @property
    def revocable(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner_controller(), "revocable", False))

    @property
    def verifies(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.inner_controller(), "verifies", False))

    def stay_limit(self) -> int:
        """The inner controller's: a wrapper keeps its blocks open as long as the inner one asks."""
        return int(self.inner_controller().stay_limit())
