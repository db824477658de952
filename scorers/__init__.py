"""Built-in scorers; importing this package registers them in ``framework.engine.scorer.SCORERS``."""

from importlib import import_module

_MODULES = ("logprob", "ar_logprob", "consistency", "repetition", "compliance", "sudoku_rules", "mixture")

for _name in _MODULES:
    try:
        import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:  # a module still being written must not break the others
        if exc.name != f"{__name__}.{_name}":
            raise
