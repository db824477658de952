"""Built-in controllers; importing this package registers them in ``framework.engine.controller.CONTROLLERS``."""

from framework.core.registry import import_plugin

_MODULES = ("baselines", "adaptive", "stability", "heuristic", "guards", "learned", "oracle", "revocable")

for _name in _MODULES:  # a module that fails to import is an error naming it (a warning with --skip-broken-plugins)
    import_plugin(f"{__name__}.{_name}", "built-in controller module")
