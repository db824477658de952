"""``adec train-controller``'s pipeline: imitation, then DAgger rounds or an RL fine-tune; calibrate; report.

``method``:

* ``imitation``: rows of one-token-per-step decoding, labelled by its final tokens
  (:mod:`adaptive_decoding.framework.learning.rollouts`); each policy kind is trained on them;
* ``dagger``: imitation, then ``rounds`` times: decode the train split with the current policy
  (at its ``dagger_threshold``), label the visited states from each state
  (:mod:`adaptive_decoding.framework.learning.dagger`), aggregate with all earlier rows, retrain from the current weights;
* ``rl``: imitation, then the REINFORCE fine-tune with a group baseline (:mod:`adaptive_decoding.framework.learning.rl`).

Every policy is then calibrated on the validation split (fewest NFE within ``max_drop`` of
sequential accuracy) and decoded on the test split. Files: ``<kind>.pt`` per policy, ``summary.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from adaptive_decoding.framework.core.options import ExampleDraw
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.learning.features import PEER_FEATURES, default_features, parse_features
from adaptive_decoding.framework.learning.nets import CONTROLLER_OF, KINDS
from adaptive_decoding.framework.learning.options import (
    LABELS,
    METHODS,
    WINDOW_ARCH,
    DaggerVisit,
    PolicyOptions,
    RunLogging,
    ThresholdCalibration,
)
from adaptive_decoding.framework.learning.policy import DEFAULT_OUT, load_policy, save_policy
from adaptive_decoding.framework.learning.rollouts import RolloutDataset, build_dataset
from adaptive_decoding.framework.learning.train import (
    calibrate_threshold,
    policy_controller,
    policy_metrics,
    train_logreg,
    train_net,
)
from adaptive_decoding.framework.models.structure import task_generation_structure

__all__ = ["LABELS", "METHODS", "WINDOW_ARCH", "PolicyOptions", "PolicyResult", "check_options", "report",
           "train_policy"]


@dataclass
class PolicyResult:
    """Outcome of :func:`train_policy`: the policy files and every figure measured."""

    paths: dict
    out_dir: Path
    method: str
    dataset: dict
    metrics: dict
    calibration: dict
    test: dict
    training: dict
    rounds: list = field(default_factory=list)
    #: τ₂ of ``verified`` when the policy was trained and calibrated inside it (``--rl-verify``)
    verify_threshold: Optional[float] = None

    @property
    def mlp_path(self) -> Optional[Path]:
        return self.paths.get("mlp")

    @property
    def logreg_path(self) -> Optional[Path]:
        return self.paths.get("logreg")

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d["paths"] = {k: str(v) for k, v in self.paths.items()}
        d["out_dir"] = str(self.out_dir)
        return d


def check_options(method: str, policies: Sequence[str], rounds: int, states_per_rollout: int,
                  labels: str = "reference", features: "str | Sequence[str] | None" = None) -> None:
    """Refuse bad values before any work, naming what is allowed (the command line's wording; the
    :class:`PolicyOptions` groups check the same values by their declared parameters)."""
    if features is not None:
        parse_features(features)
    if labels not in LABELS:
        raise ValueError(f"labels={labels!r}; allowed: {', '.join(LABELS)}")
    if method not in METHODS:
        raise ValueError(f"method={method!r}; allowed: {', '.join(METHODS)}")
    bad = [p for p in policies if p not in KINDS]
    if bad or not policies:
        raise ValueError(f"policy={','.join(bad) or '(none)'!s}; allowed: {', '.join(KINDS)} (comma "
                         f"separated)")
    if method == "dagger" and rounds < 1:
        raise ValueError(f"rounds={rounds} with method=dagger; allowed: an integer ≥ 1")
    if states_per_rollout < 1:
        raise ValueError(f"states_per_rollout={states_per_rollout}; allowed: an integer ≥ 1")


@dataclass
class _Run:
    """One pipeline run's state, shared by its stages: the model, the task, the loop options ``config``,
    the options, the output folder, the policy files by kind, the run's ``meta`` (saved with every
    policy and sent to W&B), the networks and training figures by kind, and the printer ``say``."""

    loaded: Any
    task: Any
    config: DecodeConfig
    opts: PolicyOptions
    out: Path
    paths: dict
    meta: dict
    say: Any
    progress: bool
    nets: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)

    @property
    def policies(self) -> list[str]:
        return list(self.opts.network.policies)

    @property
    def batch(self) -> int:
        return self.opts.data.decode_batch_size

    @property
    def threshold(self) -> float:
        """τ the policies decode with before calibration (DAgger's visits, the saved files)."""
        return self.opts.rounds.dagger_threshold


def _fit(run: _Run, kind: str, train: RolloutDataset, val: RolloutDataset, init: Any = None) -> tuple:
    """Fit one ``kind`` network (``logreg`` by scikit-learn, the others by Lightning, from ``init``)."""
    t = run.opts.training
    if kind == "logreg":
        return train_logreg(train, C=t.C, seed=t.seed), {"epochs": None}
    logging = RunLogging.build(wandb_mode=run.opts.output.wandb_mode, progress=run.progress, run_config=run.meta)
    return train_net(kind, train, val, out_dir=run.out, arch=run.opts.network.arch(kind), training=t.for_kind(kind),
                     logging=logging, init=init)


def train_policy(task: str, options: Optional[PolicyOptions] = None, *, model: Optional[str] = None,
                 loaded: Any = None, task_params: Optional[dict] = None, model_options: Optional[dict] = None,
                 device: str = "cpu") -> PolicyResult:
    """Train the policies of ``options`` (:class:`PolicyOptions`, default every default) by its
    method (module docstring); returns paths and figures.

    ``options.data.labels``: ``reference`` (a position is safe when its prediction equals the token the
    reference decode ends with) or ``set`` (safe *together with* the more confident positions of its
    step, by the task's verifier: :mod:`adaptive_decoding.framework.learning.set_labels`), for the imitation rows and
    DAgger rounds.

    ``model`` is a folder, a built-in or a cached hub name (default: the task's built-in model),
    loaded on ``device`` with ``model_options`` (``dtype``, ``chat``, ``trust_remote_code``,
    ``query_chunk``); the ``data`` and ``lm_eval`` tasks need one. ``loaded`` skips the loading.

    Training rows come from the train split, early stopping and calibration from the validation
    split, the reported decoding figures from the test split.
    """
    opts = (options or PolicyOptions()).validate()
    t0, say = time.perf_counter(), _printer(opts.output.verbose)
    from adaptive_decoding.framework.tasks.base import get_task

    task_obj = get_task(task, **(task_params or {}))
    structure = task_generation_structure(task_obj)
    features = policy_features(opts.data.features, structure, task_obj.name)  # before the model is loaded
    loaded, label = _model(task_obj, model, loaded, {**(model_options or {}), "device": device})
    if opts.data.labels == "set":
        check_set_labels(task_obj)
    out = _out_folder(opts.output.out_dir, opts.rounds.method, task_obj.name, label)
    config = DecodeConfig.build(**{"gen_length": task_obj.gen_length,
                                   "block_length": task_obj.default_block_length, **(opts.data.decode or {})})
    run = _Run(loaded, task_obj, config, opts, out, {kind: out / f"{kind}.pt" for kind in opts.network.policies},
               {}, say, opts.output.verbose and sys.stderr.isatty())
    train, val, dataset = _rollout_datasets(run)
    train, val, dataset["features"] = train.select(features), val.select(features), list(features)
    run.meta.update(_meta(run, label, dataset, structure, features))
    _imitation(run, train, val)
    rounds_log = []
    if opts.rounds.method == "dagger":
        rounds_log = _dagger(run, train, val, features)
        dataset["dagger_rows"] = [r["rows"] for r in rounds_log]
    if opts.rounds.method == "rl":
        _rl_stage(run)
    calibration = _calibrate_all(run)
    metrics = {k: policy_metrics(run.nets[k], val, load_policy(run.paths[k]).threshold, k) for k in run.policies}
    test = _test_figures(run)
    run.training["seconds"] = round(time.perf_counter() - t0, 1)
    result = PolicyResult(run.paths, out, opts.rounds.method, dataset, metrics, calibration, test, run.training,
                          rounds=rounds_log, verify_threshold=opts.verify_threshold)
    (out / "summary.json").write_text(json.dumps(result.summary(), indent=2, default=str))
    if opts.output.verbose:
        print(report(result))
    return result


def _meta(run: _Run, label: str, dataset: dict, structure: Optional[dict], features: Sequence[str]) -> dict:
    """The run's description saved with every policy file and sent to W&B."""
    o = run.opts
    return {"task": run.task.name, "task_params": run.task.get_params(), "model": label, "method": o.rounds.method,
            "residual": o.network.residual, "neg_weight": o.training.neg_weight, "decode": run.config.get_params(),
            "dataset": dataset, "seed": o.training.seed, "structure": structure, "features": list(features)}


def check_set_labels(task: Any) -> None:
    """Set labels need the task's verifier (``Task.completable``): refuse a task without one before
    any decoding, naming the alternative."""
    ex = task.examples("train", 1)[0]
    if task.completable(ex, task.target_ids(ex), [False] * task.gen_length) is None:
        raise ValueError(f"labels=set: task {task.name!r} cannot tell whether a partial answer can still end "
                         f"correct (Task.completable); use labels=reference, or implement completable")


def policy_features(features: "str | Sequence[str] | None", structure: Optional[dict],
                    task_name: str) -> tuple[str, ...]:
    """The columns the policies read: ``features`` (names or groups), default every column that is not
    constant on this task (:func:`default_features`); peer columns need a declared structure."""
    if features is None:
        return default_features(structure)
    chosen = parse_features(features)
    peer = [n for n in chosen if n in PEER_FEATURES]
    if peer and not structure:
        raise ValueError(f"features={','.join(peer)}: task {task_name!r} declares no structure (no "
                         f"attention_structure in its generation), so its positions have no peers")
    return chosen


def _printer(verbose: bool) -> Any:
    """``say(*args)``: print to stderr when ``verbose``, else nothing."""
    return (lambda *a: print(*a, file=sys.stderr, flush=True)) if verbose else (lambda *a: None)


def _model(task_obj: Any, model: Optional[str], loaded: Any, options: dict) -> tuple[Any, str]:
    """The loaded model (the task's built-in one unless ``model`` or ``loaded`` is given, loaded with
    ``options``: device, dtype, chat ...) and its label."""
    if loaded is None:
        from adaptive_decoding.framework.training.zoo import load_model_for_task

        loaded, model = load_model_for_task(task_obj, model, **options)
    return loaded, str(model or loaded.name)


def _out_folder(out_dir: "str | os.PathLike | None", method: str, task_name: str, label: str) -> Path:
    """``out_dir``, or ``DEFAULT_OUT/<task>-<model>[-<method>]`` (created)."""
    suffix = "" if method == "imitation" else f"-{method}"
    out = Path(out_dir) if out_dir is not None else DEFAULT_OUT / f"{task_name}-{Path(label).name}{suffix}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _rollout_datasets(run: _Run) -> tuple[RolloutDataset, RolloutDataset, dict[str, Any]]:
    """The training and validation rows (from the ``rollout`` controller's decodes, default sequential;
    labelled by ``labels``) and their figures."""
    d = run.opts.data
    roll = build_controller(d.rollout) if d.rollout else None
    sets = {}
    for split, n in (("train", d.n_train), ("validation", d.n_val)):
        draw = ExampleDraw.build(split=split, n=n, batch_size=d.decode_batch_size)
        if d.labels == "set":
            from adaptive_decoding.framework.learning.set_labels import build_set_dataset

            sets[split] = build_set_dataset(run.loaded, run.task, roll or build_controller("sequential"), draw,
                                            config=run.config)
        else:
            sets[split] = build_dataset(run.loaded, run.task, draw, config=run.config, rollout=roll)
    train, val = sets["train"], sets["validation"]
    dataset = {"train_rows": len(train), "val_rows": len(val), "train_positive_rate": train.positive_rate,
               "val_positive_rate": val.positive_rate, "n_train": d.n_train, "n_val": d.n_val,
               "rollout": d.rollout or "sequential", "labels": d.labels}
    run.say(f"rollouts: {len(train)} training rows ({train.positive_rate:.1%} safe), "
            f"{len(val)} validation rows ({val.positive_rate:.1%} safe)")
    return train, val, dataset


def _imitation(run: _Run, train: RolloutDataset, val: RolloutDataset) -> None:
    """Fit each policy kind on the rows (imitation) and save it: ``run.nets`` and ``run.training``."""
    for kind in run.policies:
        t1 = time.perf_counter()
        run.nets[kind], info = _fit(run, kind, train, val)
        save_policy(run.nets[kind], run.paths[kind], kind=kind, threshold=run.threshold, meta=run.meta)
        run.training[kind] = {**info, "imitation_seconds": round(time.perf_counter() - t1, 1)}


def _rl_stage(run: _Run) -> None:
    """Fine-tune each imitation policy by RL (:func:`rl_finetune` with ``rl``'s options) and save it."""
    from adaptive_decoding.framework.learning.rl_train import rl_finetune

    logging = RunLogging.build(wandb_mode=run.opts.output.wandb_mode, progress=run.opts.output.verbose)
    for kind in run.policies:
        t1 = time.perf_counter()
        run.nets[kind], info = rl_finetune(run.loaded, run.task, run.paths[kind], run.config, run.opts.rl_options(),
                                           out_dir=run.out / kind, logging=logging, decode_batch_size=run.batch)
        save_policy(run.nets[kind], run.paths[kind], kind=kind, threshold=run.threshold,
                    meta={**run.meta, "rl": info})
        run.training[kind]["rl"] = {**info, "seconds": round(time.perf_counter() - t1, 1)}


def _calibrate_all(run: _Run) -> dict[str, Any]:
    """Calibrate each policy's threshold on the validation split (when ``calibrate``; the sequential
    reference is decoded once) and save the policy with it: the calibration figures per kind."""
    cal_opts, n_val = run.opts.calibration, run.opts.data.n_val
    calibration: dict[str, Any] = {}
    reference = None
    grid = ThresholdCalibration.build(split="validation", n=n_val, batch_size=run.batch,
                                      thresholds=cal_opts.thresholds, max_drop=cal_opts.max_drop)
    for kind in run.policies:
        chosen = run.threshold
        if cal_opts.calibrate:
            run.say(f"calibrating the {kind} policy's threshold on {n_val} validation prompts ...")
            cal = calibrate_threshold(run.loaded, run.task, CONTROLLER_OF[kind], run.paths[kind], run.config,
                                      grid, reference=reference, verify_threshold=run.opts.verify_threshold)
            reference = cal["reference"]
            calibration[kind] = cal
            chosen = cal["threshold"]
        save_policy(run.nets[kind], run.paths[kind], kind=kind, threshold=chosen,
                    meta={**run.meta, "calibration": calibration.get(kind), "training": run.training[kind]})
    return calibration


def _test_figures(run: _Run) -> dict[str, Any]:
    """Sequential decoding and every saved policy (inside ``verified`` when RL verified) on ``n_test``
    test prompts: their evaluation rows by label (none when ``n_test`` is 0)."""
    from adaptive_decoding.framework.engine.evaluate import evaluate

    verify, n_test = run.opts.verify_threshold, run.opts.data.n_test
    test: dict[str, Any] = {}
    if n_test:
        runs = [("sequential", build_controller("sequential"))] + [
            (CONTROLLER_OF[k] if verify is None else f"verified {CONTROLLER_OF[k]}",
             policy_controller(CONTROLLER_OF[k], run.paths[k], verify_threshold=verify)) for k in run.policies]
        for label_, ctrl in runs:
            test[label_] = evaluate(run.loaded, run.task, ctrl, run.config, split="test", n=n_test,
                                    batch_size=run.batch).row()
    return test


def _dagger(run: _Run, train: RolloutDataset, val: RolloutDataset, features: Sequence[str]) -> list:
    """The DAgger rounds, per policy kind: visit, label from the visited states, aggregate, retrain."""
    from tqdm.auto import tqdm

    log = []
    data = {kind: train for kind in run.policies}
    n_train = run.opts.data.n_train
    for r in range(1, run.opts.rounds.rounds + 1):
        for kind in run.policies:
            t1 = time.perf_counter()
            ctrl = build_controller(CONTROLLER_OF[kind], policy=str(run.paths[kind]), threshold=run.threshold)
            with tqdm(total=n_train, desc=f"DAgger round {r} ({kind}): visit and label", unit="prompt",
                      disable=not run.progress) as bar:
                new = _visit_and_label(run, ctrl, r, bar).select(features)
            data[kind] = RolloutDataset.concat([data[kind], new])
            run.nets[kind], info = _fit(run, kind, data[kind], val, init=None if kind == "logreg" else run.nets[kind])
            save_policy(run.nets[kind], run.paths[kind], kind=kind, threshold=run.threshold, meta=run.meta)
            entry = {"round": r, "policy": kind, "rows": len(new), "safe_rate": new.positive_rate,
                     "total_rows": len(data[kind]), "seconds": round(time.perf_counter() - t1, 1)}
            run.say(f"DAgger round {r} ({kind}): {len(new)} on-policy rows ({new.positive_rate:.1%} safe), "
                    f"{len(data[kind])} in all")
            run.training[kind].setdefault("dagger", []).append({**entry, **{k: v for k, v in info.items()
                                                                            if k != "history"}})
            log.append(entry)
    return log


def _visit_and_label(run: _Run, ctrl: Any, round_: int, progress: Any) -> RolloutDataset:
    """One DAgger round's rows: the states ``ctrl`` visits on the train split, labelled by the reference
    continued from them (``states_per_rollout`` per prompt) or, with set labels, every one of them."""
    draw = ExampleDraw.build(split="train", n=run.opts.data.n_train, batch_size=run.batch)
    if run.opts.data.labels == "set":
        from adaptive_decoding.framework.learning.set_labels import build_set_dataset

        return build_set_dataset(run.loaded, run.task, ctrl, draw, config=run.config, progress=progress)
    from adaptive_decoding.framework.learning.dagger import build_on_policy_dataset

    visit = DaggerVisit.build(states_per_rollout=run.opts.rounds.states_per_rollout,
                              seed=run.opts.training.seed + round_, batch_size=run.batch)
    return build_on_policy_dataset(run.loaded, run.task, ctrl, draw, visit, config=run.config, progress=progress)


def report(result: PolicyResult) -> str:
    """Classification metrics (validation rows) and decoding figures (test split) as text."""
    lines = [f"method: {result.method}",
             f"{'policy':<12} {'ROC-AUC':>8} {'avg prec':>8} {'thresh':>7} {'prec':>6} {'recall':>6} "
             f"{'commit':>7}"]
    for kind, m in result.metrics.items():
        lines.append(f"{kind:<12} {m['roc_auc']:>8.4f} {m['average_precision']:>8.4f} {m['threshold']:>7.3f} "
                     f"{m['precision']:>6.3f} {m['recall']:>6.3f} {m['commit_rate']:>7.3f}")
    if result.test:
        lines += ["", f"{'test split':<16} {'acc':>6} {'NFE':>7} {'tok/fwd':>8}"]
        for label, row in result.test.items():
            lines.append(f"{label:<16} {row['accuracy']:>6.3f} {row['nfe']:>7.2f} {row['tpf']:>8.2f}")
    lines.append("")
    for kind, path in result.paths.items():
        use = (f"--controller {CONTROLLER_OF[kind]} --set policy={path}"
               if result.verify_threshold is None else
               f"--controller verified --set inner={CONTROLLER_OF[kind]} --set "
               f"inner_params='{{policy: {path}}}' --set verify_threshold={result.verify_threshold:g}")
        lines.append(f"policy {kind}: {path}  ({use})")
    lines.append(f"training: {result.training.get('seconds')} s in all; logs under "
                 f"{result.out_dir}/lightning")
    return "\n".join(lines)
