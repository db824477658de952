"""Built-in controllers; importing this package registers them in ``adaptive_decoding.framework.engine.controller.CONTROLLERS``.

Every module of this folder is imported (:func:`adaptive_decoding.framework.core.registry.discover_plugins`), so a
new controller is one new file with a ``@CONTROLLERS.register`` class: nothing lists the modules.
``nesting`` re-exports the nesting bases from their place, :mod:`adaptive_decoding.framework.engine.nesting`, and
registers nothing. A module that
fails to import is an error naming it.
"""

from adaptive_decoding.framework.core.registry import discover_plugins

discover_plugins(__name__)
