"""Optuna tuning of a controller's declared search space: accuracy up, NFE down.

A study has two objectives on the **validation** split of a task: f₁ = exact-match accuracy
(maximise) and f₂ = mean NFE per sample (minimise). The space is the controller's
``search_space()`` (every :class:`~framework.params.Param` with ``tune=``): a 2-tuple of numbers on
an ``int``/``float`` parameter is a range (``log=True`` samples it on a log scale), anything else
is a set of choices. Parameters fixed with ``fixed=`` (``--set``) are taken out of the space.

Storage (``storage=``, ``adec tune --storage``), chosen by the string:

* ``None`` -> SQLite file ``<out_dir>/<study>.db`` (the default; resumable, shareable by workers);
* ``"memory"`` -> :class:`optuna.storages.InMemoryStorage` (one process, gone at exit);
* ``"journal:PATH"`` -> :class:`optuna.storages.JournalStorage` over a
  :class:`~optuna.storages.journal.JournalFileBackend` at PATH (an append-only log; works on NFS
  and across machines without a database server);
* ``"redis://..."`` -> a journal on Redis; any other URL (``sqlite:///f.db``,
  ``postgresql://user:pw@host/db``, ``mysql://...``) -> :class:`optuna.storages.RDBStorage`;
* an Optuna storage object (``BaseStorage``), used as is (one worker only).

Resumption: the same study name in the same storage continues the study. ``n_trials`` is the
study's *total* of finished (complete or pruned) trials, so re-running an interrupted command runs
only the missing ones; trials already done are never re-evaluated (the sampler is re-seeded from
the number of trials already stored, so it does not re-propose the first run's points). A study
remembers its setup (controller, task, fixed parameters, decoding options, validation size) and
refuses to continue with a different one.

Workers: ``workers=N`` runs N processes (this one and N − 1 spawned) that share the storage, each
calling ``study.optimize`` (Optuna's own recipe for parallel optimisation; no scheduler of ours).

Invalid points (a :class:`~framework.params.ParameterError` while building or decoding, e.g.
LLaDA ``steps`` that is not a multiple of the block count) are pruned with the message kept in
the trial's ``invalid`` user attribute.

Pruning rule: a trial first decodes the first ``prune_fraction`` of the validation examples; if its
accuracy there is more than ``prune_margin`` below one-token-per-step (``sequential``) decoding's
accuracy on the same examples, it is pruned (not on the front, counted as done). Multi-objective
studies cannot use ``trial.report``, so the trial raises :class:`optuna.TrialPruned` itself.

Choice rule: among complete trials, the fewest mean NFE whose validation accuracy is at least the
reference's (``sequential`` on the same validation examples) minus ``max_drop`` (ties: higher
accuracy, then lower trial number). If no trial gets there, the most accurate one is chosen and
``met_target`` is false. The chosen point is always on the Pareto front. It is exported with
:func:`framework.controller_io.save_controller` to ``<out_dir>/<study>.yaml``, which
``--controller tuned:PATH`` loads; its figures and the reference's are then measured on the
**test** split and reported next to the validation ones.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from .controller import CONTROLLERS, Controller, build_controller
from .decoding import DecodeConfig
from .denoiser import LoadedModel
from .params import Param, ParameterError
from .rng import stable_seed

DEFAULT_OUT = Path("runs") / "tune"
REFERENCE = "sequential"
SETUP_KEYS = ("controller", "task", "task_params", "fixed", "decode", "n_val", "data_seed", "model")


# ---------------------------------------------------------------------- storage
def open_storage(spec: Any, default_path: "str | os.PathLike | None" = None) -> Any:
    """An Optuna storage from a spec string (see the module docstring) or a storage object."""
    import optuna

    if isinstance(spec, optuna.storages.BaseStorage):
        return spec
    if spec is None or spec == "":
        if default_path is None:
            raise ParameterError("--storage is empty and there is no default SQLite path")
        Path(default_path).parent.mkdir(parents=True, exist_ok=True)
        spec = f"sqlite:///{Path(default_path)}"
    if not isinstance(spec, str):
        raise ParameterError(f"--storage={spec!r} is not a storage; allowed: {storage_forms()}")
    if spec in ("memory", "inmemory", ":memory:"):
        return optuna.storages.InMemoryStorage()
    if spec.startswith("journal:"):
        path = Path(spec[len("journal:"):]).expanduser()
        if not str(path) or str(path) == ".":
            raise ParameterError(f"--storage={spec!r} names no file; allowed: journal:PATH")
        path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if spec.startswith(("redis://", "rediss://")):
        from optuna.storages.journal import JournalRedisBackend

        return optuna.storages.JournalStorage(JournalRedisBackend(spec))
    if "://" in spec:
        kwargs: dict[str, Any] = {}
        if spec.startswith("sqlite"):
            kwargs["engine_kwargs"] = {"connect_args": {"timeout": 300}}
            db = spec.split(":///", 1)[-1]
            if db and db != ":memory:":
                Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        import sqlalchemy.exc

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    spec, heartbeat_interval=30, grace_period=120,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
                    **kwargs,
                )
        except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ImportError) as exc:
            raise ParameterError(f"--storage={_redact(spec)!r} cannot be opened ({exc}); allowed: "
                                 f"{storage_forms()}") from None
    raise ParameterError(f"--storage={spec!r} is not a storage; allowed: {storage_forms()}")


def storage_forms() -> str:
    return ("memory, journal:PATH, sqlite:///PATH.db, postgresql://USER:PW@HOST/DB, mysql://..., "
            "redis://HOST (journal), or nothing for <out>/<study>.db")


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)


# ---------------------------------------------------------------------- search space
def tuned_space(cls: type[Controller], fixed: Optional[dict[str, Any]] = None) -> dict[str, Param]:
    """``cls.search_space()`` minus the fixed parameters; an empty space is an error."""
    space = {k: p for k, p in cls.search_space().items() if k not in (fixed or {})}
    if not space:
        declared = ", ".join(cls.search_space()) or "none"
        raise ParameterError(
            f"controller {cls.display_name()!r} has nothing to tune (parameters with tune=...: "
            f"{declared}; fixed by --set: {', '.join(fixed or {}) or 'none'})"
        )
    return space


def is_range(spec: Param) -> bool:
    """A numeric Param whose ``tune`` is ``(low, high)``; anything else is a set of choices."""
    t = spec.tune
    return (spec.kind in (int, float) and spec.choices is None and t is not None and len(t) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in t))


def suggest(trial: Any, space: dict[str, Param]) -> dict[str, Any]:
    """Sample one point of ``space`` with the trial's ``suggest_*`` calls."""
    out: dict[str, Any] = {}
    for name, spec in space.items():
        if is_range(spec):
            lo, hi = spec.tune  # type: ignore[misc]
            if spec.kind is int:
                out[name] = trial.suggest_int(name, int(lo), int(hi), log=spec.log)
            else:
                out[name] = trial.suggest_float(name, float(lo), float(hi), log=spec.log)
        else:
            out[name] = trial.suggest_categorical(name, list(spec.tune))  # type: ignore[arg-type]
    return out


def default_point(cls: type[Controller], space: dict[str, Param]) -> Optional[dict[str, Any]]:
    """The constructor defaults of the tuned parameters, if they all lie inside the space."""
    sig = inspect.signature(cls.__init__)
    point: dict[str, Any] = {}
    for name, spec in space.items():
        p = sig.parameters.get(name)
        if p is None or p.default is inspect.Parameter.empty:
            return None
        v = p.default
        if is_range(spec):
            lo, hi = spec.tune  # type: ignore[misc]
            if v is None or isinstance(v, bool) or not lo <= v <= hi:
                return None
        elif v not in spec.tune:  # type: ignore[operator]
            return None
        point[name] = v
    return point


# ---------------------------------------------------------------------- evaluation
def score_examples(loaded: LoadedModel, task: Any, controller: Controller, config: DecodeConfig,
                   examples: Sequence[Any], batch_size: int = 64) -> tuple[list[float], list[int]]:
    """Per-example exact-match score and NFE (same seeds as :func:`framework.evaluate.evaluate`)."""
    from .evaluate import decode_texts

    if not examples:
        return [], []
    texts, results, _ = decode_texts(loaded, [ex.prompt for ex in examples], controller, config,
                                     ids=[ex.id for ex in examples], batch_size=batch_size)
    nfe = torch.cat([r.nfe for r in results]).tolist()
    return [float(task.score(ex, t)) for ex, t in zip(examples, texts)], [int(n) for n in nfe]


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def _figures(correct: Sequence[float], nfe: Sequence[int], gen_length: int) -> dict[str, float]:
    return {"accuracy": _mean(correct), "nfe": _mean(nfe),
            "tpf": _mean([gen_length / max(1, n) for n in nfe]), "n": len(correct)}


# ---------------------------------------------------------------------- one worker
@dataclass
class TuneSettings:
    """Everything a worker process needs (picklable): what to tune, on what, how."""

    controller: str
    task: str
    task_params: dict
    model: Any  # a model name / folder (str) or a LoadedModel (pickled to spawned workers)
    device: str
    fixed: dict
    decode: dict
    n_val: int
    prune_fraction: float
    prune_margin: Optional[float]
    batch_size: int
    data_seed: int

    @property
    def n_chunk(self) -> int:
        return max(1, min(self.n_val, int(math.ceil(self.n_val * self.prune_fraction))))

    def setup(self) -> dict[str, Any]:
        model = self.model if isinstance(self.model, str) else getattr(self.model, "name", "model")
        return {"controller": self.controller, "task": self.task, "task_params": self.task_params,
                "fixed": self.fixed, "decode": self.decode, "n_val": self.n_val,
                "data_seed": self.data_seed, "model": model}


def _load(settings: TuneSettings, loaded: Optional[LoadedModel] = None) -> tuple[LoadedModel, Any, DecodeConfig]:
    from .tasks import get_task

    task = get_task(settings.task, **settings.task_params)
    if loaded is None and isinstance(settings.model, str):
        from .models import load_model

        loaded = load_model(settings.model, device=settings.device, train_if_missing=False)
    elif loaded is None:
        loaded = settings.model
    return loaded, task, DecodeConfig.build(**settings.decode)


def make_objective(settings: TuneSettings, loaded: LoadedModel, task: Any, config: DecodeConfig,
                   reference: dict[str, Any], worker: int = 0) -> Callable[[Any], tuple[float, float]]:
    """The two-objective function ``trial -> (accuracy, mean NFE)`` with the pruning rule."""
    import optuna

    cls = CONTROLLERS.get(settings.controller)
    space = tuned_space(cls, settings.fixed)
    examples = task.examples("validation", settings.n_val, seed=settings.data_seed)
    chunk, rest = examples[: settings.n_chunk], examples[settings.n_chunk:]

    def objective(trial: Any) -> tuple[float, float]:
        params = {**settings.fixed, **suggest(trial, space)}
        trial.set_user_attr("worker", f"{worker}:{os.getpid()}")
        try:
            ctrl = cls.build(**params)
            trial.set_user_attr("params", _plain(ctrl.get_params()))
            c1, n1 = score_examples(loaded, task, ctrl, config, chunk, settings.batch_size)
        except ParameterError as exc:  # sampled values incompatible with each other or the config
            trial.set_user_attr("invalid", str(exc))
            raise optuna.TrialPruned(f"invalid: {exc}") from None
        trial.set_user_attr("chunk_accuracy", _mean(c1))
        floor = reference["chunk_accuracy"] - (settings.prune_margin if settings.prune_margin is not None else math.inf)
        if rest and _mean(c1) < floor:
            trial.set_user_attr("pruned_reason", f"chunk accuracy {_mean(c1):.3f} < {floor:.3f}")
            raise optuna.TrialPruned(f"accuracy {_mean(c1):.3f} on the first {len(chunk)} examples")
        c2, n2 = score_examples(loaded, task, ctrl, config, rest, settings.batch_size)
        fig = _figures(c1 + c2, n1 + n2, config.gen_length)
        trial.set_user_attr("tpf", fig["tpf"])
        return fig["accuracy"], fig["nfe"]

    return objective


def _plain(params: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(params, default=str))


def _count_done(study: Any, study_name: Optional[str] = None) -> int:
    """Finished (complete or pruned) trials of a study, or of ``study_name`` in a storage."""
    import optuna
    from optuna.trial import TrialState

    if study_name is not None:
        study = optuna.load_study(study_name=study_name, storage=study)
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def run_worker(settings: TuneSettings, storage: Any, study_name: str, n_trials: int, seed: int,
               worker: int = 0, num_threads: Optional[int] = None, verbose: bool = False,
               loaded: Any = None) -> int:
    """Run trials of ``study_name`` until it holds ``n_trials`` finished ones; returns how many ran.

    Module-level so that spawned processes can run it; each opens its own storage connection.
    """
    import optuna

    if num_threads:
        torch.set_num_threads(int(num_threads))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded, task, config = _load(settings, loaded)
    store = open_storage(storage)
    done = _count_done(optuna.load_study(study_name=study_name, storage=store))
    remaining = n_trials - done
    if remaining <= 0:
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=stable_seed(seed, worker, done) % (2**31), constant_liar=True,
            n_startup_trials=max(4, n_trials // 3),
        )
    study = optuna.load_study(study_name=study_name, storage=store, sampler=sampler)
    reference = study.user_attrs["reference"]
    objective = make_objective(settings, loaded, task, config, reference, worker)
    callbacks: list[Any] = [optuna.study.MaxTrialsCallback(
        n_trials, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))]
    if verbose:
        callbacks.append(_print_trial)
    study.optimize(objective, n_trials=remaining, callbacks=callbacks, gc_after_trial=False)
    return _count_done(study) - done


def _print_trial(study: Any, trial: Any) -> None:
    if trial.values:
        text = f"accuracy {trial.values[0]:.3f}  NFE {trial.values[1]:.2f}"
    else:
        text = f"{trial.state.name.lower()} ({trial.user_attrs.get('pruned_reason') or trial.user_attrs.get('invalid', '')})"
    print(f"  trial {trial.number:>3}: {text}  {trial.params}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- front and choice
def pareto_front(study: Any) -> list[Any]:
    """Pareto-optimal complete trials (max accuracy, min NFE), by increasing NFE."""
    return sorted(study.best_trials, key=lambda t: (t.values[1], -t.values[0], t.number))


def choose_index(points: Sequence[tuple[float, float]], reference_accuracy: float,
                 max_drop: float) -> tuple[int, bool]:
    """Index of the fewest-NFE ``(accuracy, nfe)`` point with accuracy ≥ reference − ``max_drop``
    (ties: higher accuracy, then the earlier point), and whether one got there; otherwise the
    most accurate point (ties: fewer NFE) and ``False``."""
    if not points:
        raise ValueError("no point to choose from")
    target = reference_accuracy - max_drop
    ok = [i for i, (acc, _) in enumerate(points) if acc >= target - 1e-12]
    if ok:
        return min(ok, key=lambda i: (points[i][1], -points[i][0], i)), True
    return min(range(len(points)), key=lambda i: (-points[i][0], points[i][1], i)), False


def choose_trial(trials: Sequence[Any], reference_accuracy: float, max_drop: float) -> tuple[Any, bool]:
    """The fewest-NFE complete trial within ``max_drop`` of ``reference_accuracy`` (see the rule)."""
    from optuna.trial import TrialState

    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE and t.values), key=lambda t: t.number)
    if not complete:
        raise RuntimeError("the study has no complete trial to choose from (all pruned or failed?)")
    i, met = choose_index([(t.values[0], t.values[1]) for t in complete], reference_accuracy, max_drop)
    return complete[i], met


def format_front(front: Sequence[Any], chosen: Any, gen_length: int) -> str:
    """The Pareto front as a text table; the chosen trial is starred."""
    lines = [f"{'':2}{'trial':>5} {'acc':>6} {'NFE':>7} {'tok/fwd':>8}  params",
             "-" * 60]
    for t in front:
        mark = "* " if chosen is not None and t.number == chosen.number else "  "
        tpf = t.user_attrs.get("tpf", gen_length / t.values[1] if t.values[1] else float("nan"))
        lines.append(f"{mark}{t.number:>5} {t.values[0]:>6.3f} {t.values[1]:>7.2f} {tpf:>8.2f}  "
                     + ", ".join(f"{k}={_fmt(v)}" for k, v in t.params.items()))
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def plot_front(study: Any, chosen: Any, reference: dict[str, Any], max_drop: float,
               path: "str | os.PathLike", title: str = "") -> Path:
    """Accuracy vs NFE of every complete trial, the front highlighted, the choice starred (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    front = pareto_front(study)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.scatter([t.values[1] for t in complete], [t.values[0] for t in complete], s=18, c="0.65",
               label=f"trials ({len(complete)})")
    ax.plot([t.values[1] for t in front], [t.values[0] for t in front], "o-", c="tab:orange", ms=6,
            label="Pareto front")
    ax.scatter([reference["nfe"]], [reference["accuracy"]], marker="X", s=80, c="k",
               label="sequential (reference)")
    ax.axhline(reference["accuracy"] - max_drop, ls="--", lw=0.8, c="0.4",
               label=f"reference − {max_drop:g}")
    if chosen is not None:
        ax.scatter([chosen.values[1]], [chosen.values[0]], marker="*", s=220, c="tab:red", zorder=5,
                   label=f"chosen (trial {chosen.number})")
    ax.set_xlabel("mean NFE per sample (validation)")
    ax.set_ylabel("exact-match accuracy (validation)")
    ax.set_title(title or study.study_name, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- the whole run
@dataclass
class TuneResult:
    """Outcome of :func:`tune_controller` (figures are dicts: accuracy, nfe, tpf, n)."""

    study_name: str
    storage: str
    path: Path
    plot: Optional[Path]
    trial: int
    params: dict
    met_target: bool
    validation: dict
    reference_validation: dict
    test: dict
    reference_test: dict
    front: list = field(default_factory=list)
    n_trials: int = 0
    ran: int = 0

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"], d["plot"] = str(self.path), (str(self.plot) if self.plot else None)
        return d


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "study"


def tune_controller(
    controller: str,
    task: str,
    *,
    model: Optional[str] = None,
    loaded: Optional[LoadedModel] = None,
    task_params: Optional[dict[str, Any]] = None,
    n_trials: int = 20,
    workers: int = 1,
    storage: Any = None,
    study_name: Optional[str] = None,
    out_dir: "str | os.PathLike" = DEFAULT_OUT,
    n_val: int = 64,
    n_test: int = 200,
    batch_size: int = 64,
    max_drop: float = 0.01,
    prune_margin: Optional[float] = 0.25,
    prune_fraction: float = 0.25,
    fixed: Optional[dict[str, Any]] = None,
    decode: Optional[dict[str, Any]] = None,
    seed: int = 0,
    data_seed: int = 0,
    device: str = "cpu",
    plot: bool = True,
    verbose: bool = True,
    mp_context: str = "spawn",
) -> TuneResult:
    """Tune ``controller`` on ``task`` (see the module docstring for every rule).

    Args:
        controller: a registered controller name with a declared search space.
        task: a registered task name (``task_params`` for its size knobs).
        model: model name or folder (default ``tiny-<task>``); or pass ``loaded`` directly (it is
            pickled to spawned workers).
        n_trials: total finished trials the study should hold (resuming counts earlier ones).
        workers: processes sharing the storage (needs a storage other than ``memory``).
        storage: storage spec or object (default SQLite ``<out_dir>/<study>.db``).
        study_name: default ``<controller>-<task>-<model>``.
        n_val, n_test: validation examples per trial, test examples for the reported figures.
        max_drop: accuracy the chosen point may lose against sequential decoding (validation).
        prune_margin: prune a trial whose accuracy on the first ``prune_fraction`` of the
            validation examples is this far below sequential's there (``None`` = never prune).
        fixed: controller parameters held fixed (removed from the space).
        decode: :class:`DecodeConfig` options (default: the task's gen_length / block length).
        seed: sampler seed (decoding uses ``decode['seed']``, default 0).

    Returns:
        :class:`TuneResult` with ``path`` the exported YAML (``--controller tuned:PATH``).
    """
    import optuna

    from .controller_io import save_controller
    from .evaluate import evaluate
    from .tasks import get_task

    if n_trials < 1 or workers < 1 or n_val < 1 or n_test < 0:
        raise ParameterError(f"need n_trials ≥ 1, workers ≥ 1, n_val ≥ 1, n_test ≥ 0; got "
                             f"{n_trials}, {workers}, {n_val}, {n_test}")
    if not 0.0 <= max_drop <= 1.0:
        raise ParameterError(f"--max-drop={max_drop} is out of range; allowed: number in [0, 1]")
    if not 0.0 < prune_fraction <= 1.0:
        raise ParameterError(f"--prune-fraction={prune_fraction} is out of range; allowed: (0, 1]")
    cls = CONTROLLERS.get(controller)
    fixed = dict(fixed or {})
    tuned_space(cls, fixed)  # fails early on an empty space
    task_obj = get_task(task, **(task_params or {}))
    if loaded is None:
        from .models import load_model

        model = model or f"tiny-{task_obj.name}"
        loaded = load_model(model, device=device)
    model_label = model or loaded.name
    dec = {"gen_length": task_obj.gen_length, "block_length": task_obj.default_block_length, **(decode or {})}
    config = DecodeConfig.build(**dec)
    settings = TuneSettings(
        controller=controller, task=task_obj.name, task_params=task_obj.get_params(),
        model=model if (model and workers > 1) else loaded, device=device, fixed=fixed,
        decode=config.get_params(), n_val=n_val, prune_fraction=prune_fraction,
        prune_margin=prune_margin, batch_size=batch_size, data_seed=data_seed,
    )
    study_name = _safe_name(study_name or f"{controller}-{task_obj.name}-{Path(str(model_label)).name}")
    out = Path(out_dir)
    if workers > 1 and (storage is not None and not isinstance(storage, str)
                        or storage in ("memory", "inmemory", ":memory:")):
        raise ParameterError(
            f"--storage {storage!r} cannot be shared by --workers {workers} processes; use a file or "
            f"server storage ({storage_forms()})")
    storage_spec = storage if storage is not None else f"sqlite:///{out / (study_name + '.db')}"
    store = open_storage(storage_spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name, storage=store, load_if_exists=True,
                                directions=["maximize", "minimize"])
    _check_setup(study, settings, storage_spec)

    val = task_obj.examples("validation", n_val, seed=data_seed)
    reference = study.user_attrs.get("reference")
    if reference is None:
        ref_ctrl = build_controller(REFERENCE)
        c, n = score_examples(loaded, task_obj, ref_ctrl, config, val, batch_size)
        reference = {**_figures(c, n, config.gen_length),
                     "chunk_accuracy": _mean(c[: settings.n_chunk]), "controller": REFERENCE}
        study.set_user_attr("reference", reference)
        study.set_user_attr("setup", _plain(settings.setup()))
        point = default_point(cls, tuned_space(cls, fixed))
        if point is not None and not study.trials:
            study.enqueue_trial(point, skip_if_exists=True)
    if verbose:
        print(f"study {study_name} in {_redact(str(storage_spec)) if isinstance(storage_spec, str) else 'memory'}: "
              f"{_count_done(study)} finished trials, target {n_trials}; reference {REFERENCE} on "
              f"{n_val} validation examples: accuracy {reference['accuracy']:.3f}, NFE {reference['nfe']:.2f}",
              file=sys.stderr)

    ran = _run_workers(settings, storage_spec, store, study_name, n_trials, seed, workers, verbose, loaded,
                       mp_context)
    study = optuna.load_study(study_name=study_name, storage=store)
    chosen, met = choose_trial(study.trials, reference["accuracy"], max_drop)
    params = {**fixed, **chosen.params}
    ctrl = cls.build(**params)
    front = pareto_front(study)
    test = evaluate(loaded, task_obj, ctrl, config, split="test", n=n_test, batch_size=batch_size,
                    data_seed=data_seed).row() if n_test else {}
    ref_test = evaluate(loaded, task_obj, build_controller(REFERENCE), config, split="test", n=n_test,
                        batch_size=batch_size, data_seed=data_seed).row() if n_test else {}
    validation = {"accuracy": chosen.values[0], "nfe": chosen.values[1],
                  "tpf": chosen.user_attrs.get("tpf"), "n": n_val}
    plot_path = None
    if plot:
        plot_path = plot_front(study, chosen, reference, max_drop, out / f"{study_name}_pareto.png",
                               title=f"{controller} on {task_obj.name} ({model_label})")
    path = save_controller(ctrl, out / f"{study_name}.yaml", decode_config=config, extra={
        "study": study_name, "storage": _redact(storage_spec) if isinstance(storage_spec, str) else "object",
        "trial": chosen.number, "task": task_obj.name, "model": str(model_label),
        "rule": f"fewest mean NFE with validation accuracy >= {REFERENCE} - {max_drop:g}",
        "met_target": met, "validation": validation, "reference_validation": _pick(reference),
        "test": _pick(test), "reference_test": _pick(ref_test),
    })
    result = TuneResult(
        study_name=study_name, storage=_redact(str(storage_spec)) if isinstance(storage_spec, str) else "object",
        path=path, plot=plot_path, trial=chosen.number, params=_plain(ctrl.get_params()), met_target=met,
        validation=validation, reference_validation=_pick(reference), test=_pick(test),
        reference_test=_pick(ref_test),
        front=[{"trial": t.number, "accuracy": t.values[0], "nfe": t.values[1], "params": t.params} for t in front],
        n_trials=_count_done(study), ran=ran,
    )
    if verbose:
        print(report(result, front, chosen, config.gen_length))
    return result


def _pick(fig: dict[str, Any]) -> dict[str, Any]:
    return {k: fig[k] for k in ("accuracy", "nfe", "tpf", "n") if k in fig}


def _check_setup(study: Any, settings: TuneSettings, storage_spec: Any) -> None:
    old = study.user_attrs.get("setup")
    if not old:
        return
    new = _plain(settings.setup())
    for key in SETUP_KEYS:
        if key == "model":
            continue  # a LoadedModel's label may differ between calls; the rest must agree
        if old.get(key) != new.get(key):
            raise ParameterError(
                f"study {study.study_name!r} was created with {key}={old.get(key)!r}, not {new.get(key)!r}; "
                f"use another --study-name (or the original settings) to continue it")


def _run_workers(settings: TuneSettings, storage_spec: Any, store: Any, study_name: str, n_trials: int,
                 seed: int, workers: int, verbose: bool, loaded: LoadedModel, mp_context: str) -> int:
    """One worker runs in this process; ``workers > 1`` spawns that many, each opening the storage."""
    if workers == 1:
        return run_worker(settings, store, study_name, n_trials, seed, 0, None, verbose, loaded)
    import multiprocessing as mp

    ctx = mp.get_context(mp_context)
    threads = max(1, (os.cpu_count() or 1) // workers)
    before = _count_done(store, study_name)
    procs = [ctx.Process(target=run_worker, name=f"adec-tune-{i}",
                         args=(settings, storage_spec, study_name, n_trials, seed, i, threads, verbose))
             for i in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [f"{p.name} (exit {p.exitcode})" for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"tuning worker(s) failed: {', '.join(bad)}; the study keeps what they finished")
    return _count_done(store, study_name) - before


def report(result: TuneResult, front: Sequence[Any], chosen: Any, gen_length: int) -> str:
    """The printed summary: the front, the choice, validation and test figures side by side."""
    rv, v, rt, t = result.reference_validation, result.validation, result.reference_test, result.test
    rows = [("sequential (reference)", rv, rt), (f"chosen (trial {result.trial})", v, t)]
    lines = [f"Pareto front of {result.study_name} ({result.n_trials} finished trials):",
             format_front(front, chosen, gen_length), "",
             f"{'':26}{'val acc':>8} {'val NFE':>8} {'val t/f':>8} | {'test acc':>8} {'test NFE':>8} {'test t/f':>8}"]
    for label, a, b in rows:
        lines.append(f"{label:<26}{_f(a, 'accuracy'):>8} {_f(a, 'nfe'):>8} {_f(a, 'tpf'):>8} | "
                     f"{_f(b, 'accuracy'):>8} {_f(b, 'nfe'):>8} {_f(b, 'tpf'):>8}")
    lines.append("" if result.met_target else
                 "note: no trial reached the target accuracy; the most accurate trial was exported")
    lines.append(f"exported: {result.path}  (use --controller tuned:{result.path})")
    if result.plot:
        lines.append(f"plot: {result.plot}")
    return "\n".join(lines)


def _f(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    return "-" if v is None else f"{v:.3f}" if key == "accuracy" else f"{v:.2f}"
