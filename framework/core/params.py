"""Parameters the scikit-learn way, validated the transformers way.

Every hyper-parameter of a controller or scorer is an explicit keyword of ``__init__``, stored as
given (no logic in ``__init__``). A class declares a :class:`Param` per keyword in ``params``; then

* :meth:`Configurable.get_params` reads them back (for W&B run configs, YAML export, round trips),
* :meth:`Configurable.validate` raises :class:`ParameterError` naming the parameter, the value and
  the allowed range, and warns about values that have no effect in the chosen mode,
* :meth:`Configurable.search_space` gives the Optuna space, which maps straight to ``cls(**params)``.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence


class StopDecoding(Exception):
    """Raised to stop a decode (a job's deadline): passed on by every fallback that would otherwise
    absorb a plug-in's failure (the lookahead's), so the stop is not delayed to a later forward."""


class ParameterError(ValueError):
    """An invalid parameter value or combination; the message names the flag to change."""


@dataclass(frozen=True)
class Param:
    """Specification of one hyper-parameter.

    Args:
        kind: ``float``, ``int``, ``bool``, ``str`` (with ``choices``) or ``"int_or_none"``.
        low, high: inclusive bounds (``None`` = unbounded).
        choices: allowed values for categorical parameters.
        doc: one line shown by ``adec list --verbose`` and in docs.
        tune: Optuna range ``(low, high)`` or a tuple of choices; ``None`` = not tuned.
        log: sample the tuning range on a log scale.
        nullable: ``None`` is also allowed.
    """

    kind: Any = float
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    doc: str = ""
    tune: tuple | None = None
    log: bool = False
    nullable: bool = False
    low_exclusive: bool = False

    def allowed(self) -> str:
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind is bool:
            text = "true or false"
        elif self.kind is str:
            text = "a string"
        elif self.kind not in (int, float):
            text = getattr(self.kind, "__name__", "a value") if isinstance(self.kind, type) else "a value"
        else:
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            left = "(" if (self.low is None or self.low_exclusive) else "["
            right = ")" if self.high is None else "]"
            tname = "integer" if self.kind is int else "number"
            text = f"{tname} in {left}{lo}, {hi}{right}"
        return text + (" or null" if self.nullable else "")

    def check(self, owner: str, name: str, value: Any) -> Any:
        """Return ``value`` coerced to the declared kind, or raise ParameterError."""
        where = f"{owner}.{name}" if owner else name
        if value is None:
            if self.nullable:
                return None
            if self.choices is not None and "none" in self.choices:  # `--set cache=none` reads as null
                return "none"
            raise ParameterError(f"{where}=None is not allowed; allowed: {self.allowed()}")
        if self.choices is not None:
            if value not in self.choices:
                raise ParameterError(f"{where}={value!r} is not allowed; allowed: {self.allowed()}")
            return value
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            raise ParameterError(f"{where}={value!r} is not a boolean; allowed: {self.allowed()}")
        if self.kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                try:
                    value = float(value) if self.kind is float else int(str(value))
                except (TypeError, ValueError):
                    raise ParameterError(
                        f"{where}={value!r} is not a number; allowed: {self.allowed()}"
                    ) from None
            if self.kind is int and not float(value).is_integer():
                raise ParameterError(f"{where}={value!r} is not an integer; allowed: {self.allowed()}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ParameterError(f"{where}={value!r} is not finite; allowed: {self.allowed()}")
            low_bad = self.low is not None and (
                value <= self.low if self.low_exclusive else value < self.low
            )
            if low_bad or (self.high is not None and value > self.high):
                raise ParameterError(f"{where}={value!r} is out of range; allowed: {self.allowed()}")
            return int(value) if self.kind is int else float(value)
        if self.kind is str:
            if not isinstance(value, str):
                raise ParameterError(f"{where}={value!r} is not a string")
            return value
        return value


def yaml_form(value: Any) -> Any:
    """Tuples become lists and mappings dicts, recursively, so values equal their YAML round trip."""
    if isinstance(value, Mapping):
        return {k: yaml_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [yaml_form(v) for v in value]
    return value


@dataclass(frozen=True)
class MappingParam(Param):
    """A mapping of parameter names to values (e.g. a scorer's or a fixed sub-controller's params)."""

    kind: Any = dict

    def allowed(self) -> str:
        return "a mapping of parameter names to values" + (" or null" if self.nullable else "")

    def check(self, owner: str, name: str, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ParameterError(f"{owner}.{name}={value!r} is not allowed; allowed: {self.allowed()}")
        return yaml_form(value)


@dataclass(frozen=True)
class NumberListParam(Param):
    """A list of finite numbers (stored as a list, so it round-trips through YAML)."""

    kind: Any = "numbers"

    def allowed(self) -> str:
        return "a list of numbers" + (" or null" if self.nullable else "")

    def check(self, owner: str, name: str, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
            raise ParameterError(f"{owner}.{name}={value!r} is not allowed; allowed: {self.allowed()}")
        return list(value)


SPEC_FORMS = "a controller name, 'tuned:PATH' or {name: NAME, params: {...}}"


def parse_controller_spec(where: str, spec: Any) -> tuple[str, dict]:
    """``(name, params)`` of a nested controller given as ``NAME``, ``"tuned:PATH"`` or
    ``{name: NAME, params: {...}}`` (``params`` optional); anything else raises, naming ``where``."""
    if isinstance(spec, str) and spec:
        return spec, {}
    if (isinstance(spec, Mapping) and isinstance(spec.get("name"), str) and spec.get("name")
            and set(spec) <= {"name", "params"} and isinstance(spec.get("params") or {}, Mapping)):
        return spec["name"], dict(spec.get("params") or {})
    raise ParameterError(f"{where}={spec!r} is not a controller spec; allowed: {SPEC_FORMS}")


@dataclass(frozen=True)
class NestedController:
    """One controller nested in another: its dotted ``path`` among the owner's parameters (the prefix
    of its tunable names, ``base``, ``controllers.1``, ``inner``), its ``slot`` (the last part of
    the path), its registered ``name`` (or ``tuned:PATH``) and the ``params`` it is built with."""

    path: str
    slot: str
    name: str
    params: dict


@dataclass(frozen=True)
class ControllerSpec(Param):
    """A nested controller (a sub-controller of a composite, the controller a wrapper wraps).

    The value is ``NAME``, ``"tuned:PATH"`` or ``{name: NAME, params: {...}}``; with ``many`` a
    non-empty list of those. Two storage variants keep older forms working:

    * ``params_in="inner_params"``: the owner's parameter of that name (a :class:`MappingParam`)
      holds more parameters of the nested controller, merged over the spec's own (a key given in
      both places is an error) - a wrapper's ``inner`` + ``inner_params``;
    * ``controller="margin_topk"``: the nested controller is fixed and the value is only its
      parameters mapping (or null).

    Every nested controller's tunable parameter is named by its dotted path from the owner:
    ``inner.threshold``, ``base.eta``, ``controllers.0.eta``, ``margin.eta`` (see
    :mod:`adaptive_decoding.framework.tuning.space`).
    """

    kind: Any = "spec"
    many: bool = False
    params_in: Optional[str] = None
    controller: Optional[str] = None

    def allowed(self) -> str:
        if self.controller is not None:
            text = f"a mapping of {self.controller} parameters"
        elif self.many:
            text = f"a non-empty list of controller specs ({SPEC_FORMS})"
        else:
            text = SPEC_FORMS
        return text + (" or null" if self.nullable else "")

    def check(self, owner: str, name: str, value: Any) -> Any:
        where = f"{owner}.{name}"
        if value is None and (self.nullable or self.controller is not None):
            return None
        if self.controller is not None:
            return MappingParam().check(owner, name, value)
        if self.many:
            if not isinstance(value, (list, tuple)) or not value:
                raise ParameterError(f"{where}={value!r} is not allowed; allowed: {self.allowed()}")
            for i, item in enumerate(value):
                parse_controller_spec(f"{where}[{i}]", item)
        else:
            parse_controller_spec(where, value)
        return yaml_form(value)

    def nested(self, name: str, value: Any, owner_params: Mapping[str, Any]) -> list[NestedController]:
        """The nested controllers ``value`` (this parameter's, named ``name``) describes;
        ``owner_params`` supplies the ``params_in`` mapping. Empty for null."""
        if value is None and self.controller is None:
            return []
        if self.controller is not None:
            return [NestedController(name, name, self.controller, dict(value or {}))]
        if self.many:
            return [NestedController(f"{name}.{i}", str(i), *parse_controller_spec(f"{name}[{i}]", v))
                    for i, v in enumerate(value)]
        child, params = parse_controller_spec(name, value)
        if self.params_in is not None:
            extra = dict(owner_params.get(self.params_in) or {})
            both = sorted(set(params) & set(extra))
            if both:
                raise ParameterError(f"{name}: parameter {both[0]!r} of {child} is given both in {name}'s params "
                                     f"and in {self.params_in}; give it once")
            params = {**params, **extra}
        return [NestedController(name, name, child, params)]

    def with_nested_value(self, name: str, current: Any, owner_params: dict, path: str, value: Any,
                          set_in: Callable[[str, dict, str, Any], dict]) -> dict:
        """``owner_params`` with ``path`` (below this parameter, e.g. ``eta`` or ``0.eta``) set to
        ``value`` in the nested controller's parameters; ``current`` is this parameter's value (given
        or default); ``set_in(child_name, child_params, rest, value)`` sets a name inside the child
        (it may be nested again). The stored form is kept: a ``params_in`` mapping, a fixed
        controller's mapping, or ``{name, params}`` specs."""
        if self.controller is not None:
            return {**owner_params, name: set_in(self.controller, dict(current or {}), path, value)}
        if self.many:
            index, _, rest = path.partition(".")
            items = list(current or [])
            if not index.isdigit() or int(index) >= len(items) or not rest:
                raise ParameterError(f"{name}.{path}: expected {name}.INDEX.PARAM with INDEX below {len(items)}")
            items[int(index)] = _spec_with(f"{name}.{index}", items[int(index)], rest, value, set_in)
            return {**owner_params, name: items}
        if current is None:
            raise ParameterError(f"{name}.{path}: {name} is null; set {name} to a controller first")
        if self.params_in is not None:
            child, _ = parse_controller_spec(name, current)
            inner = dict(owner_params.get(self.params_in) or {})
            return {**owner_params, self.params_in: set_in(child, inner, path, value)}
        return {**owner_params, name: _spec_with(name, current, path, value, set_in)}


def _spec_with(where: str, spec: Any, path: str, value: Any, set_in: Callable[[str, dict, str, Any], dict]) -> dict:
    child, params = parse_controller_spec(where, spec)
    return {"name": child, "params": set_in(child, params, path, value)}


def coerce_literal(text: str) -> Any:
    """Parse a ``--set key=value`` right-hand side: int, float, bool, null, a YAML list ``[...]`` or
    mapping ``{...}`` (e.g. a nested controller ``{name: margin_topk, params: {eta: 0.95}}``), or string."""
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if (text.startswith("[") and text.endswith("]")) or (text.startswith("{") and text.endswith("}")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ParameterError(f"{text!r} is not a valid YAML list or mapping ({exc.__class__.__name__}); "
                                 f"allowed: e.g. [1, 2] or {{name: margin_topk, params: {{eta: 0.9}}}}") from None
    return text


class Configurable:
    """Base for anything built from validated keyword parameters (controllers, scorers).

    Subclasses list their :class:`Param` specs in ``params``; the keys must equal the keyword
    arguments of ``__init__``, which only stores them (``self.threshold = threshold``).
    """

    params: ClassVar[dict[str, Param]] = {}
    registry_name: ClassVar[str] = ""

    @classmethod
    def param_names(cls) -> list[str]:
        """The parameter names: the keyword arguments of ``__init__``, in order (scikit-learn's
        ``_get_param_names``, public here because the engine, the jobs, the tuner, the experiments
        and the conformance suites all read it)."""
        sig = inspect.signature(cls.__init__)
        names = []
        for p in sig.parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            names.append(p.name)
        return names

    @classmethod
    def _param_names(cls) -> list[str]:
        """Deprecated alias of :meth:`param_names`, kept so code written against the old private name
        still runs; it warns with a :class:`DeprecationWarning`."""
        warnings.warn(f"{cls.__qualname__}._param_names() is deprecated; call param_names()",
                      DeprecationWarning, stacklevel=2)
        return cls.param_names()

    @classmethod
    def display_name(cls) -> str:
        """The registered name (a subclass does not inherit its parent's), else the class name."""
        return cls.__dict__.get("registry_name") or cls.__name__

    @classmethod
    def default(cls, name: str) -> Any:
        """The constructor's default for parameter ``name`` (``inspect.Parameter.empty`` if it has none)."""
        return inspect.signature(cls.__init__).parameters[name].default

    def get_params(self) -> dict[str, Any]:
        """Constructor keywords and their current values (scikit-learn's ``get_params``)."""
        return {name: getattr(self, name) for name in self.param_names()}

    def set_params(self, **params: Any) -> "Configurable":
        """Set parameters by name; unknown names fail with the list of known ones."""
        known = self.param_names()
        for key, value in params.items():
            if key not in known:
                raise ParameterError(
                    f"{self.display_name()} has no parameter {key!r}; known: {', '.join(known) or '(none)'}"
                )
            setattr(self, key, value)
        return self

    @classmethod
    def build(cls, **params: Any) -> "Configurable":
        """Construct from keyword parameters and validate (the registry's entry point)."""
        known = cls.param_names()
        unknown = [k for k in params if k not in known]
        if unknown:
            raise ParameterError(
                f"{cls.display_name()} has no parameter {unknown[0]!r}; "
                f"known: {', '.join(known) or '(none)'}"
            )
        obj = cls(**params)
        obj.validate()
        return obj

    def validate(self) -> None:
        """Raise :class:`ParameterError` on a bad value; coerce values to their declared kinds."""
        owner = self.display_name()
        for name, spec in self.params.items():
            if not hasattr(self, name):
                continue
            setattr(self, name, spec.check(owner, name, getattr(self, name)))
        self.check_combination()

    def check_combination(self) -> None:
        """Hook: raise on incompatible combinations, :func:`warn_no_effect` on ignored values."""

    def warn_no_effect(self, name: str, reason: str) -> None:
        warnings.warn(
            f"{self.display_name()}.{name}={getattr(self, name)!r} has no effect: {reason}",
            UserWarning,
            stacklevel=3,
        )

    @classmethod
    def nested_controllers(cls, params: Mapping[str, Any]) -> list[NestedController]:
        """The controllers nested in ``params`` by the :class:`ControllerSpec` parameters (a parameter
        missing from ``params`` takes its default), in declaration order."""
        full = {n: params[n] if n in params else cls.default(n) for n in cls.param_names()}
        out: list[NestedController] = []
        for name, spec in cls.params.items():
            if isinstance(spec, ControllerSpec) and name in full:
                try:
                    out.extend(spec.nested(name, full[name], full))
                except ParameterError as exc:
                    raise ParameterError(f"{cls.display_name()}.{exc}") from None
        return out

    @classmethod
    def search_space(cls) -> dict[str, Param]:
        """The parameters that declare an Optuna range (``Param.tune``)."""
        return {n: p for n, p in cls.params.items() if p.tune is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.display_name(), "params": self.get_params()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_params() == other.get_params()  # type: ignore[union-attr]

    __hash__ = object.__hash__


def parse_assignments(pairs: Sequence[str], option: str = "--set",
                      declared: Optional[Mapping[str, "Param"]] = None) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` with literal coercion; ``option`` names the
    command-line option in the error for a pair without ``=``. A key that ``declared`` (a plugin's
    ``params``) types as ``str`` keeps its text as written, so a template ``{question}`` or a path
    ``007.jsonl`` stays a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ParameterError(f"{option} expects key=value, got {pair!r}")
        key, _, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        spec = (declared or {}).get(key)
        textual = getattr(spec, "kind", None) is str and not (spec.nullable and value in ("null", "None", "~"))
        out[key] = value if textual else coerce_literal(value)
    return out


def with_value(params: dict, key: str, value: Any) -> dict:
    """``params`` with ``key`` set to ``value``; a dotted key (``inner_params.threshold``) sets a leaf
    inside a mapping parameter, creating the mapping if needed; ``params`` itself is not changed."""
    if "." not in key:
        return {**params, key: value}
    head, leaf = key.split(".", 1)
    inside = params.get(head)
    if inside is not None and not isinstance(inside, Mapping):
        raise ParameterError(f"{key!r}: {head!r} is {inside!r}, not a mapping; a dotted key sets a key inside one "
                             f"(write it as a mapping, e.g. {{name: ..., params: {{...}}}} for a controller)")
    return {**params, head: with_value(dict(inside or {}), leaf, value)}


def with_values(params: dict, values: dict) -> dict:
    """``params`` with every ``key: value`` of ``values`` set by :func:`with_value`."""
    for key, value in values.items():
        params = with_value(params, key, value)
    return params
