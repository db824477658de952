"""Built-in controllers; importing this package registers them in ``framework.engine.controller.CONTROLLERS``."""

from importlib import import_module

_MODULES = ("baselines", "adaptive", "stability", "heuristic", "guards", "learned", "oracle", "revocable")

for _name in _MODULES:
    try:
        import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:  # a module still being written must not break the others
        if exc.name != f"{__name__}.{_name}":
            raise
