"""Built-in scorers; importing this package registers them in ``framework.engine.scorer.SCORERS``.

A module that fails to import is an error naming it (:func:`framework.core.registry.import_plugins`).
"""

from framework.core.registry import import_plugins

_MODULES = ("logprob", "ar_logprob", "consistency", "repetition", "compliance", "sudoku_rules", "mixture")

import_plugins(__name__, _MODULES)
