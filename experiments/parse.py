"""Reading an experiment YAML into validated cells: every key, value and combination is checked
before any work, and a bad one is reported with its path in the file.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from adaptive_decoding.experiments.published import check_published
from adaptive_decoding.experiments.spec import (
    KINDS,
    SPLITS,
    STRATEGY_KEYS,
    TASK_KEYS,
    TOP_KEYS,
    Cell,
    Experiment,
    ExperimentError,
    StrategySpec,
    TaskSpec,
    default_label,
    did_you_mean,
    ensure_text_task,
    model_label,
    substitute,
    suites,
)
from adaptive_decoding.experiments.sweeps import expand_sweep, param_problem
from adaptive_decoding.experiments.targets import check_targets
from adaptive_decoding.framework.core.params import ParameterError


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
    published = check_published(c, raw.get("published"), [(t.name, t.key) for t in tasks],
                                {s.label: s.tasks for s in strategies})
    targets, problems = check_targets(raw.get("targets"))
    for path, msg in problems:
        c.add(path, msg)
    exp = Experiment(
        name=str(name or "experiment"), tasks=tasks, strategies=strategies, model=raw.get("model", "tiny-{task}"),
        description=str(raw.get("description") or ""), device=device if isinstance(device, str) else "cpu",
        n=raw.get("n", 100), split=split, batch_size=raw.get("batch_size", 64), repeats=raw.get("repeats", 1),
        data_seed=raw.get("data_seed", 0), seeds=list(seeds), decode=dict(decode) if isinstance(decode, dict) else {},
        metrics=list(metrics) if isinstance(metrics, list) else [], on_missing=on_missing, source=source, raw=raw,
        published=published, targets=targets,
    )
    if not c.problems:
        _check_combinations(c, exp)
    if c.problems:
        raise ExperimentError(source, c.problems)
    return exp


def _check_decode_keys(c: _Checker, decode: Any, path: str) -> None:
    from adaptive_decoding.framework.engine.config import MOVED, DecodeConfig

    if not isinstance(decode, dict):
        c.add(path, f"{decode!r} is not allowed; allowed: a mapping of decoding options")
        return
    known = DecodeConfig.param_names()
    for k, v in decode.items():
        if k in MOVED:
            c.add(f"{path}.{k}", f"no longer a decoding option; it is now {MOVED[k]}")
        elif k not in known:
            c.add(f"{path}.{k}", "unknown decoding option" + did_you_mean(str(k), known))
        else:
            try:
                DecodeConfig.params[k].check("", k, v)
            except ParameterError as exc:
                c.add(f"{path}.{k}", str(exc))


def _check_metrics(c: _Checker, metrics: Any, path: str) -> None:
    from adaptive_decoding.experiments.metrics import METRICS, MetricUnavailable, build_metric

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
            c.add(where, f"unknown metric {name!r}" + did_you_mean(str(name), METRICS.names()))
            continue
        try:
            build_metric(name, **params)
        except MetricUnavailable as exc:
            c.add(where, str(exc))
        except ParameterError as exc:
            c.add(f"{where}.params", str(exc))


def _namespace_hint(module: str) -> str:
    """A hint for a factory written with the folder's name instead of the installed one."""
    if module.split(".")[0] in ("framework", "controllers", "scorers", "experiments"):
        return f"; the framework's own modules import as 'adaptive_decoding.{module}'"
    return ""


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
                c.add(f"{path}.factory", f"{target!r} is not an importable 'module:function'{_namespace_hint(mod)}")
            return
        c.keys(model, ("name", "dtype", "kind", "chat", "trust_remote_code"), path)
        if not isinstance(model.get("name"), str):
            c.add(f"{path}.name", "required: a model name, folder or hub name")
        return
    if not isinstance(model, str) or not model:
        c.add(path, f"{model!r} is not allowed; allowed: a model name, a folder, or a mapping")


def _model_problem(model: Any) -> Optional[str]:
    """Why ``model`` (placeholders resolved) cannot be loaded, without loading it; ``None`` if fine."""
    from adaptive_decoding.framework.tasks.text import TEXT_MODEL
    from adaptive_decoding.framework.training.zoo import MODELS

    if isinstance(model, dict):
        if "factory" in model:
            return None
        model = model["name"]
    if model == TEXT_MODEL or model in MODELS or Path(model).expanduser().is_dir():
        return None
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):  # a hub name: needs the HF cache
        try:
            from adaptive_decoding.framework.models.hub_loading import resolve_model_path

            resolve_model_path(model)
            return None
        except Exception as exc:  # noqa: BLE001 - reported as a problem
            return str(exc)
    return f"unknown model {model!r} (and no such folder); known models: {', '.join([*MODELS.names(), TEXT_MODEL])}"


def _parse_tasks(c: _Checker, items: Any, top_metrics: Any = None) -> list[TaskSpec]:
    from adaptive_decoding.framework.tasks.base import TASKS

    ensure_text_task()
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
            c.add(f"{where}.name", f"unknown task {name!r}" + did_you_mean(str(name), TASKS.names()))
            continue
        params = t.get("params") or {}
        spec = TaskSpec(name=name, params=dict(params) if isinstance(params, dict) else {}, n=t.get("n"),
                        metrics=t.get("metrics"), quality=t.get("quality", "accuracy"), model=t.get("model"),
                        decode=dict(t.get("decode") or {}), path=where, label=t.get("label"))
        if spec.label is not None and not (isinstance(spec.label, str) and spec.label.strip()):
            c.add(f"{where}.label", f"{spec.label!r} is not allowed; allowed: a non-empty string")
        cls = TASKS.get(name)
        for k, v in spec.params.items():
            if k not in cls.param_names():
                c.add(f"{where}.params.{k}", f"unknown parameter of task {name}" + did_you_mean(str(k), cls.param_names()))
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
        c.add("tasks", f"task {k} is listed twice (give one a label: to tell them apart)")
    return out


def _parse_strategies(c: _Checker, items: Any, task_names: list[str]) -> list[StrategySpec]:
    """The ``strategies`` list: suites expanded, sweeps expanded, every entry checked; labels and
    curves must each name one entry."""
    if not isinstance(items, list) or not items:
        c.add("strategies", "required: a non-empty list of {controller:, params:, ...} mappings")
        return []
    out: list[StrategySpec] = []
    explicit: set[str] = set()  # strategies placed on a curve by their own 'curve' key
    for i, s in enumerate(items):
        where = f"strategies[{i}]"
        if not isinstance(s, dict):
            c.add(where, f"{s!r} is not allowed; allowed: a mapping with 'controller' (or 'suite')")
            continue
        c.keys(s, STRATEGY_KEYS, where)
        if "suite" in s:
            out += _parse_suite(c, s, where)
        else:
            out += _parse_strategy(c, s, where, task_names, explicit)
    _check_labels_and_curves(c, out, explicit)
    return out


def _parse_suite(c: _Checker, s: dict, where: str) -> list[StrategySpec]:
    """A ``suite:`` entry: the suite's strategies (none when the suite is unknown)."""
    out: list[StrategySpec] = []
    if "sweep" in s:
        c.add(f"{where}.sweep", "not allowed with 'suite'; sweep a strategy with its own 'controller'")
    known_suites = suites()
    if s["suite"] not in known_suites:
        c.add(f"{where}.suite", f"unknown suite {s['suite']!r}; allowed: {', '.join(known_suites)}")
        return out
    for j, b in enumerate(known_suites[s["suite"]]):
        out.append(StrategySpec(label=b.label, controller=b.controller, params=dict(b.params),
                                decode=dict(b.decode), kind=s.get("kind"), tasks=s.get("tasks"),
                                path=f"{where}.suite[{j}]"))
    return out


def _parse_strategy(c: _Checker, s: dict, where: str, task_names: list[str],
                    explicit: set[str]) -> list[StrategySpec]:
    """A ``controller:`` entry: its strategy, or its sweep's points (none when it is invalid); an
    entry placed on a curve by its own ``curve`` key is added to ``explicit``."""
    from adaptive_decoding.framework.engine.controller import CONTROLLERS

    name = s.get("controller")
    if not isinstance(name, str) or not name:
        c.add(f"{where}.controller", "required: a registered controller name or tuned:PATH"
              + did_you_mean("", CONTROLLERS.names()))
        return []
    params = s.get("params") or {}
    if not isinstance(params, dict):
        c.add(f"{where}.params", f"{params!r} is not allowed; allowed: a mapping")
        params = {}
    look = s.get("lookahead")
    if look is not None and not isinstance(look, dict):
        c.add(f"{where}.lookahead", f"{look!r} is not allowed; allowed: a mapping such as {{scorer: logprob}}")
        look = None
    kind, tasks = _check_kind_tasks_decode(c, s, where, task_names)
    cls, known_controller = None, True
    if not name.startswith("tuned:") and "{" not in name:
        if name not in CONTROLLERS:
            known_controller = False
            c.add(f"{where}.controller", f"unknown controller {name!r}" + did_you_mean(name, CONTROLLERS.names()))
        else:
            cls = CONTROLLERS.get(name)
            _check_params(c, cls, params, f"{where}.params")
    if look is not None:
        _check_lookahead(c, look, f"{where}.lookahead")
    tune = _check_tune(c, s, name, cls, params, where)
    label = s.get("label") or default_label(name, params, look)
    spec = StrategySpec(label=str(label), controller=name, params=dict(params),
                        decode=dict(s.get("decode") or {}) if isinstance(s.get("decode"), dict) else {},
                        lookahead=look, kind=kind or ("tuned" if tune else None), tasks=tasks,
                        prepare=s.get("prepare"), path=where, tune=tune)
    if "curve" in s:  # a point of a curve whose knob a sweep cannot reach (e.g. a wrapped controller's)
        if "sweep" in s or not isinstance(s["curve"], str) or not s["curve"]:
            c.add(f"{where}.curve", f"{s['curve']!r} is not allowed; allowed: a curve name (a string), "
                                    f"on a strategy without 'sweep' (a sweep names its own curve)")
        else:
            spec.curve = s["curve"]
            explicit.add(where)
    if "sweep" in s:
        return expand_sweep(c, s["sweep"], spec, cls, where) if known_controller else []
    return [spec]


def _check_tune(c: _Checker, s: dict, name: str, cls: Optional[type], params: dict, where: str) -> Optional[dict]:
    """A strategy's ``tune:`` mapping (:mod:`adaptive_decoding.experiments.tuned`), checked; ``None`` without one."""
    if "tune" not in s:
        return None
    from adaptive_decoding.experiments.tuned import check_tune

    if name.startswith("tuned:") or "sweep" in s:
        c.add(f"{where}.tune", "not allowed with a tuned:PATH controller or a sweep; tune a registered "
                               "controller (its params are held fixed)")
        return None
    tune, problems = check_tune(s["tune"], cls, params)
    for key, msg in problems:
        c.add(f"{where}.tune" + (f".{key}" if key else ""), msg)
    return tune if not problems else None


def _check_kind_tasks_decode(c: _Checker, s: dict, where: str, task_names: list[str]) -> tuple[Any, Any]:
    """A strategy's ``kind`` (one of KINDS), ``tasks`` (this file's tasks) and ``decode`` keys: the
    kind and tasks as given."""
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
    return kind, tasks


def _check_labels_and_curves(c: _Checker, out: list[StrategySpec], explicit: set[str]) -> None:
    """Every label names one strategy (labels name the report's rows) and every curve named by a
    ``curve`` key is drawn by one entry (a sweep's points are one entry)."""
    labels = [s.label for s in out]
    for lab in sorted({x for x in labels if labels.count(x) > 1}):
        c.add("strategies", f"label {lab!r} is used by more than one strategy (labels name the rows of the "
                            "report)")
    entries: dict[str, set] = {}  # curve -> the entries drawing it (a sweep's points are one entry)
    for s in out:
        entries.setdefault(s.curve or s.label, set()).add(f"curve: {s.curve}" if s.path in explicit
                                                          else s.path.split(".sweep")[0])
    for name in sorted(n for n, e in entries.items() if len(e) > 1 and any(s.curve == n for s in out)):
        c.add("strategies", f"curve {name!r} is drawn by more than one entry "
                            f"({', '.join(sorted(entries[name]))}); give the sweep another label (the report "
                            "would join their points into one line)")


def _check_params(c: _Checker, cls: type, params: dict, where: str) -> None:
    for k, v in params.items():
        problem = param_problem(cls, k, v)
        if problem:
            c.add(f"{where}.{k}", problem)


def _check_lookahead(c: _Checker, look: dict, where: str) -> None:
    try:
        from adaptive_decoding.framework.engine.lookahead import Lookahead
        from adaptive_decoding.framework.engine.scorer import parse_scorer_spec
    except ImportError as exc:
        c.add(where, f"lookahead needs adaptive_decoding.framework.engine.lookahead and adaptive_decoding.framework.engine.scorer, which cannot be imported ({exc})")
        return
    known = Lookahead.flat_keys()
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
    from adaptive_decoding.experiments.strategies import Strategy
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller

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
            from adaptive_decoding.framework.engine.controller_io import load_decode_config

            try:
                cfg_kw.update({k: v for k, v in (load_decode_config(cell.controller[6:]) or {}).items()
                               if k not in ("seed",)})
            except Exception as exc:  # noqa: BLE001
                c.add(f"{s.path}.controller", f"(task {t.key}) {exc}")
        cfg_kw.update(cell.decode)
        try:
            config = DecodeConfig.build(**cfg_kw)
        except ParameterError as exc:
            c.add(s.path if s.sweep else f"{s.path}.decode", f"(task {t.key}) {exc}")
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
            prep = substitute(s.prepare, {"task": t.name, "model": model_label(cell.model)}) if s.prepare else None
            if prep:
                msg += f"; prepare it with: {prep}"
            missing = isinstance(exc, (FileNotFoundError, OSError)) or "not found" in str(exc) or "No such file" in str(exc)
            if missing and exp.on_missing == "skip":
                exp.skipped.append((s.path, t.key, msg, prep))
            else:
                c.add(s.path if s.sweep else f"{s.path}.params" if not cell.controller.startswith("tuned:")
                      else f"{s.path}.controller", msg)
    for path, task, msg, _ in exp.skipped:
        print(f"{exp.source}: skipping {path} for task {task} (on_missing: skip): {msg}", file=sys.stderr)


def _first_seed_cells(exp: Experiment) -> list[Cell]:
    out = []
    for t in exp.tasks:
        for s in exp.strategies:
            if s.tasks is None or t.name in s.tasks:
                out.append(exp._cell(len(out), t, s, exp.seeds[0]))
    return out
