"""Declarative experiments: a YAML file -> validated cells -> per-sample JSONL and a summary table.

An experiment is the product ``tasks × strategies × seeds``; each element is a **cell**, evaluated
once on the same test examples. The schema (every key optional unless marked; see
docs/experiments.md for the long form)::

    name: smoke                      # required: the run folder is <out>/<name>
    description: free text
    model: tiny-{task}               # a name, a folder, a hub name, or a mapping (see below)
    device: cpu                      # cpu | cuda | auto (cuda:<local rank> when available)
    n: 100                           # test examples per cell (the sample count)
    split: test
    batch_size: 64
    repeats: 1                       # timing repeats (median); NFE and outputs come from the first
    data_seed: 0                     # which examples
    seeds: [0]                       # decoding seeds: one cell per seed
    decode: {eos_fill: false}        # adaptive_decoding.framework.engine.config.DecodeConfig options for every strategy
    metrics: [exact_match]           # names or {name:, params:}; METRICS registry
    on_missing: error                # error | skip: a strategy whose file (tuned YAML, policy) is missing
    tasks:                           # required: names or mappings
      - addition
      - {name: text, params: {gen_length: 16}, n: 50, metrics: [gen_perplexity], quality: gen_perplexity}
      - {name: data, label: gsm8k, params: {test: data/gsm8k_test.jsonl, prompt: question, metric: gsm8k}}
                                     # label: the task's name in cells and the report (default: the name
                                     # and its parameters, file paths by their file name)
    strategies:                      # required
      - suite: baselines             # expands adaptive_decoding.experiments.strategies.BASELINES
      - label: fast_dllm τ=0.8       # default: built from controller and params
        controller: fast_dllm        # a registered controller or tuned:PATH (may use {task}, {model})
        params: {threshold: 0.8}     # validated against the controller's Param specs
        decode: {block_length: 4}
        lookahead: {scorer: "logprob:1,repetition:0.5", width: 4}   # adaptive_decoding.framework.engine.lookahead.Lookahead
        kind: heuristic              # reference | baseline | heuristic | tuned | learned | oracle
        tasks: [addition]            # only these tasks
        prepare: adec tune --controller margin_topk --task {task}   # how to make a missing file
        curve: fast_dllm (hand-placed)   # optional: a point of this curve (strategies that share a
                                     # curve name are one line, when a sweep cannot reach their knob)
      - label: margin_topk (tuned)   # tuned per task on its validation split before its cells run
        controller: margin_topk      # (Optuna, accuracy up and NFE down, the study kept in the run
        params: {k_max: 8}           # folder's tuned/, so an interrupted run resumes it); params are
        tune: {n_trials: 20, n_val: 64, space: {eta: "0.9:0.999", k_base: [1, 4]}}   # held fixed; space
                                     # replaces declared ranges (checked against their bounds)
      - controller: eb               # a sweep: one strategy per value, all on the curve "eb"
        sweep: {gamma: [0.01, 0.1, 1.0]}   # labels "eb (gamma=0.01)", ...; one parameter (a controller
                                     # parameter or a decoding option), values checked like params

    published:                       # tables of a paper's numbers beside this run's (adaptive_decoding.experiments.published)
      - title: "9×9 Sudoku: Kim et al. 2025 (Table 2) beside this run"    # required
        source: "Kim et al. 2025, arXiv 2502.06768, Table 2"              # optional
        note: "what differs: model size, data, training"                  # optional
        columns: {all: sudoku9, hard: "sudoku9(grade=hard)"}   # required: title -> a task (name, or
                                     # name(param=value,...) as the report's rows label it)
        rows:                        # required
          - {label: top margin, strategy: "margin (1 cell/step)", published: {all: 89.49, hard: 49.88}}
                                     # strategy: a label of this file; published: column -> number (percent)

    targets:                         # milestones the report judges (adaptive_decoding.experiments.targets); all optional
      matched: {baseline_spread: 2.0, oracle_room: 2.0, tasks: 3}
      against_base: {gain_points: 5.0, gain_ratio: 1.2, gain_tasks: 2}

A ``sweep`` (:mod:`adaptive_decoding.experiments.sweeps`) expands at load time into one strategy per value, labelled
``<label> (<param>=<value>)`` and carrying ``curve: <label>``; the report draws a curve as one line
of accuracy against tokens per forward and scores it with AUP (:mod:`adaptive_decoding.experiments.aup`).

``published`` (:mod:`adaptive_decoding.experiments.published`) is stored with the file in the run folder
(``experiment.yaml``); the report renders each table with the run's quality in percent, NFE and tokens
per forward beside the paper's figures (``—`` where a strategy has not run or a figure is not given).

Model mapping: ``{name: ..., dtype: bfloat16, kind: llada, chat: true, trust_remote_code: true}``
for a hub checkpoint, or ``{factory: "module:function", kwargs: {...}}`` for any callable that
returns a :class:`adaptive_decoding.framework.models.protocol.LoadedModel` (``adaptive_decoding.experiments.cells:tiny_model`` builds a
TinyDenoiser from a config and trains it for a few steps: the tests' model).

Validation (:func:`load_experiment`) checks the whole file before anything runs and reports every
problem at once, each naming its YAML path (``strategies[2].params.threshold: ...``).

Running (:func:`run_experiment`): cells already finished in the run folder are skipped (a cell is
finished when its ``summary.json`` exists; its folder name carries a hash of everything that
changes its results, so an edited strategy is a new cell). A cell writes ``samples.jsonl`` and then
``summary.json``, each atomically, so an interrupted run loses at most the cell in progress.
Metrics added later are computed from the stored samples, without decoding again.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

KINDS: tuple[str, ...] = ("reference", "baseline", "heuristic", "tuned", "learned", "oracle")
TOP_KEYS = ("name", "description", "model", "device", "n", "split", "batch_size", "repeats", "data_seed",
            "seeds", "decode", "metrics", "on_missing", "tasks", "strategies", "published", "targets")
TASK_KEYS = ("name", "params", "n", "metrics", "quality", "model", "decode", "label")
#: task parameters that name a file or folder: a task's key shows only their last part
FILE_PARAMS = ("path", "train", "validation", "test", "few_shot_path", "include_path")
STRATEGY_KEYS = ("label", "controller", "params", "decode", "lookahead", "kind", "tasks", "prepare", "suite",
                 "sweep", "curve", "tune")
#: the keys of a strategy's ``tune:`` mapping (adaptive_decoding.framework.tuning.study.tune_controller's arguments)
TUNE_KEYS = ("n_trials", "n_val", "space", "max_drop", "prune_margin", "seed")
TUNE_DEFAULTS = {"n_trials": 20, "n_val": 64, "space": {}, "max_drop": 0.01, "prune_margin": 0.25, "seed": 0}


def suites() -> dict[str, tuple]:
    """Named strategy suites: every tuple of ``Strategy`` in :mod:`adaptive_decoding.experiments.strategies` (``BASELINES`` ->
    ``baselines``)."""
    from adaptive_decoding.experiments import strategies

    return {k.lower(): v for k, v in vars(strategies).items()
            if k.isupper() and isinstance(v,
                                          tuple) and v and all(isinstance(x, strategies.Strategy) for x in v)}
SPLITS = ("train", "validation", "test")


class ExperimentError(ValueError):
    """An experiment file that does not validate; ``problems`` lists ``(yaml path, message)``."""

    def __init__(self, source: str, problems: Sequence[tuple[str, str]]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [f"  {p}: {m}" if p else f"  {m}" for p, m in self.problems]
        n = len(self.problems)
        super().__init__(f"{source}: {n} problem{'s' if n != 1 else ''}:\n" + "\n".join(lines))


# ====================================================================== the validated form
@dataclass
class TaskSpec:
    name: str
    params: dict = field(default_factory=dict)
    n: Optional[int] = None
    metrics: Optional[list] = None
    quality: str = "accuracy"
    model: Any = None
    decode: dict = field(default_factory=dict)
    path: str = ""
    label: Optional[str] = None

    def build(self) -> Any:
        from adaptive_decoding.framework.tasks.base import get_task

        ensure_text_task()
        return get_task(self.name, **self.params)

    @property
    def key(self) -> str:
        """The task's name in cells and the report: ``label`` when given, else the name and its
        parameters (a file path by its file name, so a row does not carry a folder)."""
        if self.label:
            return self.label
        shown = {k: (Path(v).name if k in FILE_PARAMS and isinstance(v, str) else v) for k, v in self.params.items()}
        return self.name + ("" if not shown else "(" + ",".join(f"{k}={v}" for k, v in sorted(shown.items())) + ")")


@dataclass
class StrategySpec:
    label: str
    controller: str
    params: dict = field(default_factory=dict)
    decode: dict = field(default_factory=dict)
    lookahead: Optional[dict] = None
    kind: Optional[str] = None
    tasks: Optional[list] = None
    prepare: Optional[str] = None
    path: str = ""
    #: the curve this strategy is a point of (the sweep's base label); ``None``: a curve of its own
    curve: Optional[str] = None
    #: ``{param: value}`` of a sweep point
    sweep: Optional[dict] = None
    #: tune the controller per task before evaluating (TUNE_KEYS, ``space`` as ``{name: "LOW:HIGH"}``)
    tune: Optional[dict] = None


@dataclass
class Cell:
    """One (task, strategy, seed) evaluation, with everything resolved for that task."""

    index: int
    task: TaskSpec
    strategy: StrategySpec
    seed: int
    model: Any
    controller: str
    params: dict
    decode: dict
    lookahead: Optional[dict]
    kind: str
    n: int
    metrics: list
    id: str = ""
    key: str = ""

    def describe(self) -> str:
        return f"{self.task.key} | {self.strategy.label} | seed {self.seed}"


@dataclass
class Experiment:
    name: str
    tasks: list[TaskSpec]
    strategies: list[StrategySpec]
    model: Any = "tiny-{task}"
    description: str = ""
    device: str = "cpu"
    n: int = 100
    split: str = "test"
    batch_size: int = 64
    repeats: int = 1
    data_seed: int = 0
    seeds: list = field(default_factory=lambda: [0])
    decode: dict = field(default_factory=dict)
    metrics: list = field(default_factory=list)
    on_missing: str = "error"
    source: str = "<experiment>"
    raw: dict = field(default_factory=dict)
    #: ``(strategy path, task key, message, prepare command)`` of cells skipped by ``on_missing: skip``
    skipped: list = field(default_factory=list)
    #: the ``published`` tables, normalised (:func:`adaptive_decoding.experiments.published.check_published`)
    published: list = field(default_factory=list)
    #: the milestone targets the report judges (:mod:`adaptive_decoding.experiments.targets`; ``None``: none declared)
    targets: Any = None

    def cells(self) -> list[Cell]:
        """Every cell, in file order (tasks outer, strategies, seeds inner); skipped ones excluded."""
        out: list[Cell] = []
        skip = {(p, t) for p, t, *_ in self.skipped}
        for t in self.tasks:
            for s in self.strategies:
                if s.tasks is not None and t.name not in s.tasks:
                    continue
                if (s.path, t.key) in skip:
                    continue
                for seed in self.seeds:
                    out.append(self._cell(len(out), t, s, seed))
        return out

    def _cell(self, index: int, t: TaskSpec, s: StrategySpec, seed: int) -> Cell:
        model = t.model if t.model is not None else self.model
        subst = {"task": t.name}
        model = substitute(model, subst)
        subst["model"] = model_label(model)
        controller = substitute(s.controller, subst)
        params = substitute(dict(s.params), subst)
        lookahead = substitute(dict(s.lookahead), subst) if s.lookahead else None
        decode = {**self.decode, **t.decode, **s.decode}
        kind = s.kind or _controller_kind(controller, params)
        metrics = _metric_list(t.metrics if t.metrics is not None else self.metrics)
        cell = Cell(index=index, task=t, strategy=s, seed=int(seed), model=model, controller=controller,
                    params=params, decode=decode, lookahead=lookahead, kind=kind,
                    n=int(t.n if t.n is not None else self.n), metrics=metrics)
        ident = {"model": model, "task": t.name, "task_params": t.params, "n": cell.n, "split": self.split,
                 "data_seed": self.data_seed, "batch_size": self.batch_size, "repeats": self.repeats,
                 "label": s.label, "controller": controller, "params": params, "decode": decode,
                 "lookahead": lookahead, "seed": cell.seed, "device": self.device}
        if s.tune:
            ident["tune"] = s.tune
        cell.key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:10]
        cell.id = f"{_slug(t.key)}__{_slug(s.label)}__s{cell.seed}__{cell.key}"
        return cell


# ====================================================================== helpers
def _slug(text: str, limit: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-")
    return (s or "x")[:limit]


def substitute(value: Any, subst: dict[str, str]) -> Any:
    if isinstance(value, str):
        out = value
        for k, v in subst.items():
            out = out.replace("{" + k + "}", str(v))
        return out
    if isinstance(value, dict):
        return {k: substitute(v, subst) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, subst) for v in value]
    return value


def model_label(model: Any) -> str:
    if isinstance(model, dict):
        model = model.get("name") or model.get("factory") or "model"
    return Path(str(model)).name if os.sep in str(model) else str(model)


def _controller_kind(name: str, params: Optional[dict] = None) -> str:
    """The family a strategy's rows are reported under: the controller's ``kind``, or for a wrapper
    that declares ``kind_from_inner`` (``verified``) its inner controller's (WINO's check around a
    learned policy is learned, around Fast-dLLM a baseline)."""
    if name.startswith("tuned:"):
        return "tuned"
    from adaptive_decoding.framework.engine.controller import CONTROLLERS

    try:
        cls = CONTROLLERS.get(name)
    except Exception:  # noqa: BLE001 - validation reports the unknown name
        return "heuristic"
    params = params if isinstance(params, dict) else {}
    if getattr(cls, "kind_from_inner", False):
        inner = params.get("inner", cls.default("inner"))
        if isinstance(inner, str) and inner:
            return _controller_kind(inner, params.get("inner_params"))
    return str(getattr(cls, "kind", "heuristic"))


def _metric_list(items: Any) -> list[tuple[str, dict]]:
    out = []
    for m in items or []:
        if isinstance(m, str):
            out.append((m, {}))
        else:
            out.append((m["name"], dict(m.get("params") or {})))
    return out


def ensure_text_task() -> None:
    """The ``text`` task registers itself when adaptive_decoding.framework.tasks.text is imported."""
    try:
        importlib.import_module("adaptive_decoding.framework.tasks.text")
    except ImportError as exc:  # pragma: no cover - only if the module is absent
        warnings.warn(f"the text task is unavailable: {exc}")


def did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return (f"; did you mean {close[0]!r}?" if close else "") + f" Known: {', '.join(known)}"


def default_label(controller: str, params: dict, lookahead: Optional[dict]) -> str:
    label = controller
    if params:
        label += " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    if lookahead:
        label += " + lookahead"
    return label
