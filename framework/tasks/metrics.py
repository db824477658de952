"""Answer metrics as plugins: ``METRICS``, a registry like the controllers' and scorers'.

A metric scores one generated text against one :class:`~framework.tasks.base.Example` (its
``answer`` and its row's fields in ``meta``) and returns a float in [0, 1] (1 = correct).
:meth:`Metric.scores` may report several named figures (gsm8k's strict and flexible match); the
first is the headline. Third-party packages add metrics through the ``adaptive_decoding.metrics``
entry-point group.
"""

from __future__ import annotations

from typing import Any, ClassVar

from framework.core.params import Configurable
from framework.core.registry import Registry
from framework.tasks.base import Example


class Metric(Configurable):
    """Base of every metric: :meth:`score` one output text against one example."""

    #: the figures :meth:`scores` reports, headline first
    figures: ClassVar[tuple[str, ...]] = ("score",)

    def score(self, output: str, example: Example) -> float:  # pragma: no cover
        """1.0 for a correct ``output``, 0.0 for a wrong one (graded metrics return a value between)."""
        raise NotImplementedError

    def scores(self, output: str, example: Example) -> dict[str, float]:
        """Every figure of this metric for one output, headline first (default: ``score`` alone)."""
        return {self.figures[0]: self.score(output, example)}

    def describe(self) -> str:
        return (type(self).__doc__ or "").strip().splitlines()[0]


METRICS: Registry[Metric] = Registry("metric", base=Metric, entry_point_group="adaptive_decoding.metrics",
                                     builtin_modules=("framework.tasks.metrics",))


@METRICS.register("exact")
class ExactMatch(Metric):
    """Exact match of the output and the answer, whitespace folded."""

    figures = ("exact_match",)

    def score(self, output: str, example: Example) -> float:
        return float(" ".join(output.split()) == " ".join(example.answer.split()))


def get_metric(name: str, **params: Any) -> Metric:
    """A validated metric by registered name (an unknown name lists the known ones)."""
    return METRICS.get(name).build(**params)  # type: ignore[return-value]
