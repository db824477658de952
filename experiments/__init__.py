"""Experiments: declarative YAML (:mod:`.spec`, :mod:`.parse`, :mod:`.sweeps`, the milestone
:mod:`.targets`), cells (:mod:`.cells`), the runner (:mod:`.runner`), metrics (:mod:`.metrics`),
strategy suites (:mod:`.strategies`), the benchmark report (:mod:`.report`, built on one comparison
layer, :mod:`.compare`, and one table writer, :mod:`.tables`) and distributed evaluation
(:mod:`.distributed`, :mod:`.workers`). The experiment files themselves are in
``experiments/configs/``; one-off studies in ``experiments/studies/``."""

from importlib import import_module
from typing import Any

#: what a notebook needs to run an experiment file (imported on first use)
_PUBLIC = {"run_experiment": ".runner", "load_experiment": ".parse", "parse_experiment": ".parse",
           "ExperimentOptions": ".options"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name], __name__), name)
