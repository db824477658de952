"""Built-in scorers; importing this package registers them in ``adaptive_decoding.framework.engine.scorer.SCORERS``.

Every module of this folder is imported (:func:`adaptive_decoding.framework.core.registry.discover_plugins`), so a
new scorer is one new file with a ``@SCORERS.register`` class: nothing lists the modules. A module
that fails to import is an error naming it.
"""

from adaptive_decoding.framework.core.registry import discover_plugins

discover_plugins(__name__)
