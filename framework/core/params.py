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
from typing import Any, ClassVar, Mapping, Sequence


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
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        names = []
        for p in sig.parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            names.append(p.name)
        return names

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
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> "Configurable":
        """Set parameters by name; unknown names fail with the list of known ones."""
        known = self._param_names()
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
        known = cls._param_names()
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


def parse_assignments(pairs: Sequence[str], option: str = "--set") -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` with literal coercion; ``option`` names the
    command-line option in the error for a pair without ``=``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ParameterError(f"{option} expects key=value, got {pair!r}")
        key, _, value = pair.partition("=")
        out[key.strip()] = coerce_literal(value.strip())
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
