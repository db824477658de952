"""Answer metrics as plugins: ``METRICS``, a registry like the controllers' and scorers'.

A metric scores one generated text against one :class:`~adaptive_decoding.framework.tasks.base.Example` (its
``answer`` and its row's fields in ``meta``): ``get_metric(name, **params).scores(output, example)``
gives its figures, headline first, each in [0, 1]. One module per family:

* :mod:`.answers`      ``exact``, ``regex``, ``choice``
* :mod:`.gsm8k`        ``gsm8k`` (lm-eval's strict-match and flexible-extract)
* :mod:`.mathverify`   ``math`` (math-verify)
* :mod:`.overlap`      ``bleu`` (sacrebleu), ``rouge`` (rouge-score)
* :mod:`.execution`    ``code`` (pass@1 in an isolated subprocess: :mod:`.sandbox`, :mod:`.jail`)

Every module of this package but the helpers in :data:`HELPER_MODULES` is imported
(:func:`adaptive_decoding.framework.core.registry.discover_plugins`), so a new metric family is one new file with
``@METRICS.register`` classes: nothing lists the metric modules. Third-party packages add metrics
through the ``adaptive_decoding.answer_metrics`` entry-point group (docs/metrics.md).
"""

from adaptive_decoding.framework.core.registry import discover_plugins
from adaptive_decoding.framework.tasks.metrics.base import (
    METRICS,
    Metric,
    MissingDependencyError,
    get_metric,
    require,
)

#: modules that register no metric: the contract, and the sandbox's two sides (``jail`` runs as a
#: script in the sandboxed child and is never imported)
HELPER_MODULES = ("base", "jail", "sandbox")

discover_plugins(__name__, skip=HELPER_MODULES)

__all__ = ["METRICS", "Metric", "MissingDependencyError", "get_metric", "require"]
