"""A controller's declared search space as Optuna suggestions.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Optional

from adaptive_decoding.framework.core.params import ControllerSpec, Param, ParameterError, with_value
from adaptive_decoding.framework.engine.controller import Controller


# ---------------------------------------------------------------------- search space
def _registered(name: str) -> Optional[type[Controller]]:
    from adaptive_decoding.framework.engine.controller import CONTROLLERS

    if not isinstance(name, str) or name.startswith("tuned:") or name not in CONTROLLERS:
        return None  # a tuned file's parameters are its own; an unknown name fails when the owner is built
    return CONTROLLERS.get(name)


def inner_space(cls: type[Controller], fixed: Optional[dict[str, Any]] = None) -> dict[str, Param]:
    """The search spaces of the controllers nested in ``cls`` (its :class:`ControllerSpec`
    parameters, whatever their names), as dotted names from ``cls``: ``inner.threshold``,
    ``base.eta``, ``controllers.0.eta``, ``depth.base.eta``; parameters the nested spec (or
    ``fixed``) already sets are held. Empty for a controller with nothing nested."""
    out: dict[str, Param] = {}
    for nested in cls.nested_controllers(fixed or {}):
        child = _registered(nested.name)
        if child is not None:
            own = {k: p for k, p in child.search_space().items() if k not in nested.params}
            own.update(inner_space(child, nested.params))
            out.update({f"{nested.path}.{k}": p for k, p in own.items()})
    return out


def with_point(cls: type[Controller], params: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every ``name: value`` of ``point`` set; a dotted name reaches into a nested
    controller (``inner.threshold``, ``controllers.0.eta``) and keeps its stored form, or into a
    mapping parameter (``inner_params.threshold``)."""
    for key, value in point.items():
        params = _with_path(cls, params, key, value)
    return params


def _with_path(cls: Optional[type[Controller]], params: dict, key: str, value: Any) -> dict:
    head, _, rest = key.partition(".")
    spec = cls.params.get(head) if cls is not None else None
    if not rest or not isinstance(spec, ControllerSpec):
        return with_value(params, key, value)
    current = params[head] if head in params else cls.default(head)  # type: ignore[union-attr]
    return spec.with_nested_value(head, current, params, rest, value,
                                  lambda name, inner, path, v: _with_path(_registered(name), inner, path, v))


def tuned_space(cls: type[Controller], fixed: Optional[dict[str, Any]] = None,
                ranges: Optional[dict[str, str]] = None) -> dict[str, Param]:
    """``cls.search_space()`` minus the fixed parameters, with its nested controllers' spaces (dotted
    names) and the user ``ranges`` (:func:`with_ranges`); an empty space is an error."""
    space = {k: p for k, p in cls.search_space().items() if k not in (fixed or {})}
    space.update(inner_space(cls, fixed))
    space = with_ranges(cls, space, ranges)
    if not space:
        declared = ", ".join(cls.search_space()) or "none"
        raise ParameterError(
            f"controller {cls.display_name()!r} has nothing to tune (parameters with tune=...: "
            f"{declared}; fixed by --set: {', '.join(fixed or {}) or 'none'})"
        )
    return space


def with_ranges(cls: type[Controller], space: dict[str, Param], ranges: Optional[dict[str, str]]) -> dict[str, Param]:
    """``space`` with user ranges (``{"eta": "0.9:0.999"}``, ``adec tune --range``) replacing the
    declared ones: each end must pass the parameter's own bounds, ints stay ints, a log-scale space
    stays log. A name outside the space (a dotted one too) fails, listing the tunable names."""
    out = dict(space)
    for name, text in (ranges or {}).items():
        if name not in space:
            raise ParameterError(f"--range {name}={text}: {name!r} is not tuned for {cls.display_name()}; "
                                 f"tunable: {', '.join(space) or '(none)'}")
        spec = space[name]
        low, sep, high = str(text).partition(":")
        if not sep or spec.kind not in (int, float) or spec.choices is not None:
            raise ParameterError(f"--range {name}={text}: expected LOW:HIGH for a numeric parameter "
                                 f"({name} is {spec.allowed()})")
        try:
            lo, hi = spec.check("", name, low.strip()), spec.check("", name, high.strip())
        except ParameterError:
            raise ParameterError(f"{cls.display_name()}.{name} range {text} is outside the parameter's bounds "
                                 f"{_bounds(spec)}") from None
        if lo >= hi or (spec.log and lo <= 0):
            raise ParameterError(f"{cls.display_name()}.{name} range {text}: need LOW < HIGH"
                                 + (" and LOW > 0 (a log-scale range)" if spec.log else ""))
        out[name] = dataclasses.replace(spec, tune=(lo, hi))
    return out


def _bounds(spec: Param) -> str:
    text = spec.allowed()
    return text.split(" in ", 1)[1] if " in " in text else text


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
