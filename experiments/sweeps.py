"""Sweeps: one strategy entry of an experiment file becomes one strategy per value of a parameter,
all on one accuracy–parallelism *curve* (the report draws them as a line and scores the line's AUP).

::

    - controller: fast_dllm
      sweep: {threshold: [0.5, 0.7, 0.9]}        # one parameter and its values

expands, in the order given, to ``fast_dllm (threshold=0.5)``, ``fast_dllm (threshold=0.7)`` and
``fast_dllm (threshold=0.9)``: each label is ``<curve> (<parameter>=<value>)``, and ``curve`` is the
entry's own label (``label:``, or the default built from controller, params and lookahead). The
swept key names a parameter of the controller (``params``; ``steps_per_token`` for the LLaDA and
Dream families) or a decoding option (``decode``: ``block_length``, ``cache_refresh``, ...); a
controller parameter wins if a name were both. Each value is validated as if it were written in
``params`` / ``decode``, the key may not also be set there, and values may not repeat. Every value
is its own cell (the cell hash covers the value), so a run resumes point by point.

A dotted key reaches inside a mapping parameter: ``{inner_params.threshold: [0.99, 0.9]}`` sweeps
the threshold of a wrapper's inner controller (``verified``, ``number_guard``), and
``{base.params.eta: [0.99, 0.95]}`` the η of a sub-controller written as ``{name, params}``
(``confidence_ladder``'s ``base``); the label names the leaf (``(threshold=0.99)``), and the value is
checked when the file is read, by building the cell's controller for each task.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from adaptive_decoding.experiments.spec import StrategySpec, did_you_mean
from adaptive_decoding.framework.core.params import ParameterError, with_value

EXAMPLE = "{threshold: [0.5, 0.7, 0.9]}"
#: parameter kinds a dotted key reaches into: a mapping, a sub-controller spec ({name, params}), a params dict
_MAPPING_KINDS = (dict, "spec", "params")


def param_problem(cls: type, key: str, value: Any) -> Optional[str]:
    """Why ``key=value`` is not a valid parameter of controller ``cls``, or ``None``."""
    known = cls.param_names()
    if "." in key:  # inside a mapping parameter: the leaf is checked when the controller is built
        head = key.split(".", 1)[0]
        spec = cls.params.get(head)
        if spec is None or spec.kind not in _MAPPING_KINDS:
            return (f"{head!r} is not a mapping parameter of {cls.display_name()}; a dotted key reaches "
                    f"inside one of: "
                    f"{', '.join(k for k, p in cls.params.items() if p.kind in _MAPPING_KINDS) or 'none'}")
        return None
    if key == "steps_per_token":
        if "steps" not in known:
            return f"{cls.display_name()} has no 'steps' parameter to derive it for"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            return f"{value!r} is out of range; allowed: number in (0, 1] (steps = G × it)"
        return None
    if key not in known:
        return f"unknown parameter of {cls.display_name()}" + did_you_mean(str(key), known)
    spec = cls.params.get(key)
    if spec is not None and not (isinstance(value, str) and "{" in value):
        try:
            spec.check(cls.display_name(), key, value)
        except ParameterError as exc:
            return str(exc)
    return None


def _decode_problem(key: str, value: Any) -> Optional[str]:
    from adaptive_decoding.framework.engine.config import DecodeConfig

    try:
        DecodeConfig.params[key].check("", key, value)
    except ParameterError as exc:
        return str(exc)
    return None


def _target(cls: Optional[type], key: str) -> Optional[str]:
    """``params`` or ``decode``: where the swept key goes; ``None`` if it is neither."""
    from adaptive_decoding.framework.engine.config import DecodeConfig

    if cls is None:  # tuned:PATH or a placeholder: its parameters are checked when it is built
        return "decode" if key in DecodeConfig.param_names() else "params"
    known = cls.param_names()
    if key in known or (key == "steps_per_token" and "steps" in known) or key.split(".", 1)[0] in known:
        return "params"
    return "decode" if key in DecodeConfig.param_names() else None


def expand_sweep(c: Any, sweep: Any, spec: StrategySpec, cls: Optional[type],
                 where: str) -> list[StrategySpec]:
    """The strategies of ``spec`` swept over ``sweep`` (``{param: [values]}``); problems go to
    ``c.add(yaml path, message)`` and give no strategies."""
    from adaptive_decoding.framework.engine.config import DecodeConfig

    path = f"{where}.sweep"
    if not isinstance(sweep, dict) or len(sweep) != 1:
        c.add(path, f"{sweep!r} is not allowed; allowed: one parameter and its values, e.g. {EXAMPLE} "
                    "(a curve is one-dimensional: sweep a second parameter in another strategy)")
        return []
    (key, values), = sweep.items()
    key = str(key)
    kpath = f"{path}.{key}"
    target = _target(cls, key)
    if key == "seed":
        c.add(kpath,
              "the decoding seed is the experiment's own axis: list the values in the top-level 'seeds'")
        return []
    if target is None:
        known = [*cls.param_names(), *(["steps_per_token"] if "steps" in cls.param_names() else []),
                 *DecodeConfig.param_names()]
        c.add(kpath, f"unknown parameter: neither a parameter of {cls.display_name()} nor a decoding option"
              + did_you_mean(key, known))
        return []
    if not isinstance(values, list) or not values:
        c.add(kpath, f"{values!r} is not allowed; allowed: a non-empty list of values, e.g. {EXAMPLE}")
        return []
    fixed = spec.params if target == "params" else spec.decode
    clash = [k for k in ({"steps", "steps_per_token"} if key in ("steps", "steps_per_token") else {key})
             if k in fixed]
    if "." in key and target == "params":
        clash = [key] if _has_path(fixed, key) else []
    for k in sorted(clash):
        c.add(kpath, f"{target}.{k} is also set; a swept parameter takes its values from the sweep only")
    seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
    if len(set(seen)) != len(seen):
        c.add(kpath, f"{values!r} repeats a value (each value is one point of the curve)")
    ok = not clash and len(set(seen)) == len(seen)
    params = []
    for j, v in enumerate(values):
        msg = (param_problem(cls, key, v) if cls is not None
               else None) if target == "params" else _decode_problem(key, v)
        try:
            params.append(with_value(spec.params, key, v) if target == "params" else dict(spec.params))
        except ParameterError as exc:  # a dotted key through a value that is not a mapping
            msg = msg or str(exc)
        if msg:
            c.add(f"{kpath}[{j}]", msg)
            ok = False
    if not ok:
        return []
    return [dataclasses.replace(
        spec, label=f"{spec.label} ({key.rsplit('.', 1)[-1]}={v})", curve=spec.label, sweep={key: v},
        path=f"{kpath}[{j}]", params=params[j],
        decode={**spec.decode, key: v} if target == "decode" else dict(spec.decode))
        for j, v in enumerate(values)]


def _has_path(params: dict, key: str) -> bool:
    """Whether the dotted ``key`` (``base.params.eta``) is already set in ``params``."""
    node: Any = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True

