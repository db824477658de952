"""Built-in scorers; importing this package registers them in ``framework.engine.scorer.SCORERS``."""

from framework.core.registry import import_plugin

_MODULES = ("logprob", "ar_logprob", "consistency", "repetition", "compliance", "sudoku_rules", "hybrid")

for _name in _MODULES:  # a module that fails to import is an error naming it (a warning with --skip-broken-plugins)
    import_plugin(f"{__name__}.{_name}", "built-in scorer module")
