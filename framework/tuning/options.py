"""The options of :func:`adaptive_decoding.framework.tuning.study.tune_controller`, grouped by concern
(:mod:`adaptive_decoding.framework.core.options`): ``search`` (what is searched and for how long: trials, sampler seed,
fixed parameters, ranges, pruning), ``evaluation`` (how a point is scored: validation and test sizes,
the decoding options, the accuracy the chosen point may lose), ``study`` (where the trials live and
who runs them: storage, study name, workers) and ``output`` (the exported YAML's folder, the plot).

An experiment file's ``tune:`` mapping and ``adec tune``'s flags both build a :class:`TuneOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from adaptive_decoding.framework.core.options import OptionGroups, Options
from adaptive_decoding.framework.core.params import MappingParam, Param

DEFAULT_OUT = Path("runs") / "tune"
MP_CONTEXTS = ("spawn", "fork", "forkserver")


@dataclass(repr=False, eq=False)
class TuneSearch(Options):
    """The search: ``n_trials`` finished trials in all (resuming counts earlier ones), the TPE
    sampler's ``seed``, controller parameters held ``fixed`` (out of the space), ``ranges``
    (``{name: "LOW:HIGH"}``) replacing declared ones, and the pruning rule (a trial whose accuracy on
    the first ``prune_fraction`` of the validation examples is more than ``prune_margin`` below
    sequential's there is pruned; ``prune_margin`` null = never)."""

    section = "search"
    params = {
        "n_trials": Param(int, low=1, doc="finished trials the study should hold"),
        "seed": Param(int, low=0, doc="sampler seed"),
        "fixed": MappingParam(doc="controller parameters held fixed"),
        "ranges": MappingParam(doc="{name: 'LOW:HIGH'} replacing declared ranges (dotted names for nested ones)"),
        "prune_margin": Param(float, low=0.0, nullable=True, doc="prune this far below sequential; null = never"),
        "prune_fraction": Param(float, low=0.0, high=1.0, low_exclusive=True,
                                doc="fraction of the validation examples in the first chunk"),
    }

    n_trials: int = 20
    seed: int = 0
    fixed: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)
    prune_margin: Optional[float] = 0.25
    prune_fraction: float = 0.25


@dataclass(repr=False, eq=False)
class TuneEvaluation(Options):
    """How a point is scored: ``n_val`` validation examples per trial (drawn with ``data_seed``),
    ``n_test`` test examples for the reported figures, ``batch_size`` prompts per decode call, the
    :class:`~adaptive_decoding.framework.engine.config.DecodeConfig` options ``decode`` (default: the task's lengths),
    and ``max_drop``, the validation accuracy the chosen point may lose against sequential."""

    section = "evaluation"
    params = {
        "n_val": Param(int, low=1, doc="validation examples per trial"),
        "n_test": Param(int, low=0, doc="test examples for the reported figures (0 = none)"),
        "batch_size": Param(int, low=1, doc="prompts per decode call"),
        "data_seed": Param(int, low=0, doc="seed of the examples' draw"),
        "max_drop": Param(float, low=0.0, high=1.0, doc="accuracy the chosen point may lose vs sequential"),
        "decode": MappingParam(nullable=True, doc="DecodeConfig options (default: the task's lengths)"),
    }

    n_val: int = 64
    n_test: int = 200
    batch_size: int = 64
    data_seed: int = 0
    max_drop: float = 0.01
    decode: Optional[dict] = None


@dataclass(repr=False, eq=False)
class TuneStudy(Options):
    """Where the trials live and who runs them: ``storage`` (a spec string, see
    :mod:`adaptive_decoding.framework.tuning.storage`, or an Optuna storage object; null = SQLite
    ``<out_dir>/<study>.db``), ``study_name`` (null = ``<controller>-<task>-<model>``), ``workers``
    processes sharing it, started by ``mp_context``."""

    section = "study"
    params = {
        "storage": Param(object, nullable=True, doc="memory, a URL, journal:PATH or a storage object; "
                                                    "null = SQLite in the output folder"),
        "study_name": Param(str, nullable=True, doc="the study's name; null = CONTROLLER-TASK-MODEL"),
        "workers": Param(int, low=1, doc="processes sharing the storage"),
        "mp_context": Param(str, choices=MP_CONTEXTS, doc="how workers are started"),
    }

    storage: Any = None
    study_name: Optional[str] = None
    workers: int = 1
    mp_context: str = "spawn"


@dataclass(repr=False, eq=False)
class TuneOutput(Options):
    """The output folder (the exported ``<study>.yaml``, the SQLite default storage, the plot)."""

    section = "output"
    params = {
        "out_dir": Param(str, doc="output folder"),
        "plot": Param(bool, doc="plot the Pareto front"),
        "verbose": Param(bool, doc="print progress and the report"),
    }

    out_dir: str = str(DEFAULT_OUT)
    plot: bool = True
    verbose: bool = True

    def check_combination(self) -> None:
        self.out_dir = str(self.out_dir)


@dataclass(repr=False, eq=False)
class TuneOptions(OptionGroups):
    """Every option of :func:`adaptive_decoding.framework.tuning.study.tune_controller`, by concern."""

    search: TuneSearch = field(default_factory=TuneSearch)
    evaluation: TuneEvaluation = field(default_factory=TuneEvaluation)
    study: TuneStudy = field(default_factory=TuneStudy)
    output: TuneOutput = field(default_factory=TuneOutput)
