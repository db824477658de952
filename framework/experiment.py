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
    decode: {eos_fill: false}        # framework.decoding.DecodeConfig options for every strategy
    metrics: [exact_match]           # names or {name:, params:}; METRICS registry
    on_missing: error                # error | skip: a strategy whose file (tuned YAML, policy) is missing
    tasks:                           # required: names or mappings
      - addition
      - {name: text, params: {gen_length: 16}, n: 50, metrics: [gen_perplexity], quality: gen_perplexity}
    strategies:                      # required
      - suite: baselines             # expands framework.strategies.BASELINES
      - label: fast_dllm τ=0.8       # default: built from controller and params
        controller: fast_dllm        # a registered controller or tuned:PATH (may use {task}, {model})
        params: {threshold: 0.8}     # validated against the controller's Param specs
        decode: {block_length: 4}
        lookahead: {scorer: "logprob:1,repetition:0.5", width: 4}   # framework.lookahead.Lookahead
        kind: heuristic              # reference | baseline | heuristic | tuned | learned | oracle
        tasks: [addition]            # only these tasks
        prepare: adec tune --controller margin_topk --task {task}   # how to make a missing file

Model mapping: ``{name: ..., dtype: bfloat16, kind: llada, chat: true, trust_remote_code: true}``
for a hub checkpoint, or ``{factory: "module:function", kwargs: {...}}`` for any callable that
returns a :class:`framework.denoiser.LoadedModel` (``framework.experiment:tiny_model`` builds a
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

import csv
import difflib
import hashlib
import importlib
import io
import json
import math
import os
import platform
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from .params import ParameterError

KINDS: tuple[str, ...] = ("reference", "baseline", "heuristic", "tuned", "learned", "oracle")
TOP_KEYS = ("name", "description", "model", "device", "n", "split", "batch_size", "repeats", "data_seed",
            "seeds", "decode", "metrics", "on_missing", "tasks", "strategies")
TASK_KEYS = ("name", "params", "n", "metrics", "quality", "model", "decode")
STRATEGY_KEYS = ("label", "controller", "params", "decode", "lookahead", "kind", "tasks", "prepare", "suite")


def suites() -> dict[str, tuple]:
    """Named strategy suites: every tuple of ``Strategy`` in :mod:`framework.strategies` (``BASELINES`` ->
    ``baselines``)."""
    from . import strategies

    return {k.lower(): v for k, v in vars(strategies).items()
            if k.isupper() and isinstance(v, tuple) and v and all(isinstance(x, strategies.Strategy) for x in v)}
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

    def build(self) -> Any:
        from .tasks import get_task

        _ensure_text_task()
        return get_task(self.name, **self.params)

    @property
    def key(self) -> str:
        return self.name + ("" if not self.params else "(" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items())) + ")")


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
        model = _substitute(model, subst)
        subst["model"] = _model_label(model)
        controller = _substitute(s.controller, subst)
        params = _substitute(dict(s.params), subst)
        lookahead = _substitute(dict(s.lookahead), subst) if s.lookahead else None
        decode = {**self.decode, **t.decode, **s.decode}
        kind = s.kind or _controller_kind(controller)
        metrics = _metric_list(t.metrics if t.metrics is not None else self.metrics)
        cell = Cell(index=index, task=t, strategy=s, seed=int(seed), model=model, controller=controller,
                    params=params, decode=decode, lookahead=lookahead, kind=kind,
                    n=int(t.n if t.n is not None else self.n), metrics=metrics)
        ident = {"model": model, "task": t.name, "task_params": t.params, "n": cell.n, "split": self.split,
                 "data_seed": self.data_seed, "batch_size": self.batch_size, "repeats": self.repeats,
                 "label": s.label, "controller": controller, "params": params, "decode": decode,
                 "lookahead": lookahead, "seed": cell.seed, "device": self.device}
        cell.key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:10]
        cell.id = f"{_slug(t.key)}__{_slug(s.label)}__s{cell.seed}__{cell.key}"
        return cell


# ====================================================================== helpers
def _slug(text: str, limit: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-")
    return (s or "x")[:limit]


def _substitute(value: Any, subst: dict[str, str]) -> Any:
    if isinstance(value, str):
        out = value
        for k, v in subst.items():
            out = out.replace("{" + k + "}", str(v))
        return out
    if isinstance(value, dict):
        return {k: _substitute(v, subst) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, subst) for v in value]
    return value


def _model_label(model: Any) -> str:
    if isinstance(model, dict):
        model = model.get("name") or model.get("factory") or "model"
    return Path(str(model)).name if os.sep in str(model) else str(model)


def _controller_kind(name: str) -> str:
    if name.startswith("tuned:"):
        return "tuned"
    from .controller import CONTROLLERS

    try:
        return str(getattr(CONTROLLERS.get(name), "kind", "heuristic"))
    except Exception:  # noqa: BLE001 - validation reports the unknown name
        return "heuristic"


def _metric_list(items: Any) -> list[tuple[str, dict]]:
    out = []
    for m in items or []:
        if isinstance(m, str):
            out.append((m, {}))
        else:
            out.append((m["name"], dict(m.get("params") or {})))
    return out


def _ensure_text_task() -> None:
    """The ``text`` task registers itself when framework.text is imported."""
    try:
        importlib.import_module("framework.text")
    except ImportError as exc:  # pragma: no cover - only if the module is absent
        warnings.warn(f"the text task is unavailable: {exc}")


def _known(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return (f"; did you mean {close[0]!r}?" if close else "") + f" Known: {', '.join(known)}"


def default_label(controller: str, params: dict, lookahead: Optional[dict]) -> str:
    label = controller
    if params:
        label += " (" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
    if lookahead:
        label += " + lookahead"
    return label


# ====================================================================== validation
class _Checker:
    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def add(self, path: str, msg: str) -> None:
        self.problems.append((path, msg))

    def keys(self, obj: dict, allowed: Sequence[str], path: str) -> None:
        for k in obj:
            if k not in allowed:
                close = difflib.get_close_matches(str(k), list(allowed), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                self.add(f"{path}.{k}" if path else str(k),
                         f"unknown key{hint} Allowed here: {', '.join(allowed)}")

    def int_(self, value: Any, path: str, low: int = 0) -> bool:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            self.add(path, f"{value!r} is not allowed; allowed: an integer ≥ {low}")
            return False
        return True


def load_experiment(path: "str | os.PathLike", overrides: Optional[dict] = None) -> Experiment:
    """Read, validate and return an experiment file (``overrides`` replace top-level keys)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"experiment file {str(p)!r} not found")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ExperimentError(str(p), [("", f"not valid YAML: {exc}")]) from None
    if overrides:
        raw = {**(raw or {}), **overrides}
    return parse_experiment(raw, source=str(p))


def parse_experiment(raw: Any, source: str = "<experiment>") -> Experiment:
    """Validate a loaded YAML document; raise :class:`ExperimentError` listing every problem."""
    c = _Checker()
    if not isinstance(raw, dict):
        raise ExperimentError(source, [("", f"the file must be a mapping of keys, found {type(raw).__name__}")])
    c.keys(raw, TOP_KEYS, "")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        c.add("name", "required: a non-empty string (the run folder is <out>/<name>)")
    elif not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        c.add("name", f"{name!r} is not allowed; allowed: letters, digits, '.', '_', '-'")
    for key, low in (("n", 1), ("batch_size", 1), ("repeats", 1), ("data_seed", 0)):
        if key in raw:
            c.int_(raw[key], key, low)
    split = raw.get("split", "test")
    if split not in SPLITS:
        c.add("split", f"{split!r} is not allowed; allowed: {', '.join(SPLITS)}")
    device = raw.get("device", "cpu")
    if not isinstance(device, str) or not re.fullmatch(r"cpu|auto|cuda(:\d+)?|mps", device):
        c.add("device", f"{device!r} is not allowed; allowed: cpu, cuda, cuda:N, auto, mps")
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if not isinstance(seeds, list) or not seeds:
        c.add("seeds", f"{seeds!r} is not allowed; allowed: a non-empty list of integers ≥ 0")
        seeds = [0]
    else:
        for i, s in enumerate(seeds):
            c.int_(s, f"seeds[{i}]")
        if len(set(map(str, seeds))) != len(seeds):
            c.add("seeds", f"{seeds} repeats a seed")
    on_missing = raw.get("on_missing", "error")
    if on_missing not in ("error", "skip"):
        c.add("on_missing", f"{on_missing!r} is not allowed; allowed: error, skip")
    decode = raw.get("decode") or {}
    _check_decode_keys(c, decode, "decode")
    metrics = raw.get("metrics") or []
    _check_metrics(c, metrics, "metrics")
    _check_model(c, raw.get("model", "tiny-{task}"), "model")

    tasks = _parse_tasks(c, raw.get("tasks"), metrics)
    strategies = _parse_strategies(c, raw.get("strategies"), [t.name for t in tasks])
    exp = Experiment(
        name=str(name or "experiment"), tasks=tasks, strategies=strategies, model=raw.get("model", "tiny-{task}"),
        description=str(raw.get("description") or ""), device=device if isinstance(device, str) else "cpu",
        n=raw.get("n", 100), split=split, batch_size=raw.get("batch_size", 64), repeats=raw.get("repeats", 1),
        data_seed=raw.get("data_seed", 0), seeds=list(seeds), decode=dict(decode) if isinstance(decode, dict) else {},
        metrics=list(metrics) if isinstance(metrics, list) else [], on_missing=on_missing, source=source, raw=raw,
    )
    if not c.problems:
        _check_combinations(c, exp)
    if c.problems:
        raise ExperimentError(source, c.problems)
    return exp


def _check_decode_keys(c: _Checker, decode: Any, path: str) -> None:
    from .decoding import DecodeConfig

    if not isinstance(decode, dict):
        c.add(path, f"{decode!r} is not allowed; allowed: a mapping of decoding options")
        return
    known = DecodeConfig._param_names()
    for k, v in decode.items():
        if k not in known:
            c.add(f"{path}.{k}", "unknown decoding option" + _known(str(k), known))
        else:
            try:
                DecodeConfig.params[k].check("", k, v)
            except ParameterError as exc:
                c.add(f"{path}.{k}", str(exc))


def _check_metrics(c: _Checker, metrics: Any, path: str) -> None:
    from .metrics import METRICS, MetricUnavailable, build_metric

    if not isinstance(metrics, list):
        c.add(path, f"{metrics!r} is not allowed; allowed: a list of metric names or {{name:, params:}}")
        return
    for i, m in enumerate(metrics):
        where = f"{path}[{i}]"
        if isinstance(m, dict):
            c.keys(m, ("name", "params"), where)
            name, params = m.get("name"), m.get("params") or {}
        else:
            name, params = m, {}
        if not isinstance(name, str) or name not in METRICS:
            c.add(where, f"unknown metric {name!r}" + _known(str(name), METRICS.names()))
            continue
        try:
            build_metric(name, **params)
        except MetricUnavailable as exc:
            c.add(where, str(exc))
        except ParameterError as exc:
            c.add(f"{where}.params", str(exc))


def _check_model(c: _Checker, model: Any, path: str) -> None:
    if isinstance(model, dict):
        if "factory" in model:
            c.keys(model, ("factory", "kwargs"), path)
            target = str(model["factory"])
            mod, _, attr = target.partition(":")
            try:
                if not callable(getattr(importlib.import_module(mod), attr)):
                    raise AttributeError(attr)
            except (ImportError, AttributeError, ValueError):
                c.add(f"{path}.factory", f"{target!r} is not an importable 'module:function'")
            return
        c.keys(model, ("name", "dtype", "kind", "chat", "trust_remote_code"), path)
        if not isinstance(model.get("name"), str):
            c.add(f"{path}.name", "required: a model name, folder or hub name")
        return
    if not isinstance(model, str) or not model:
        c.add(path, f"{model!r} is not allowed; allowed: a model name, a folder, or a mapping")


def _model_problem(model: Any) -> Optional[str]:
    """Why ``model`` (placeholders resolved) cannot be loaded, without loading it; ``None`` if fine."""
    from .models import MODELS
    from .text import TEXT_MODEL

    if isinstance(model, dict):
        if "factory" in model:
            return None
        model = model["name"]
    if model == TEXT_MODEL or model in MODELS or Path(model).expanduser().is_dir():
        return None
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):  # a hub name: needs the HF cache
        try:
            from .hub import resolve_model_path

            resolve_model_path(model)
            return None
        except Exception as exc:  # noqa: BLE001 - reported as a problem
            return str(exc)
    return f"unknown model {model!r} (and no such folder); known models: {', '.join([*MODELS.names(), TEXT_MODEL])}"


def _parse_tasks(c: _Checker, items: Any, top_metrics: Any = None) -> list[TaskSpec]:
    from .tasks import TASKS

    _ensure_text_task()
    if not isinstance(items, list) or not items:
        c.add("tasks", "required: a non-empty list of task names or {name:, params:} mappings")
        return []
    out = []
    for i, t in enumerate(items):
        where = f"tasks[{i}]"
        if isinstance(t, str):
            t = {"name": t}
        if not isinstance(t, dict):
            c.add(where, f"{t!r} is not allowed; allowed: a task name or a mapping")
            continue
        c.keys(t, TASK_KEYS, where)
        name = t.get("name")
        if not isinstance(name, str) or name not in TASKS:
            c.add(f"{where}.name", f"unknown task {name!r}" + _known(str(name), TASKS.names()))
            continue
        params = t.get("params") or {}
        spec = TaskSpec(name=name, params=dict(params) if isinstance(params, dict) else {}, n=t.get("n"),
                        metrics=t.get("metrics"), quality=t.get("quality", "accuracy"), model=t.get("model"),
                        decode=dict(t.get("decode") or {}), path=where)
        cls = TASKS.get(name)
        for k, v in spec.params.items():
            if k not in cls._param_names():
                c.add(f"{where}.params.{k}", f"unknown parameter of task {name}" + _known(str(k), cls._param_names()))
            elif k in cls.params:
                try:
                    cls.params[k].check(name, k, v)
                except ParameterError as exc:
                    c.add(f"{where}.params.{k}", str(exc))
        if spec.n is not None:
            c.int_(spec.n, f"{where}.n", 1)
        if spec.metrics is not None:
            _check_metrics(c, spec.metrics, f"{where}.metrics")
        if "decode" in t:
            _check_decode_keys(c, t["decode"], f"{where}.decode")
        if spec.model is not None:
            _check_model(c, spec.model, f"{where}.model")
        listed = spec.metrics if spec.metrics is not None else (top_metrics if isinstance(top_metrics, list) else [])
        names = [m if isinstance(m, str) else (m.get("name") if isinstance(m, dict) else None) for m in listed]
        if spec.quality != "accuracy" and spec.quality not in names:
            c.add(f"{where}.quality", f"{spec.quality!r} is not allowed; allowed: accuracy or one of the task's "
                                      f"metrics ({', '.join(map(str, names)) or 'none listed'})")
        out.append(spec)
    keys = [t.key for t in out]
    for k in sorted({k for k in keys if keys.count(k) > 1}):
        c.add("tasks", f"task {k} is listed twice")
    return out


def _parse_strategies(c: _Checker, items: Any, task_names: list[str]) -> list[StrategySpec]:
    from .controller import CONTROLLERS

    if not isinstance(items, list) or not items:
        c.add("strategies", "required: a non-empty list of {controller:, params:, ...} mappings")
        return []
    out: list[StrategySpec] = []
    for i, s in enumerate(items):
        where = f"strategies[{i}]"
        if not isinstance(s, dict):
            c.add(where, f"{s!r} is not allowed; allowed: a mapping with 'controller' (or 'suite')")
            continue
        c.keys(s, STRATEGY_KEYS, where)
        if "suite" in s:
            known_suites = suites()
            if s["suite"] not in known_suites:
                c.add(f"{where}.suite", f"unknown suite {s['suite']!r}; allowed: {', '.join(known_suites)}")
                continue
            for j, b in enumerate(known_suites[s["suite"]]):
                out.append(StrategySpec(label=b.label, controller=b.controller, params=dict(b.params),
                                        decode=dict(b.decode), kind=s.get("kind"), tasks=s.get("tasks"),
                                        path=f"{where}.suite[{j}]"))
            continue
        name = s.get("controller")
        if not isinstance(name, str) or not name:
            c.add(f"{where}.controller", "required: a registered controller name or tuned:PATH"
                  + _known("", CONTROLLERS.names()))
            continue
        params = s.get("params") or {}
        if not isinstance(params, dict):
            c.add(f"{where}.params", f"{params!r} is not allowed; allowed: a mapping")
            params = {}
        look = s.get("lookahead")
        if look is not None and not isinstance(look, dict):
            c.add(f"{where}.lookahead", f"{look!r} is not allowed; allowed: a mapping such as {{scorer: logprob}}")
            look = None
        kind = s.get("kind")
        if kind is not None and kind not in KINDS:
            c.add(f"{where}.kind", f"{kind!r} is not allowed; allowed: {', '.join(KINDS)}")
        tasks = s.get("tasks")
        if tasks is not None:
            if not isinstance(tasks, list) or any(t not in task_names for t in tasks):
                c.add(f"{where}.tasks", f"{tasks!r} is not allowed; allowed: a list of this file's tasks "
                      f"({', '.join(task_names)})")
        if "decode" in s:
            _check_decode_keys(c, s["decode"], f"{where}.decode")
        if not name.startswith("tuned:") and "{" not in name:
            if name not in CONTROLLERS:
                c.add(f"{where}.controller", f"unknown controller {name!r}" + _known(name, CONTROLLERS.names()))
            else:
                _check_params(c, CONTROLLERS.get(name), params, f"{where}.params")
        if look is not None:
            _check_lookahead(c, look, f"{where}.lookahead")
        label = s.get("label") or default_label(name, params, look)
        out.append(StrategySpec(label=str(label), controller=name, params=dict(params),
                                decode=dict(s.get("decode") or {}), lookahead=look, kind=kind, tasks=tasks,
                                prepare=s.get("prepare"), path=where))
    labels = [s.label for s in out]
    for lab in sorted({x for x in labels if labels.count(x) > 1}):
        c.add("strategies", f"label {lab!r} is used by more than one strategy (labels name the rows of the report)")
    return out


def _check_params(c: _Checker, cls: type, params: dict, where: str) -> None:
    known = cls._param_names()
    for k, v in params.items():
        if k == "steps_per_token":
            if "steps" not in known:
                c.add(f"{where}.{k}", f"{cls.display_name()} has no 'steps' parameter to derive it for")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                c.add(f"{where}.{k}", f"{v!r} is out of range; allowed: number in (0, 1] (steps = G × it)")
            continue
        if k not in known:
            c.add(f"{where}.{k}", f"unknown parameter of {cls.display_name()}" + _known(str(k), known))
            continue
        spec = cls.params.get(k)
        if spec is not None and not (isinstance(v, str) and "{" in v):
            try:
                spec.check(cls.display_name(), k, v)
            except ParameterError as exc:
                c.add(f"{where}.{k}", str(exc))


def _check_lookahead(c: _Checker, look: dict, where: str) -> None:
    try:
        from .lookahead import Lookahead
        from .scorer import parse_scorer_spec
    except ImportError as exc:
        c.add(where, f"lookahead needs framework.lookahead and framework.scorer, which cannot be imported ({exc})")
        return
    known = Lookahead._param_names()
    c.keys(look, [k for k in known if k != "context"], where)
    for k, v in look.items():
        if k in Lookahead.params:
            try:
                Lookahead.params[k].check("lookahead", k, v)
            except ParameterError as exc:
                c.add(f"{where}.{k}", str(exc))
    scorer = look.get("scorer", "logprob")
    if not isinstance(scorer, str):
        c.add(f"{where}.scorer", f"{scorer!r} is not allowed; allowed: a scorer spec such as 'logprob:1,repetition:0.5'")
        return
    try:
        parse_scorer_spec(scorer)
    except Exception as exc:  # noqa: BLE001 - any failure is a problem of this key
        c.add(f"{where}.scorer", str(exc))


def _check_combinations(c: _Checker, exp: Experiment) -> None:
    """Per (task, strategy): the merged decode options and the controller build for that task."""
    from .controller import build_controller
    from .decoding import DecodeConfig
    from .strategies import Strategy

    models_seen: set[str] = set()
    for cell in _first_seed_cells(exp):
        t, s = cell.task, cell.strategy
        mkey = json.dumps(cell.model, sort_keys=True, default=str)
        if mkey not in models_seen:
            models_seen.add(mkey)
            problem = _model_problem(cell.model)
            if problem:
                c.add(t.path + ".model" if t.model is not None else "model", f"(task {t.key}) {problem}")
        try:
            task = t.build()
        except (ParameterError, ValueError) as exc:
            c.add(f"{t.path}.params", str(exc))
            continue
        cfg_kw = {"gen_length": task.gen_length, "block_length": task.default_block_length, "seed": 0}
        if cell.controller.startswith("tuned:") and Path(cell.controller[6:]).is_file():
            from .controller_io import load_decode_config

            try:
                cfg_kw.update({k: v for k, v in (load_decode_config(cell.controller[6:]) or {}).items()
                               if k not in ("seed",)})
            except Exception as exc:  # noqa: BLE001
                c.add(f"{s.path}.controller", f"(task {t.key}) {exc}")
        cfg_kw.update(cell.decode)
        try:
            config = DecodeConfig.build(**cfg_kw)
        except ParameterError as exc:
            c.add(f"{s.path}.decode", f"(task {t.key}) {exc}")
            continue
        if cell.controller == "oracle" and cell.lookahead:
            c.add(f"{s.path}.lookahead", "the oracle commits the reference's tokens; lookahead has no effect on it")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                params = Strategy(s.label, cell.controller, cell.params).resolve(
                    config.gen_length, config.effective_block_length)
                build_controller(cell.controller, **params)
            for w in caught:
                print(f"{exp.source}: warning: {s.path}: (task {t.key}) {w.message}", file=sys.stderr)
        except (ParameterError, FileNotFoundError, OSError, ValueError, KeyError) as exc:
            msg = f"(task {t.key}) {exc}"
            prep = _substitute(s.prepare, {"task": t.name, "model": _model_label(cell.model)}) if s.prepare else None
            if prep:
                msg += f"; prepare it with: {prep}"
            missing = isinstance(exc, (FileNotFoundError, OSError)) or "not found" in str(exc) or "No such file" in str(exc)
            if missing and exp.on_missing == "skip":
                exp.skipped.append((s.path, t.key, msg, prep))
            else:
                c.add(f"{s.path}.params" if not cell.controller.startswith("tuned:") else f"{s.path}.controller", msg)
    for path, task, msg, _ in exp.skipped:
        print(f"{exp.source}: skipping {path} for task {task} (on_missing: skip): {msg}", file=sys.stderr)


def _first_seed_cells(exp: Experiment) -> list[Cell]:
    out = []
    for t in exp.tasks:
        for s in exp.strategies:
            if s.tasks is None or t.name in s.tasks:
                out.append(exp._cell(len(out), t, s, exp.seeds[0]))
    return out


# ====================================================================== models
_MODEL_CACHE: dict[str, Any] = {}


def resolve_device(device: str, local_rank: int = 0) -> str:
    import torch

    if device == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return f"cuda:{local_rank}"
    return device


def load_any_model(model: Any, device: str = "cpu") -> Any:
    """A :class:`LoadedModel` from a model entry (names, folders, hub names, mappings); cached per process."""
    key = json.dumps([model, device], sort_keys=True, default=str)
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]
    if isinstance(model, dict) and "factory" in model:
        mod, _, attr = str(model["factory"]).partition(":")
        loaded = getattr(importlib.import_module(mod), attr)(**{"device": device, **(model.get("kwargs") or {})})
    else:
        opts = dict(model) if isinstance(model, dict) else {"name": model}
        name = opts.pop("name")
        from .text import TEXT_MODEL, load_text_model

        if name == TEXT_MODEL:
            loaded = load_text_model(device=device)
        elif opts:
            from .hub import load_hub_model

            loaded = load_hub_model(name, device=device, **opts)
        elif name.count("/") == 1 and not Path(name).expanduser().exists() and not name.startswith((".", "~")):
            from .hub import load_hub_model

            loaded = load_hub_model(name, device=device)
        else:
            from .models import load_model

            loaded = load_model(name, device=device)
    _MODEL_CACHE[key] = loaded
    return loaded


def tiny_model(task: str = "addition", size: str = "tiny", train_steps: int = 0, seed: int = 0,
               batch_size: int = 64, lr: float = 3e-3, device: str = "cpu", task_params: Optional[dict] = None) -> Any:
    """A :class:`TinyDenoiser` built from a config for ``task`` and trained ``train_steps`` steps with the
    masked-diffusion loss (plain torch, seeded: the same weights in every process). For tests and demos."""
    import torch

    from .data import collate
    from .denoiser import LoadedModel, TinyConfig, TinyDenoiser
    from .tasks import get_task
    from .training import MODEL_SIZES, forward_process, masked_diffusion_loss, sample_t

    _ensure_text_task()
    t = get_task(task, **(task_params or {}))
    tok = t.tokenizer
    torch.manual_seed(seed)
    den = TinyDenoiser(TinyConfig(vocab_size=tok.vocab_size, mask_token_id=tok.mask_token_id,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                  max_len=t.canvas_length, **MODEL_SIZES[size]))
    if train_steps:
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(den.parameters(), lr=lr)
        stream = t.iter_examples("train", seed=seed)
        den.train()
        for _ in range(int(train_steps)):
            batch = collate(t, [next(stream) for _ in range(batch_size)])
            x0, ans = batch["input_ids"], batch["answer_mask"]
            tt = sample_t(x0.shape[0], True, g)
            xt, masked, p_mask = forward_process(x0, ans, tok.mask_token_id, tt, 1e-3, g)
            loss = masked_diffusion_loss(den(xt, attention_mask=batch["attention_mask"]), x0, masked, p_mask, ans)
            opt.zero_grad()
            loss.backward()
            opt.step()
    den.eval().to(device)
    return LoadedModel(denoiser=den, tokenizer=tok, name=f"tiny-model-{task}-{size}-{train_steps}", task=task,
                       info={"train_steps": train_steps, "seed": seed, "size": size})


def toy_model(task: str = "addition", low: float = 0.3, high: float = 0.99, salt: int = 0, device: str = "cpu",
              task_params: Optional[dict] = None) -> Any:
    """:class:`framework.testing.ContextToyDenoiser` over the task's vocabulary: designed, context-dependent
    confidences in ``[low, high]`` (so NFE is ragged across samples), exact in every process. For tests."""
    from .denoiser import LoadedModel
    from .tasks import get_task
    from .testing import ContextToyDenoiser

    _ensure_text_task()
    tok = get_task(task, **(task_params or {})).tokenizer
    den = ContextToyDenoiser(vocab_size=tok.vocab_size + 3, low=low, high=high, salt=salt).to(device)
    return LoadedModel(denoiser=den, tokenizer=tok, name=f"toy-{task}", task=task, info={"toy": True})


# ====================================================================== evaluating one cell
def build_cell(cell: Cell, task: Any, config_seed: Optional[int] = None) -> tuple[Any, Any, Any]:
    """The cell's ``(controller, DecodeConfig, Lookahead or None)`` for ``task``."""
    from .controller import build_controller
    from .decoding import DecodeConfig
    from .strategies import Strategy

    cfg_kw = {"gen_length": task.gen_length, "block_length": task.default_block_length}
    if cell.controller.startswith("tuned:"):
        from .controller_io import load_decode_config

        cfg_kw.update({k: v for k, v in (load_decode_config(cell.controller[6:]) or {}).items() if k != "seed"})
    cfg_kw.update(cell.decode)
    cfg_kw["seed"] = cell.seed if config_seed is None else config_seed
    config = DecodeConfig.build(**cfg_kw)
    params = Strategy(cell.strategy.label, cell.controller, cell.params).resolve(
        config.gen_length, config.effective_block_length)
    controller = build_controller(cell.controller, **params)
    lookahead = None
    if cell.lookahead:
        from .lookahead import Lookahead

        lookahead = Lookahead.build(**cell.lookahead)
    return controller, config, lookahead


def evaluate_cell(cell: Cell, loaded: Any, task: Any, exp: Experiment, dist: Any = None) -> Any:
    """Decode the cell's examples and score them; an :class:`framework.evaluate.EvalResult`.

    With a :class:`framework.distributed.DistContext` of several ranks, the examples are sharded
    across ranks and gathered (every rank returns the same result).
    """
    from .distributed import evaluate_sharded

    controller, config, lookahead = build_cell(cell, task)
    evaluator = None
    if cell.controller == "oracle":
        from controllers.oracle import evaluate_oracle

        ref = controller.get_params().get("reference", "sequential")

        def evaluator(loaded, task, controller, config, *, strategy, split, n, batch_size, lookahead, repeats,
                      data_seed):  # noqa: ANN001 - the evaluate() signature
            res = evaluate_oracle(loaded, task, config, split=split, n=n, batch_size=batch_size, reference=ref,
                                  data_seed=data_seed)
            res.strategy = strategy
            return res

    return evaluate_sharded(loaded, task, controller, config, dist=dist, strategy=cell.strategy.label,
                            split=exp.split, n=cell.n, batch_size=exp.batch_size, lookahead=lookahead,
                            repeats=exp.repeats, data_seed=exp.data_seed, evaluator=evaluator)


def compute_cell_metrics(cell: Cell, task: Any, samples: list[dict], device: str = "cpu",
                         only: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """The cell's metrics on its per-sample records: ``{name: MetricResult}``."""
    from .metrics import MetricContext, compute_metrics

    specs = [(n, p) for n, p in cell.metrics if only is None or n in only]
    if not specs:
        return {}
    ctx = MetricContext(task=task, device=device)
    return compute_metrics(specs, [s["output"] for s in samples], [s["answer"] for s in samples],
                           [s["prompt"] for s in samples], ctx)


# ====================================================================== the run folder
def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, torch / Python versions and GPUs, for the report."""
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu or "unknown", "cores": os.cpu_count(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "platform": platform.platform(), "cuda": torch.cuda.is_available(),
    }
    try:
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def read_samples(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


SUMMARY_COLUMNS = ("task", "strategy", "kind", "seed", "n", "quality_metric", "quality", "accuracy", "nfe", "tpf",
                   "ms_per_token", "peak_mem_mb", "lookahead", "cell")


def summary_markdown(rows: list[dict]) -> str:
    metric_names = sorted({m for r in rows for m in (r.get("metrics") or {})})
    head = ["task", "strategy", "kind", "seed", "n", "accuracy", *metric_names, "NFE", "tok/fwd", "ms/tok", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [r["task"], r["strategy"], r["kind"], str(r["seed"]), str(r["n"]), _fmt(r["accuracy"])]
        vals += [_fmt((r.get("metrics") or {}).get(m)) for m in metric_names]
        vals += [_fmt(r["nfe"], 2), _fmt(r["tpf"], 2), _fmt(r["ms_per_token"], 3), _fmt(r["peak_mem_mb"], 1)]
        lines.append("| " + " | ".join(v.replace("|", "\\|") for v in vals) + " |")
    return "\n".join(lines) + "\n"


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


@dataclass
class RunResult:
    """What :func:`run_experiment` did: the folder, the summary rows, the cells evaluated and skipped."""

    run_dir: Path
    rows: list[dict]
    evaluated: list[str]
    reused: list[str]
    interrupted: bool = False


def _init_wandb(mode: str, exp: Experiment, run_dir: Path, n_cells: int) -> Any:
    if mode == "disabled":
        return None
    try:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        run_id = "exp-" + hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]
        return wandb.init(project="adaptive-decoding", name=exp.name, id=run_id, resume="allow", mode=mode,
                          dir=str(run_dir), job_type="experiment",
                          config={"experiment": exp.raw, "source": exp.source, "cells": n_cells})
    except Exception as exc:  # noqa: BLE001 - tracking must never lose results
        print(f"adec run: W&B logging disabled ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def run_experiment(
    exp: "Experiment | str | os.PathLike",
    out_dir: "str | os.PathLike" = "runs",
    *,
    wandb_mode: str = "offline",
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    max_cells: Optional[int] = None,
    dist: Any = None,
    command: Optional[str] = None,
) -> RunResult:
    """Run every unfinished cell of ``exp`` into ``<out_dir>/<name>/`` (see the module docstring).

    Args:
        resume: require an existing run folder (fail if there is none).
        overwrite: recompute every cell (finished cells are moved to ``cells.old-<time>/``).
        max_cells: stop after evaluating this many cells (a deliberate partial run).
        dist: a :class:`framework.distributed.DistContext`; rank 0 writes, every rank decodes its shard.
        command: the command line, recorded for the report.
    """
    from .distributed import DistContext

    if not isinstance(exp, Experiment):
        exp = load_experiment(exp)
    if wandb_mode not in ("offline", "online", "disabled"):
        raise ValueError(f"wandb_mode={wandb_mode!r}; allowed: offline, online, disabled")
    dist = dist or DistContext()
    run_dir = Path(out_dir) / exp.name
    cells_dir = run_dir / "cells"
    if resume and not run_dir.is_dir():
        raise FileNotFoundError(f"--resume: no run folder {str(run_dir)!r} to resume")
    if dist.is_main:
        if overwrite and cells_dir.is_dir():
            os.replace(cells_dir, run_dir / f"cells.old-{time.strftime('%Y%m%d-%H%M%S')}")
        cells_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(run_dir / "experiment.yaml", yaml.safe_dump(exp.raw, sort_keys=False, allow_unicode=True))
        env = machine_info()
        env["world_size"] = dist.world_size
        _write_atomic(run_dir / "environment.json", json.dumps(env, indent=2) + "\n")
        labels = {st.path: st.label for st in exp.strategies}
        _write_atomic(run_dir / "skipped.json", json.dumps(
            [{"strategy": labels.get(p, p), "path": p, "task": t, "reason": m, "prepare": c}
             for p, t, m, c in exp.skipped], indent=2) + "\n")
        with open(run_dir / "invocations.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command or "",
                                 "source": exp.source, "world_size": dist.world_size}) + "\n")
    dist.barrier()

    cells = exp.cells()
    done = [c.id for c in cells if (cells_dir / c.id / "summary.json").is_file()]
    done = dist.broadcast(done)
    todo = [c for c in cells if c.id not in set(done)]
    if dist.is_main and done:
        print(f"adec run: {run_dir}: {len(done)} of {len(cells)} cells already finished; running "
              f"the other {len(todo)} (use --overwrite to recompute)", file=sys.stderr)
    wb = _init_wandb(wandb_mode, exp, run_dir, len(cells)) if dist.is_main else None
    bar = None
    if dist.is_main and progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(cells), initial=len(done), desc=exp.name, unit="cell", dynamic_ncols=True)
    evaluated: list[str] = []
    interrupted = False
    device = resolve_device(exp.device, dist.local_rank)
    tasks: dict[str, Any] = {}
    try:
        # finished cells: add metrics requested since, from the stored samples (no decoding)
        if dist.is_main:
            for cell in cells:
                if cell.id in done:
                    _update_metrics(cell, cells_dir / cell.id, tasks, device)
        for cell in todo:
            if max_cells is not None and len(evaluated) >= max_cells:
                interrupted = True
                break
            if bar is not None:
                bar.set_postfix_str(cell.describe()[:60])
            task = _task_for(tasks, cell.task)
            loaded = load_any_model(cell.model, device=device)
            t0 = time.perf_counter()
            result = evaluate_cell(cell, loaded, task, exp, dist)
            seconds = time.perf_counter() - t0
            if dist.is_main:
                row = _write_cell(cell, cells_dir / cell.id, result, task, device, seconds, dist.world_size, loaded)
                _log_wandb(wb, cell, row)
            evaluated.append(cell.id)
            if bar is not None:
                bar.update(1)
            dist.barrier()
    finally:
        if bar is not None:
            bar.close()
        rows = _write_summary(exp, cells, cells_dir, run_dir) if dist.is_main else []
        if wb is not None:
            _finish_wandb(wb, rows)
    return RunResult(run_dir=run_dir, rows=rows, evaluated=evaluated,
                     reused=[c for c in done if c in {x.id for x in cells}], interrupted=interrupted)


def _write_cell(cell: Cell, folder: Path, result: Any, task: Any, device: str, seconds: float,
                world_size: int, loaded: Any) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    samples = [asdict(s) for s in result.samples]
    metrics = compute_cell_metrics(cell, task, samples, device)
    for name, m in metrics.items():
        if m.per_sample is not None:
            for s, v in zip(samples, m.per_sample):
                s.setdefault("metrics", {})[name] = v
    buf = io.StringIO()
    for s in samples:
        buf.write(json.dumps(_clean(s), default=_json_default, ensure_ascii=False) + "\n")
    _write_atomic(folder / "samples.jsonl", buf.getvalue())
    row = result.row()
    row.update({
        "cell": cell.id, "key": cell.key, "task": cell.task.key, "task_name": cell.task.name,
        "task_params": cell.task.params, "strategy": cell.strategy.label, "kind": cell.kind,
        "controller": cell.controller, "params": cell.params, "decode": cell.decode,
        "lookahead": cell.lookahead, "seed": cell.seed, "model": _model_label(cell.model),
        "metrics": {k: v.value for k, v in metrics.items()}, "seconds": round(seconds, 3),
        "world_size": world_size, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "higher_is_better": _higher_is_better(cell.task.quality),
    })
    _set_quality(row, cell.task.quality)
    _write_atomic(folder / "summary.json", json.dumps(_clean(row), indent=2, default=_json_default) + "\n")
    return row


def _higher_is_better(metric: str) -> bool:
    if metric == "accuracy":
        return True
    from .metrics import METRICS

    return bool(getattr(METRICS.get(metric), "higher_is_better", True))


def _set_quality(row: dict, quality: str) -> None:
    row["quality_metric"] = quality
    row["quality"] = row["accuracy"] if quality == "accuracy" else (row.get("metrics") or {}).get(quality)


def _update_metrics(cell: Cell, folder: Path, tasks: dict, device: str) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    have = set(summary.get("metrics") or {})
    missing = [n for n, _ in cell.metrics if n not in have]
    if not missing and summary.get("quality_metric") == cell.task.quality:
        return
    task = _task_for(tasks, cell.task)
    samples = read_samples(folder / "samples.jsonl")
    metrics = compute_cell_metrics(cell, task, samples, device, only=missing)
    if metrics:
        for name, m in metrics.items():
            if m.per_sample is not None:
                for s, v in zip(samples, m.per_sample):
                    s.setdefault("metrics", {})[name] = v
        _write_atomic(folder / "samples.jsonl", "".join(json.dumps(_clean(s), default=_json_default,
                                                                      ensure_ascii=False) + "\n" for s in samples))
        summary.setdefault("metrics", {}).update({k: _clean(v.value) for k, v in metrics.items()})
    summary["higher_is_better"] = _higher_is_better(cell.task.quality)
    _set_quality(summary, cell.task.quality)
    _write_atomic(folder / "summary.json", json.dumps(summary, indent=2, default=_json_default) + "\n")


def _task_for(cache: dict, spec: TaskSpec) -> Any:
    if spec.key not in cache:
        cache[spec.key] = spec.build()
    return cache[spec.key]


def _write_summary(exp: Experiment, cells: list[Cell], cells_dir: Path, run_dir: Path) -> list[dict]:
    rows = []
    for c in cells:
        f = cells_dir / c.id / "summary.json"
        if f.is_file():
            rows.append(json.loads(f.read_text()))
    _write_atomic(run_dir / "summary.json", json.dumps(rows, indent=2) + "\n")
    _write_atomic(run_dir / "summary.md", f"# {exp.name}: {len(rows)} of {len(cells)} cells\n\n" + summary_markdown(rows))
    buf = io.StringIO()
    w = csv.writer(buf)
    metric_names = sorted({m for r in rows for m in (r.get("metrics") or {})})
    w.writerow([*SUMMARY_COLUMNS, *metric_names])
    for r in rows:
        w.writerow([r.get(k) if k != "lookahead" else bool(r.get(k)) for k in SUMMARY_COLUMNS]
                   + [(r.get("metrics") or {}).get(m) for m in metric_names])
    _write_atomic(run_dir / "summary.csv", buf.getvalue())
    return rows


def _log_wandb(wb: Any, cell: Cell, row: dict) -> None:
    if wb is None:
        return
    try:
        prefix = f"{cell.task.key}/{cell.strategy.label}/s{cell.seed}"
        data = {f"{prefix}/{k}": row[k] for k in ("accuracy", "nfe", "tpf", "ms_per_token", "peak_mem_mb")
                if isinstance(row.get(k), (int, float))}
        data.update({f"{prefix}/{k}": v for k, v in (row.get("metrics") or {}).items() if isinstance(v, (int, float))})
        data["cells_done"] = cell.index + 1
        wb.log(data)
    except Exception as exc:  # noqa: BLE001
        print(f"adec run: W&B log failed ({exc}); results are in the run folder", file=sys.stderr)


def _finish_wandb(wb: Any, rows: list[dict]) -> None:
    try:
        import wandb

        cols = ["task", "strategy", "kind", "seed", "n", "accuracy", "quality", "nfe", "tpf", "ms_per_token",
                "peak_mem_mb"]
        wb.log({"summary": wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])})
        wb.finish()
    except Exception as exc:  # noqa: BLE001
        print(f"adec run: W&B finish failed ({exc})", file=sys.stderr)
