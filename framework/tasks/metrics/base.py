"""The metric contract (:class:`Metric`), the ``METRICS`` registry and the shared helpers.

A metric scores one generated text against one :class:`~adaptive_decoding.framework.tasks.base.Example` (its
``answer`` and its row's fields in ``meta``) and returns a float in [0, 1] (1 = correct).
:meth:`Metric.scores` may report several named figures (gsm8k's flexible and strict match); the
first is the headline. Third-party packages add metrics through the ``adaptive_decoding.answer_metrics``
entry-point group.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any, ClassVar

from adaptive_decoding.framework.core.params import Configurable, ParameterError
from adaptive_decoding.framework.core.registry import Registry
from adaptive_decoding.framework.tasks.base import Example


class MissingDependencyError(ParameterError):
    """A metric's optional package is not installed; the message names the pip extra to install."""


class Metric(Configurable, ABC):
    """Base of every metric: :meth:`score` (the one abstract method) one output text against one example."""

    #: the figures :meth:`scores` reports, headline first
    figures: ClassVar[tuple[str, ...]] = ("score",)
    #: importable module names this metric needs (checked when it is built), and their pip extra
    requires: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str] = "text"

    @abstractmethod
    def score(self, output: str, example: Example) -> float:
        """1.0 for a correct ``output``, 0.0 for a wrong one (graded metrics return a value between)."""

    def scores(self, output: str, example: Example) -> dict[str, float]:
        """Every figure of this metric for one output, headline first (default: ``score`` alone)."""
        return {self.figures[0]: self.score(output, example)}

    def describe(self) -> str:
        return (type(self).__doc__ or "").strip().splitlines()[0]

    @classmethod
    def notes(cls) -> list[str]:
        """Lines about this metric on this machine that ``adec list -v`` prints (default: none)."""
        return []

    def check_combination(self) -> None:
        """Fail at build time when a package in :attr:`requires` is missing."""
        for module in self.requires:
            require(module, metric=self.display_name(), extra=self.extra)


def require(module: str, *, metric: str, extra: str = "text") -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"metric {metric!r} needs the package that provides {module!r}, which is not installed "
            f"({exc}); install it with: pip install 'adaptive-decoding[{extra}]'"
        ) from None


def fold_space(text: str) -> str:
    """``text`` with leading/trailing whitespace removed and every inner run folded to one space."""
    return " ".join(text.split())


METRICS: Registry[Metric] = Registry("answer metric", base=Metric, entry_point_group="adaptive_decoding.answer_metrics",
                                     builtin_modules=("adaptive_decoding.framework.tasks.metrics",))


def get_metric(name: str, **params: Any) -> Metric:
    """A validated metric by registered name (an unknown name lists the known ones)."""
    return METRICS.get(name).build(**params)  # type: ignore[return-value]
