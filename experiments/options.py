"""The options of running an experiment, grouped by concern (:mod:`adaptive_decoding.framework.core.options`):

* :class:`ExperimentOptions` of :func:`adaptive_decoding.experiments.runner.run_experiment` and of each rank's
  :func:`adaptive_decoding.experiments.workers.run_experiment_worker`: ``cells`` (:class:`ExperimentCells`: resume or
  recompute, how many cells at most, the command line recorded) and ``logging``
  (:class:`~adaptive_decoding.framework.core.options.ProgressLogging`: W&B mode, the progress bar); ``adec run`` builds
  one from its flags;
* :class:`ShardedEvaluation` of :func:`adaptive_decoding.experiments.distributed.evaluate_sharded`: the examples a cell
  decodes (:class:`~adaptive_decoding.framework.core.options.ExampleDraw`), its timed repeats and its strategy's label;
  built from the experiment file's ``split``, ``batch_size``, ``repeats``, ``data_seed`` and the cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from adaptive_decoding.framework.core.options import ExampleDraw, OptionGroups, Options, ProgressLogging
from adaptive_decoding.framework.core.params import Param, ParameterError


@dataclass(repr=False, eq=False)
class ExperimentCells(Options):
    """Which cells a run evaluates: ``resume`` requires the run folder to exist; ``overwrite``
    recomputes every cell (the finished ones are moved to ``cells.old-<time>/``); ``max_cells`` stops
    after evaluating that many (null = all); ``command`` is the command line recorded for the report."""

    section = "cells"
    qualified = False
    params = {
        "resume": Param(bool, doc="require an existing run folder"),
        "overwrite": Param(bool, doc="recompute every cell"),
        "max_cells": Param(int, low=0, nullable=True, doc="cells evaluated at most; null = all"),
        "command": Param(str, nullable=True, doc="the command line, recorded for the report"),
    }

    resume: bool = False
    overwrite: bool = False
    max_cells: Optional[int] = None
    command: Optional[str] = None

    def check_combination(self) -> None:
        if self.resume and self.overwrite:
            raise ParameterError("resume=True and overwrite=True exclude each other; allowed: at most one of them")


@dataclass(repr=False, eq=False)
class ExperimentOptions(OptionGroups):
    """Every option of :func:`adaptive_decoding.experiments.runner.run_experiment` beyond the experiment and the
    output folder, by concern."""

    cells: ExperimentCells = field(default_factory=ExperimentCells)
    logging: ProgressLogging = field(default_factory=ProgressLogging)


@dataclass(repr=False, eq=False)
class ShardedEvaluation(ExampleDraw):
    """:func:`adaptive_decoding.framework.engine.evaluate.evaluate`'s options over ranks: the examples
    (:class:`~adaptive_decoding.framework.core.options.ExampleDraw`), ``repeats`` timed runs (the median time counts)
    and the ``strategy`` label the result carries."""

    section = "evaluation"
    params = {
        **ExampleDraw.params,
        "repeats": Param(int, low=1, doc="timed runs (the median counts)"),
        "strategy": Param(str, nullable=True, doc="the strategy's label in the result"),
    }

    repeats: int = 1
    strategy: Optional[str] = None
