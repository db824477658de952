"""One generic registry per plugin kind (controllers, scorers, tasks, models, metrics).

Modelled on lm-evaluation-harness's registry: a decorator registers built-ins under a short name
(plus aliases), ``"module:Object"`` strings register lazily, and third-party packages add plugins
through a Python entry-point group, so ``adec decode --controller their_name`` just works. The
built-in plugins are found by scanning their packages (:func:`discover_plugins`), as tasks are: a
new module in ``controllers/``, ``scorers/``, ``framework/tasks/`` or ``framework/tasks/metrics/``
registers itself, and no list of modules is kept by hand.

Three errors are kept deliberately explicit:

* registering a name twice   -> :class:`RegistryError` ("... already registered ...")
* registering the wrong type -> :class:`TypeError` ("... is not a subclass of ...", or "... does not
  implement decide ..." for a class that leaves an abstract method of the base undefined)
* asking for an unknown name -> :class:`UnknownNameError` listing every known name.

A plugin module that fails to import is never skipped in silence: :class:`PluginImportError`
names the module (or entry point) and the exception. :func:`skip_broken_plugins` (the CLI's
``--skip-broken-plugins``) turns that into a warning, and the broken plugin is left out.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
import warnings
from importlib import metadata
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

T = TypeVar("T")


class RegistryError(ValueError):
    """A registration conflict (duplicate name or alias)."""


class PluginImportError(ImportError):
    """A built-in plugin module or an entry point that failed to import; the message names both."""


_SKIP_BROKEN = False


def skip_broken_plugins(skip: bool = True) -> None:
    """Warn about (instead of raising on) plugin modules and entry points that fail to import."""
    global _SKIP_BROKEN
    _SKIP_BROKEN = bool(skip)


def import_plugin(module: str, what: str = "plugin module") -> Any:
    """Import ``module``; a failure raises :class:`PluginImportError` naming it and the exception,
    or, after :func:`skip_broken_plugins`, warns and returns ``None``."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of a plugin's import is reported, named
        message = (f"{what} {module!r} failed to import: {type(exc).__name__}: {exc} "
                   "(fix it, uninstall it, or pass --skip-broken-plugins to leave it out)")
        if _SKIP_BROKEN:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return None
        raise PluginImportError(message) from exc


def import_plugins(package: str, modules: Sequence[str]) -> None:
    """Import every ``package.module`` of a plugin package (see :func:`import_plugin`)."""
    for name in modules:
        import_plugin(f"{package}.{name}")


def package_modules(package: str, *, skip: Sequence[str] = ()) -> tuple[str, ...]:
    """The module names of ``package``, found by scanning its folder (:func:`pkgutil.iter_modules`),
    sorted; names starting with ``_`` and those in ``skip`` (helpers that register nothing, or must
    not be imported) are left out. Sub-packages count as modules."""
    paths = getattr(importlib.import_module(package), "__path__", None)
    if paths is None:
        raise RegistryError(f"{package!r} is a module, not a package; discovery scans a package's folder")
    return tuple(sorted(m.name for m in pkgutil.iter_modules(paths)
                        if not m.name.startswith("_") and m.name not in skip))


def discover_plugins(package: str, *, skip: Sequence[str] = ()) -> tuple[str, ...]:
    """Import every module of ``package`` (:func:`package_modules`), so that a new file in a built-in
    plugin package registers its plugins without being listed anywhere; returns the module names.
    The built-in controllers, scorers, answer metrics and tasks are found this way; third-party
    plugins come through their entry-point group (:class:`Registry`)."""
    modules = package_modules(package, skip=skip)
    import_plugins(package, modules)
    return modules


class UnknownNameError(KeyError):
    """An unknown plugin name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


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
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
            raise TypeError(f"{self.kind} {name!r}: {_describe(obj)} does not implement {missing}, abstract in "
                            f"{self.base.__qualname__}; define it before registering the class")

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
        """Every ``(name, object)``; after :func:`skip_broken_plugins` a broken lazy entry is left out."""
        out = []
        for name in self.names():
            try:
                out.append((name, self.get(name)))
            except PluginImportError as exc:
                if not _SKIP_BROKEN:
                    raise
                warnings.warn(str(exc), RuntimeWarning, stacklevel=2)
        return out


def _import_string(target: str, what: str) -> Any:
    if ":" not in target:
        raise RegistryError(f"lazy registry entry {target!r} must look like 'package.module:Object'")
    mod_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - the entry point is named with the failure
        raise PluginImportError(f"{what} (entry point {target!r}) failed to import: "
                                f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"{what}: entry point {target!r} names {part!r}, which {mod_name} does not have")
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
