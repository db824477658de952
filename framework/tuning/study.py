"""Optuna tuning of a controller's declared search space: accuracy up, NFE down.

A study has two objectives on the **validation** split of a task: f₁ = accuracy, the mean of the
task's own score (exact match; the ``data`` task's metric; an lm-eval task's headline figure) (maximise) and f₂ = mean NFE per sample (minimise). The space is the controller's
``search_space()`` (every :class:`~adaptive_decoding.framework.core.params.Param` with ``tune=``): a 2-tuple of numbers on
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

Invalid points (a :class:`~adaptive_decoding.framework.core.params.ParameterError` while building or decoding, e.g.
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
:func:`adaptive_decoding.framework.engine.controller_io.save_controller` to ``<out_dir>/<study>.yaml``, which
``--controller tuned:PATH`` loads; its figures and the reference's are then measured on the
**test** split and reported next to the validation ones.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import CONTROLLERS
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.models.protocol import LoadedModel
from adaptive_decoding.framework.tuning.front import choose_trial, format_front, pareto_front, plot_front
from adaptive_decoding.framework.tuning.objective import (
    REFERENCE,
    SETUP_KEYS,
    TuneSettings,
    count_done,
    mean,
    plain_params,
    run_worker,
    score_examples,
)
from adaptive_decoding.framework.tuning.options import TuneOptions
from adaptive_decoding.framework.tuning.space import default_point, tuned_space, with_point
from adaptive_decoding.framework.tuning.storage import open_storage, redact_url, storage_forms


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


def safe_study_name(text: str) -> str:
    """A study's name as used for its files: runs of characters other than letters, digits, ``_``,
    ``.`` and ``-`` become ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "study"


def tune_controller(controller: str, task: str, options: Optional[TuneOptions] = None, *,
                    model: Optional[str] = None, loaded: Optional[LoadedModel] = None,
                    task_params: Optional[dict[str, Any]] = None, model_options: Optional[dict[str, Any]] = None,
                    device: str = "cpu") -> TuneResult:
    """Tune ``controller`` on ``task`` by ``options`` (see the module docstring for every rule).

    Args:
        controller: a registered controller name with a declared search space.
        task: a registered task name (``task_params`` for its size knobs).
        options: :class:`~adaptive_decoding.framework.tuning.options.TuneOptions` (default every default): ``search``
            (trials, sampler seed, fixed parameters, ranges, pruning), ``evaluation`` (validation and
            test sizes, decoding options, ``max_drop``), ``study`` (storage, name, workers),
            ``output`` (folder, plot).
        model: model name or folder (default ``tiny-<task>``); or pass ``loaded`` directly (it is
            pickled to spawned workers).
        model_options: more :func:`adaptive_decoding.framework.models.zoo.load_model` options for ``model`` (``dtype``,
            ``trust_remote_code``, ``query_chunk``, ``chat``), also used by spawned workers; the
            model is loaded on ``device``.

    Returns:
        :class:`TuneResult` with ``path`` the exported YAML (``--controller tuned:PATH``).
    """
    opts = (options or TuneOptions()).validate()
    search, ev, st = opts.search, opts.evaluation, opts.study
    cls = CONTROLLERS.get(controller)
    fixed = dict(search.fixed)
    tuned_space(cls, fixed, search.ranges)  # fails early on an empty space or a bad --range
    model_opts = {**(model_options or {}), "device": device}
    task_obj, loaded, model_label, config = _load_setup(task, task_params, model, loaded, model_opts, ev.decode)
    settings = TuneSettings(
        controller=controller, task=task_obj.name, task_params=task_obj.get_params(),
        model=model if (model and st.workers > 1) else loaded, device=device, model_options=model_opts, fixed=fixed,
        decode=config.get_params(), n_val=ev.n_val, prune_fraction=search.prune_fraction,
        prune_margin=search.prune_margin, batch_size=ev.batch_size, data_seed=ev.data_seed,
        ranges=dict(search.ranges),
    )
    study_name = safe_study_name(st.study_name or f"{controller}-{task_obj.name}-{Path(str(model_label)).name}")
    out = Path(opts.output.out_dir)
    storage_spec, store, study = _open_study(settings, st.storage, study_name, out, st.workers)
    reference = _ensure_reference(study, settings, cls, loaded, task_obj, config)
    if opts.output.verbose:
        print(f"study {study_name} in {_storage_label(storage_spec)}: {count_done(study)} finished trials, "
              f"target {search.n_trials}; reference {REFERENCE} on {ev.n_val} validation examples: accuracy "
              f"{reference['accuracy']:.3f}, NFE {reference['nfe']:.2f}", file=sys.stderr)
    run = _Study(cls, settings, opts, study_name, storage_spec, store, loaded, task_obj, config, str(model_label),
                 out, reference)
    return _choose_and_export(run, _run_workers(run))


@dataclass
class _Study:
    """One tuning run, shared by its stages: the controller class, the workers' settings, the options,
    the study (name, storage spec and storage), the model, task and loop options, the model's label,
    the output folder and the reference's validation figures."""

    cls: type
    settings: TuneSettings
    opts: TuneOptions
    name: str
    storage_spec: Any
    store: Any
    loaded: LoadedModel
    task: Any
    config: DecodeConfig
    model_label: str
    out: Path
    reference: dict


def _load_setup(task: str, task_params: Optional[dict], model: Optional[str], loaded: Optional[LoadedModel],
                options: dict, decode: Optional[dict]) -> tuple[Any, LoadedModel, str, DecodeConfig]:
    """The task, the model (the task's built-in one by default) loaded with ``options``, its label and
    the decoding config."""
    from adaptive_decoding.framework.tasks.base import get_task

    task_obj = get_task(task, **(task_params or {}))
    if loaded is None:
        from adaptive_decoding.framework.training.zoo import load_model_for_task

        loaded, model = load_model_for_task(task_obj, model, **options)
    dec = {"gen_length": task_obj.gen_length, "block_length": task_obj.default_block_length, **(decode or {})}
    return task_obj, loaded, model or loaded.name, DecodeConfig.build(**dec)


def _storage_label(storage_spec: Any) -> str:
    return redact_url(str(storage_spec)) if isinstance(storage_spec, str) else "memory"


def _open_study(settings: TuneSettings, storage: Any, study_name: str, out: Path, workers: int) -> tuple:
    """``(storage spec, storage, study)``: the study created or loaded, its setup checked."""
    import optuna

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
    return storage_spec, store, study


def _ensure_reference(study: Any, settings: TuneSettings, cls: type, loaded: LoadedModel, task_obj: Any,
                      config: DecodeConfig) -> dict[str, Any]:
    """Sequential decoding's figures on the validation examples (measured once per study, stored in
    it), and the controller's default point enqueued as a new study's first trial."""
    reference = study.user_attrs.get("reference")
    if reference is not None:
        return reference
    val = task_obj.examples("validation", settings.n_val, seed=settings.data_seed)
    scored = score_examples(loaded, task_obj, build_controller(REFERENCE), config, val, settings.batch_size)
    reference = {**scored.figures(), "chunk_accuracy": mean(scored.correct[: settings.n_chunk]),
                 "controller": REFERENCE}
    study.set_user_attr("reference", reference)
    study.set_user_attr("setup", plain_params(settings.setup()))
    point = default_point(cls, tuned_space(cls, settings.fixed, settings.ranges))
    if point is not None and not study.trials:
        study.enqueue_trial(point, skip_if_exists=True)
    return reference


def _choose_and_export(run: _Study, ran: int) -> TuneResult:
    """Choose the trial by the rule, measure it and the reference on the test split, export it."""
    import optuna

    max_drop, reference, settings = run.opts.evaluation.max_drop, run.reference, run.settings
    study = optuna.load_study(study_name=run.name, storage=run.store)
    chosen, met = choose_trial(study.trials, reference["accuracy"], max_drop)
    ctrl = run.cls.build(**with_point(run.cls, dict(settings.fixed), chosen.params))
    test, ref_test = _test_figures(run.loaded, run.task, ctrl, run.config, run.opts.evaluation.n_test, settings)
    validation = {"accuracy": chosen.values[0], "nfe": chosen.values[1],
                  "tpf": chosen.user_attrs.get("tpf"), "n": settings.n_val}
    plot_path = plot_front(study, chosen, reference, max_drop, run.out / f"{run.name}_pareto.png",
                           title=f"{settings.controller} on {run.task.name} ({run.model_label})"
                           ) if run.opts.output.plot else None
    from adaptive_decoding.framework.engine.controller_io import save_controller

    storage = redact_url(run.storage_spec) if isinstance(run.storage_spec, str) else "object"
    path = save_controller(ctrl, run.out / f"{run.name}.yaml", decode_config=run.config, extra={
        "study": run.name, "storage": storage,
        "trial": chosen.number, "task": run.task.name, "model": run.model_label,
        "rule": f"fewest mean NFE with validation accuracy >= {REFERENCE} - {max_drop:g}",
        "met_target": met, "validation": validation, "reference_validation": _pick(reference),
        "test": _pick(test), "reference_test": _pick(ref_test),
    })
    front = pareto_front(study)
    result = TuneResult(
        study_name=run.name, storage=redact_url(str(run.storage_spec)) if isinstance(run.storage_spec, str) else "object",
        path=path, plot=plot_path, trial=chosen.number, params=plain_params(ctrl.get_params()), met_target=met,
        validation=validation, reference_validation=_pick(reference), test=_pick(test),
        reference_test=_pick(ref_test),
        front=[{"trial": t.number, "accuracy": t.values[0], "nfe": t.values[1], "params": t.params} for t in front],
        n_trials=count_done(study), ran=ran,
    )
    if run.opts.output.verbose:
        print(report(result, front, chosen, run.config.gen_length))
    return result


def _test_figures(loaded: LoadedModel, task_obj: Any, ctrl: Any, config: DecodeConfig, n_test: int,
                  settings: TuneSettings) -> tuple[dict, dict]:
    """The chosen controller's and the reference's figures on ``n_test`` test examples ({} for 0)."""
    from adaptive_decoding.framework.engine.evaluate import evaluate

    if not n_test:
        return {}, {}
    kw = dict(split="test", n=n_test, batch_size=settings.batch_size, data_seed=settings.data_seed)
    return (evaluate(loaded, task_obj, ctrl, config, **kw).row(),
            evaluate(loaded, task_obj, build_controller(REFERENCE), config, **kw).row())


def _pick(fig: dict[str, Any]) -> dict[str, Any]:
    return {k: fig[k] for k in ("accuracy", "nfe", "tpf", "n") if k in fig}


def _check_setup(study: Any, settings: TuneSettings, storage_spec: Any) -> None:
    old = study.user_attrs.get("setup")
    if not old:
        return
    new = plain_params(settings.setup())
    for key in SETUP_KEYS:
        if key == "model":
            continue  # a LoadedModel's label may differ between calls; the rest must agree
        if old.get(key) != new.get(key):
            raise ParameterError(
                f"study {study.study_name!r} was created with {key}={old.get(key)!r}, not {new.get(key)!r}; "
                f"use another --study-name (or the original settings) to continue it")


def _run_workers(run: _Study) -> int:
    """One worker runs in this process; ``workers > 1`` spawns that many, each opening the storage."""
    settings, store, study_name, loaded = run.settings, run.store, run.name, run.loaded
    n_trials, seed, verbose = run.opts.search.n_trials, run.opts.search.seed, run.opts.output.verbose
    workers = run.opts.study.workers
    if workers == 1:
        return run_worker(settings, store, study_name, n_trials, seed, 0, None, verbose, loaded)
    import multiprocessing as mp

    ctx = mp.get_context(run.opts.study.mp_context)
    threads = max(1, (os.cpu_count() or 1) // workers)
    before = count_done(store, study_name)
    # enqueued trials (the default point) run here first: two processes can pop the same waiting
    # trial from an SQLite storage, and the second then fails ("Cannot tell a COMPLETE trial",
    # optuna/optuna#4621)
    from optuna.trial import TrialState

    waiting = count_done(store, study_name, states=(TrialState.WAITING,))
    if waiting:
        run_worker(settings, store, study_name, min(n_trials, before + waiting), seed, 0, None, verbose, loaded)
    failures = ctx.SimpleQueue()  # a failing worker's traceback, so that the error says why
    procs = [ctx.Process(target=_worker_process, name=f"adec-tune-{i}",
                         args=(failures, settings, run.storage_spec, study_name, n_trials, seed, i, threads, verbose))
             for i in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [f"{p.name} (exit {p.exitcode})" for p in procs if p.exitcode != 0]
    if bad:
        why = []
        while not failures.empty():
            name, text = failures.get()
            why.append(f"--- {name} ---\n{text}")
        raise RuntimeError(f"tuning worker(s) failed: {', '.join(bad)}; the study keeps what they finished"
                           + ("\n" + "\n".join(why) if why else ""))
    return count_done(store, study_name) - before


def _worker_process(failures: Any, *args: Any) -> None:
    """A spawned worker: :func:`run_worker`, its traceback's tail sent to the parent if it raises."""
    import multiprocessing as mp
    import traceback

    try:
        run_worker(*args)
    except BaseException:
        failures.put((mp.current_process().name, traceback_tail(traceback.format_exc())))
        raise


def traceback_tail(text: str, limit: int = 4000) -> str:
    """A traceback cut to ``limit`` characters (below a pipe's buffer): its header line, then its end.

    The innermost frames and the exception say why a worker failed; the header keeps it readable as
    a traceback however long the paths of the outer frames are.
    """
    if len(text) <= limit:
        return text
    head, _, _ = text.partition("\n")
    return f"{head}\n  ...\n{text[-(limit - len(head) - 7):]}"


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
