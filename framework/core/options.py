"""Options objects: the keywords of a wide entry point grouped by concern, validated like a plugin's.

A wide entry point (``train_policy``, ``tune_controller``, ``run_generation_job`` ...) takes a few
:class:`Options` groups instead of dozens of keywords. A group is a dataclass whose every field is
declared by a :class:`~adaptive_decoding.framework.core.params.Param` in ``params``, so it has what a controller has:

* :meth:`Options.build` refuses an unknown name (listing the known ones) and a bad value (naming the
  group, the field, the value and what is allowed) before any work;
* :meth:`get_params <adaptive_decoding.framework.core.params.Configurable.get_params>` reads the fields back, and
  ``cls.build(**obj.get_params())`` equals ``obj`` (the round trip);
* :meth:`Options.to_yaml` / :meth:`Options.from_yaml`: the YAML form, a mapping of field to value.

:class:`OptionGroups` bundles the groups of one entry point (``data``, ``network``, ``training`` ...);
its YAML form is a mapping of group name to the group's mapping, and :meth:`OptionGroups.from_flat`
builds it from one flat mapping whose every key belongs to exactly one group (a command line's flags).

Two groups many entry points share live here: :class:`RunLogging` (where a run logs: the W&B mode,
progress, the W&B run's config) and :class:`ProgressLogging` (the same, progress shown by default).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional, TypeVar

from adaptive_decoding.framework.core.params import (
    Configurable,
    MappingParam,
    Param,
    ParameterError,
    yaml_form,
)

#: Weights & Biases' modes (``disabled``: no W&B logger at all)
WANDB_MODES = ("offline", "online", "disabled")

OptionsT = TypeVar("OptionsT", bound="Options")
G = TypeVar("G", bound="OptionGroups")


@dataclass(repr=False, eq=False)
class Options(Configurable):
    """One group of options (a dataclass; ``params`` declares a :class:`Param` per field).

    ``section`` names the group in error messages (``rl.group=1 is out of range ...``)."""

    section: ClassVar[str] = ""
    #: whether a bad value's message names the group (``rl.group=1 ...``) or the field alone, where the
    #: field's name is already the entry point's own (``batch_size=0 ...``, run_generation_job's wording)
    qualified: ClassVar[bool] = True

    @classmethod
    def display_name(cls) -> str:
        return cls.__dict__.get("section") or cls.__name__

    def validate(self) -> None:
        """Check and coerce every field by its :class:`Param`, then the combination."""
        owner = self.display_name() if self.qualified else ""
        for name, spec in self.params.items():
            setattr(self, name, spec.check(owner, name, getattr(self, name)))
        self.check_combination()

    @classmethod
    def build(cls: type[OptionsT], **values: Any) -> OptionsT:  # type: ignore[override]
        """Construct from field values and validate (unknown names fail with the known ones)."""
        return super().build(**values)  # type: ignore[return-value]

    @classmethod
    def from_dict(cls: type[OptionsT], values: Optional[Mapping[str, Any]]) -> OptionsT:
        """The group from its mapping form (``None`` = every default); a non-mapping is refused."""
        if values is not None and not isinstance(values, Mapping):
            raise ParameterError(f"{cls.display_name()}={values!r} is not allowed; allowed: a mapping of "
                                 f"{', '.join(cls.param_names())}")
        return cls.build(**dict(values or {}))

    def replace(self: OptionsT, **changes: Any) -> OptionsT:
        """A validated copy with ``changes`` applied."""
        return type(self).build(**{**self.get_params(), **changes})

    def get_params(self) -> dict[str, Any]:
        """Field values in their YAML form (tuples as lists)."""
        return {name: yaml_form(value) for name, value in super().get_params().items()}

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.get_params(), sort_keys=False)

    @classmethod
    def from_yaml(cls: type[OptionsT], text: str) -> OptionsT:
        import yaml

        return cls.from_dict(yaml.safe_load(text))


@dataclass(frozen=True)
class IntListParam(Param):
    """A list of integers, each ≥ ``low`` (stored as a list, so it round-trips through YAML)."""

    kind: Any = "integers"

    def allowed(self) -> str:
        bound = "" if self.low is None else f" ≥ {self.low:g}"
        return f"a list of integers{bound}" + (" or null" if self.nullable else "")

    def check(self, owner: str, name: str, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) and (self.low is None or v >= self.low) for v in value)
        if not ok:
            raise ParameterError(f"{owner}.{name}={value!r} is not allowed; allowed: {self.allowed()}")
        return list(value)


@dataclass(frozen=True)
class PathParam(Param):
    """A file-system path: a string or an ``os.PathLike`` (a ``pathlib.Path``), stored as a string so it
    round-trips through YAML."""

    kind: Any = "path"

    def allowed(self) -> str:
        return "a path" + (" or null" if self.nullable else "")

    def check(self, owner: str, name: str, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            where = f"{owner}.{name}" if owner else name
            raise ParameterError(f"{where}={value!r} is not allowed; allowed: {self.allowed()}")
        return os.fspath(value)


@dataclass(frozen=True)
class ChoiceListParam(Param):
    """A non-empty list of values from ``choices`` (a comma-separated string is split)."""

    kind: Any = "choices"

    def allowed(self) -> str:
        return "a non-empty list of " + ", ".join(repr(c) for c in self.choices or ()) + (
            " or null" if self.nullable else "")

    def check(self, owner: str, name: str, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not value or any(v not in (self.choices or ()) for v in value):
            raise ParameterError(f"{owner}.{name}={value!r} is not allowed; allowed: {self.allowed()}")
        return list(value)


@dataclass(frozen=True)
class ProbabilityListParam(Param):
    """A non-empty list of numbers in [0, 1] (thresholds)."""

    kind: Any = "probabilities"

    def allowed(self) -> str:
        return "a non-empty list of numbers in [0, 1]"

    def check(self, owner: str, name: str, value: Any) -> Any:
        ok = isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1
            for v in value)
        if not ok:
            raise ParameterError(f"{owner}.{name}={value!r} is not allowed; allowed: {self.allowed()}")
        return [float(v) for v in value]


@dataclass(repr=False, eq=False)
class RunLogging(Options):
    """Where a run logs: CSV always, W&B in ``wandb_mode`` with ``run_config`` merged into its config;
    ``progress``: progress bars and Lightning's INFO lines."""

    section = "logging"
    params = {
        "wandb_mode": Param(str, choices=WANDB_MODES, doc="Weights & Biases mode"),
        "progress": Param(bool, doc="progress bars and Lightning's INFO lines"),
        "run_config": MappingParam(nullable=True, doc="the W&B run's config"),
    }

    wandb_mode: str = "offline"
    progress: bool = False
    run_config: Optional[dict] = None


@dataclass(repr=False, eq=False)
class ProgressLogging(RunLogging):
    """:class:`RunLogging` with the progress bar on by default (a command's long run: training a
    denoiser, an experiment)."""

    section = "logging"
    progress: bool = True


@dataclass(repr=False, eq=False)
class OptionGroups:
    """The option groups of one entry point: a dataclass whose every field is an :class:`Options`
    with a ``default_factory`` (its class). Equal when every group is equal."""

    def groups(self) -> dict[str, Options]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def group_classes(cls) -> dict[str, type[Options]]:
        return {f.name: f.default_factory for f in dataclasses.fields(cls)}  # type: ignore[misc]

    def get_params(self) -> dict[str, dict[str, Any]]:
        """``{group: {field: value}}``: the YAML form."""
        return {name: group.get_params() for name, group in self.groups().items()}

    @classmethod
    def from_dict(cls: type[G], values: Optional[Mapping[str, Any]]) -> G:
        """From the YAML form; a missing group takes its defaults, an unknown one fails."""
        values = dict(values or {})
        known = cls.group_classes()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ParameterError(f"{cls.__name__} has no group {unknown[0]!r}; known: {', '.join(known)}")
        built = cls(**{name: kind.from_dict(values.get(name)) for name, kind in known.items()})
        built.check_combination()
        return built

    @classmethod
    def from_flat(cls: type[G], values: Optional[Mapping[str, Any]] = None) -> G:
        """From one flat mapping (``{"n_train": 48, "rl.lr": 0.01}``): each key goes to the group that
        declares it (``GROUP.NAME`` for a name several groups declare); a key no group declares, or
        one several do, fails naming the choices."""
        return cls.from_dict(cls._nest(values or {}))

    @classmethod
    def with_flat(cls: type[G], options: Optional[G], values: Mapping[str, Any]) -> G:
        """``options`` (``None`` = every default) with the flat ``values`` (:meth:`from_flat`'s names)
        replacing their fields, validated: an entry point's keywords over its options object, as
        transformers' ``generate(generation_config, **kwargs)`` takes them."""
        merged = options.get_params() if options is not None else {}
        for group, fields in cls._nest(values).items():
            merged[group] = {**merged.get(group, {}), **fields}
        return cls.from_dict(merged)

    @classmethod
    def _nest(cls, values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """``{group: {name: value}}`` of a flat mapping (:meth:`from_flat`'s routing and errors)."""
        owners: dict[str, list[str]] = {}
        for group, kind in cls.group_classes().items():
            for name in kind.param_names():
                owners.setdefault(name, []).append(group)
        nested: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            group, _, name = key.rpartition(".")
            if not group:
                found = owners.get(key, [])
                if len(found) != 1:
                    why = ("declared by " + " and ".join(found) + f"; write GROUP.{key}") if found else \
                        f"known: {', '.join(owners)}"
                    raise ParameterError(f"{cls.__name__} option {key!r}: {why}")
                group = found[0]
            elif group not in owners.get(name, []):
                raise ParameterError(f"{cls.__name__} has no option {key!r}; groups: "
                                     f"{', '.join(cls.group_classes())}")
            nested.setdefault(group, {})[name] = value
        return nested

    def validate(self: G) -> G:
        """Validate every group (coercing values to their kinds) and the combination; returns self."""
        for group in self.groups().values():
            group.validate()
        self.check_combination()
        return self

    def replace(self: G, **groups: Any) -> G:
        """A copy with whole groups replaced (``data=PolicyData(...)``), checked again."""
        built = dataclasses.replace(self, **groups)
        built.check_combination()
        return built

    def check_combination(self) -> None:
        """Hook: raise on options of different groups that do not fit together."""

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.get_params(), sort_keys=False)

    @classmethod
    def from_yaml(cls: type[G], text: str) -> G:
        import yaml

        return cls.from_dict(yaml.safe_load(text))

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_params() == other.get_params()  # type: ignore[union-attr]

    __hash__ = object.__hash__


#: the splits every task draws its examples from
SPLITS: tuple[str, ...] = ("train", "validation", "test")


@dataclass(repr=False, eq=False)
class ExampleDraw(Options):
    """``n`` examples of ``split`` drawn with ``data_seed`` (the same list on every call), decoded
    ``batch_size`` prompts at a time (item i's decoding seed is ``stable_seed(config.seed, id_i)``,
    as in evaluation, so the batch size never changes a token)."""

    section = "draw"
    params = {
        "split": Param(str, choices=SPLITS, doc="the split the examples come from"),
        "n": Param(int, low=1, doc="examples drawn"),
        "batch_size": Param(int, low=1, doc="prompts decoded together"),
        "data_seed": Param(int, low=0, doc="seed of the examples' draw"),
    }

    split: str = "test"
    n: int = 200
    batch_size: int = 64
    data_seed: int = 0
