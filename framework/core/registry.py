"""One generic registry per plugin kind (controllers, scorers, tasks, models, metrics).

Modelled on lm-evaluation-harness's registry: a decorator registers built-ins under a short name
(plus aliases), ``"module:Object"`` strings register lazily, and third-party packages add plugins
through a Python entry-point group, so ``adec decode --controller their_name`` just works.

Three errors are kept deliberately explicit:

* registering a name twice   -> :class:`RegistryError` ("... already registered ...")
* registering the wrong type -> :class:`TypeError` ("... is not a subclass of ...")
* asking for an unknown name -> :class:`UnknownNameError` listing every known name.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from importlib import metadata
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    """A registration conflict (duplicate name or alias)."""


class UnknownNameError(KeyError):
    """An unknown plugin name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class PluginImportError(ImportError):
    """A built-in plugin module or an entry point failed to import; the message names it and why."""


#: ``adec --skip-broken-plugins`` sets this: a plugin that fails to import is then a warning, not an error
SKIP_BROKEN_PLUGINS = False


def skip_broken_plugins(skip: bool = True) -> None:
    """Downgrade a plugin module that fails to import from an error to a warning (or back)."""
    global SKIP_BROKEN_PLUGINS
    SKIP_BROKEN_PLUGINS = bool(skip)


def import_plugin(module: str, what: str = "plugin module") -> Any:
    """Import ``module``; on failure raise :class:`PluginImportError` naming it and the exception,
    or (with :func:`skip_broken_plugins`) warn and return ``None``."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of a plugin's import is reported as one
        message = (f"{what} {module!r} failed to import: {type(exc).__name__}: {exc} "
                   f"(fix it, or run adec --skip-broken-plugins to go on without it)")
        if SKIP_BROKEN_PLUGINS:
            warnings.warn(message, UserWarning, stacklevel=2)
            return None
        raise PluginImportError(message) from exc


class Registry(Generic[T]):
    """A name -> class (or factory) table for one plugin kind.

    Args:
        kind: human name of the kind, used in messages ("controller").
        base: objects registered must be subclasses of this class (``None`` to skip the check).
        entry_point_group: Python entry-point group scanned once, on first lookup.
        builtin_modules: modules imported on first lookup so their decorators run.
    """

    def __init__(
        self,
        kind: str,
        base: type | None = None,
        entry_point_group: str | None = None,
        builtin_modules: tuple[str, ...] = (),
    ) -> None:
        self.kind = kind
        self.base = base
        self.entry_point_group = entry_point_group
        self.builtin_modules = builtin_modules
        self._table: dict[str, Any] = {}
        self._aliases: dict[str, str] = {}
        self._loaded = False

    # ------------------------------------------------------------------ registration
    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator: ``@CONTROLLERS.register("fast_dllm")``."""

        def deco(obj: T) -> T:
            self.add(name, obj, aliases=aliases)
            return obj

        return deco

    def add(self, name: str, obj: Any, *, aliases: tuple[str, ...] = ()) -> None:
        """Register ``obj`` (a class, a factory, or a lazy ``"module:Object"`` string)."""
        for key in (name, *aliases):
            if key in self._table or key in self._aliases:
                existing = self._table.get(key, self._aliases.get(key))
                if existing is obj or (
                    key in self._table and _same_object(self._table[key], obj)
                ):
                    continue  # re-import of the same module: harmless
                raise RegistryError(
                    f"{self.kind} name {key!r} is already registered (to {_describe(existing)}); "
                    f"choose another name"
                )
        if not isinstance(obj, str):
            self._check_type(name, obj)
        self._table[name] = obj
        for alias in aliases:
            self._aliases[alias] = name
        if hasattr(obj, "__dict__") and not isinstance(obj, str):
            try:
                if "registry_name" not in obj.__dict__:
                    obj.registry_name = name
            except (AttributeError, TypeError):
                pass

    def _check_type(self, name: str, obj: Any) -> None:
        if self.base is None:
            return
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise TypeError(
                f"{self.kind} {name!r}: {_describe(obj)} is not a subclass of "
                f"{self.base.__module__}.{self.base.__qualname__}"
            )

    # ------------------------------------------------------------------ lookup
    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for mod in self.builtin_modules:
            import_plugin(mod, f"built-in {self.kind} module")
        if self.entry_point_group:
            for ep in metadata.entry_points(group=self.entry_point_group):
                if ep.name not in self._table and ep.name not in self._aliases:
                    self._table[ep.name] = ep.value  # lazy "module:Object"

    def get(self, name: str) -> Any:
        """The registered object for ``name`` (or an alias); lazy entries are imported now."""
        self._ensure_loaded()
        key = self._aliases.get(name, name)
        if key not in self._table:
            known = ", ".join(self.names()) or "(none)"
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UnknownNameError(f"unknown {self.kind} {name!r}{hint} Known {self.kind}s: {known}")
        obj = self._table[key]
        if isinstance(obj, str):
            obj = _import_string(obj, f"{self.kind} {key!r}")
            self._check_type(key, obj)
            self._table[key] = obj
            if "registry_name" not in getattr(obj, "__dict__", {}):
                try:
                    obj.registry_name = key
                except (AttributeError, TypeError):
                    pass
        return obj

    def names(self) -> list[str]:
        """Every registered name (aliases excluded), sorted."""
        self._ensure_loaded()
        return sorted(self._table)

    def __contains__(self, name: str) -> bool:
        self._ensure_loaded()
        return name in self._table or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self) -> list[tuple[str, Any]]:
        return [(n, self.get(n)) for n in self.names()]


def _import_string(target: str, what: str = "plugin") -> Any:
    if ":" not in target:
        raise RegistryError(f"lazy registry entry {target!r} must look like 'package.module:Object'")
    mod_name, _, attr = target.partition(":")
    obj: Any = import_plugin(mod_name, f"the module of {what} ({target})")
    if obj is None:  # skipped with a warning: the name is unknown from now on
        raise UnknownNameError(f"{what} is unavailable: its module {mod_name!r} failed to import (see the warning)")
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _same_object(a: Any, b: Any) -> bool:
    return (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
        and getattr(a, "__module__", None) is not None
    )


def _describe(obj: Any) -> str:
    if isinstance(obj, str):
        return obj
    mod = getattr(obj, "__module__", "?")
    qn = getattr(obj, "__qualname__", type(obj).__qualname__)
    return f"{mod}.{qn}"
