"""Built-in controllers; importing this package registers them in ``framework.engine.controller.CONTROLLERS``.

A module that fails to import is an error naming it (:func:`framework.core.registry.import_plugins`).
"""

from framework.core.registry import import_plugins

_MODULES = ("baselines", "adaptive", "stability", "heuristic", "guards", "learned", "oracle", "revocable",
            "dependence", "dinfer", "klass", "pc_sampler", "prophet", "slowfast", "block_diffusion", "d3llm")

import_plugins(__name__, _MODULES)
