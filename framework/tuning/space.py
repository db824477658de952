"""A controller's declared search space as Optuna suggestions.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from framework.core.params import Param, ParameterError
from framework.engine.controller import Controller


# ---------------------------------------------------------------------- search space
def inner_space(cls: type[Controller], fixed: Optional[dict[str, Any]] = None) -> dict[str, Param]:
    """A wrapper's (``inner`` + ``inner_params``) inner controller's search space, as dotted names
    (``inner_params.threshold``), minus the inner parameters ``fixed`` sets; empty for other controllers."""
    if "inner" not in cls.params or "inner_params" not in cls.params:
        return {}
    from framework.engine.controller import CONTROLLERS

    fixed = fixed or {}
    name = fixed.get("inner", cls.default("inner"))
    if not isinstance(name, str) or name not in CONTROLLERS or str(name).startswith("tuned:"):
        return {}  # an unknown inner controller fails with its own message when the wrapper is built
    held = fixed.get("inner_params") or {}
    return {f"inner_params.{k}": p for k, p in CONTROLLERS.get(name).search_space().items() if k not in held}


def tuned_space(cls: type[Controller], fixed: Optional[dict[str, Any]] = None) -> dict[str, Param]:
    """``cls.search_space()`` minus the fixed parameters, with a wrapper's inner space (dotted names);
    an empty space is an error."""
    space = {k: p for k, p in cls.search_space().items() if k not in (fixed or {})}
    space.update(inner_space(cls, fixed))
    if not space:
        declared = ", ".join(cls.search_space()) or "none"
        raise ParameterError(
            f"controller {cls.display_name()!r} has nothing to tune (parameters with tune=...: "
            f"{declared}; fixed by --set: {', '.join(fixed or {}) or 'none'})"
        )
    return space


def is_range(spec: Param) -> bool:
    """A numeric Param whose ``tune`` is ``(low, high)``; anything else is a set of choices."""
    t = spec.tune
    return (spec.kind in (int, float) and spec.choices is None and t is not None and len(t) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in t))


def suggest(trial: Any, space: dict[str, Param]) -> dict[str, Any]:
    """Sample one point of ``space`` with the trial's ``suggest_*`` calls."""
    out: dict[str, Any] = {}
    for name, spec in space.items():
        if is_range(spec):
            lo, hi = spec.tune  # type: ignore[misc]
            if spec.kind is int:
                out[name] = trial.suggest_int(name, int(lo), int(hi), log=spec.log)
            else:
                out[name] = trial.suggest_float(name, float(lo), float(hi), log=spec.log)
        else:
            out[name] = trial.suggest_categorical(name, list(spec.tune))  # type: ignore[arg-type]
    return out


def default_point(cls: type[Controller], space: dict[str, Param]) -> Optional[dict[str, Any]]:
    """The constructor defaults of the tuned parameters, if they all lie inside the space."""
    sig = inspect.signature(cls.__init__)
    point: dict[str, Any] = {}
    for name, spec in space.items():
        if "." in name:  # an inner controller's parameter: no default of the wrapper's own
            return None
        p = sig.parameters.get(name)
        if p is None or p.default is inspect.Parameter.empty:
            return None
        v = p.default
        if is_range(spec):
            lo, hi = spec.tune  # type: ignore[misc]
            if v is None or isinstance(v, bool) or not lo <= v <= hi:
                return None
        elif v not in spec.tune:  # type: ignore[operator]
            return None
        point[name] = v
    return point
