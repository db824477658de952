"""The options of :func:`adaptive_decoding.framework.jobs.runner.run_generation_job`, grouped by concern
(:mod:`adaptive_decoding.framework.core.options`): ``batching`` (the largest batch and when it grows back after an
OOM), ``faults`` (time limits, retries, the fallback decoder, invalid per-item params), ``output``
(resume or start afresh, fsync, progress, where messages go, input lines already skipped) and
``settings`` (what the results file's settings hash records beyond the controller and the config:
the seed override, the lookahead's spec). ``adec generate`` builds one from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from adaptive_decoding.framework.core.options import OptionGroups, Options
from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.tasks.prompts import ON_ERROR


@dataclass(repr=False, eq=False)
class JobBatching(Options):
    """The largest batch B (the adaptive size never exceeds it; it halves on an OOM) and the clean
    batches before it grows again."""

    section = "batching"
    qualified = False
    params = {
        "batch_size": Param(int, low=1, doc="the largest batch"),
        "grow_after": Param(int, low=1, doc="clean batches before the size grows again after an OOM"),
    }

    batch_size: int = 8
    grow_after: int = 4


@dataclass(repr=False, eq=False)
class JobFaults(Options):
    """Wall-clock limits (null = none), re-runs of an item that failed on its own, the plain decoder
    used after a controller failure (a name, a controller, or null = none) and what invalid per-item
    params do (``refuse``: stop before any work; ``skip``: report them, run the rest)."""

    section = "faults"
    qualified = False
    params = {
        "item_timeout_s": Param(float, low=0.0, low_exclusive=True, nullable=True, doc="per-item limit (s)"),
        "job_timeout_s": Param(float, low=0.0, low_exclusive=True, nullable=True, doc="whole-job limit (s)"),
        "max_retries": Param(int, low=0, doc="re-runs of an item that failed on its own, per mode"),
        "fallback_controller": Param(object, nullable=True, doc="the decoder after a controller failure"),
        "on_error": Param(str, choices=ON_ERROR, doc="invalid per-item params: refuse or skip"),
    }

    item_timeout_s: Optional[float] = None
    job_timeout_s: Optional[float] = None
    max_retries: int = 1
    fallback_controller: Any = "sequential"
    on_error: str = "refuse"


@dataclass(repr=False, eq=False)
class JobOutput(Options):
    """The results file and the messages: ``overwrite`` (start afresh), ``retry_errors`` (decode the
    error rows again), ``fsync`` after every batch, a ``progress`` bar, ``log`` (a callable; null =
    stderr above the bar) and ``skipped``, the bad input lines the reader already skipped (reported
    in the summary)."""

    section = "output"
    qualified = False
    params = {
        "overwrite": Param(bool, doc="start the output from scratch"),
        "retry_errors": Param(bool, doc="drop the error rows already in the output and decode them again"),
        "fsync": Param(bool, doc="fsync after every batch"),
        "progress": Param(bool, doc="a progress bar"),
        "log": Param(object, nullable=True, doc="where messages go (a callable); null = stderr"),
        "skipped": Param(object, doc="input lines already skipped by the reader"),
    }

    overwrite: bool = False
    retry_errors: bool = False
    fsync: bool = True
    progress: bool = True
    log: Any = None
    skipped: Any = ()


@dataclass(repr=False, eq=False)
class JobSettings(Options):
    """What the rows are decoded with beyond the controller and the config: ``seed`` overrides the
    config's (item i uses stable_seed(seed, id_i)); ``lookahead_spec`` says how the lookahead was
    configured (e.g. the ``--scorer`` spec), for the settings hash."""

    section = "settings"
    qualified = False
    params = {
        "seed": Param(int, low=0, nullable=True, doc="overrides the config's seed; null = the config's"),
        "lookahead_spec": Param(str, nullable=True, doc="how the lookahead was configured (settings hash)"),
    }

    seed: Optional[int] = None
    lookahead_spec: Optional[str] = None


@dataclass(repr=False, eq=False)
class JobOptions(OptionGroups):
    """Every option of :func:`adaptive_decoding.framework.jobs.runner.run_generation_job`, by concern."""

    batching: JobBatching = field(default_factory=JobBatching)
    faults: JobFaults = field(default_factory=JobFaults)
    output: JobOutput = field(default_factory=JobOutput)
    settings: JobSettings = field(default_factory=JobSettings)
