"""``adec train-controller``'s pipeline: imitation, then DAgger rounds or an RL fine-tune; calibrate; report.

``method``:

* ``imitation``: rows of one-token-per-step decoding, labelled by its final tokens
  (:mod:`framework.learning.rollouts`); each policy kind is trained on them;
* ``dagger``: imitation, then ``rounds`` times: decode the train split with the current policy
  (at its ``dagger_threshold``), label the visited states from each state
  (:mod:`framework.learning.dagger`), aggregate with all earlier rows, retrain from the current weights;
* ``rl``: imitation, then the REINFORCE fine-tune with a group baseline (:mod:`framework.learning.rl`).

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

from framework.engine.config import DecodeConfig
from framework.engine.controller_io import build_controller
from framework.learning.features import PEER_FEATURES, default_features, parse_features
from framework.learning.nets import CONTROLLER_OF, KINDS
from framework.learning.policy import DEFAULT_OUT, load_policy, save_policy
from framework.learning.rollouts import RolloutDataset, build_dataset
from framework.learning.train import (
    DEFAULT_THRESHOLDS,
    calibrate_threshold,
    policy_controller,
    policy_metrics,
    train_logreg,
    train_net,
)
from framework.models.structure import task_generation_structure

METHODS = ("imitation", "dagger", "rl")
LABELS = ("reference", "set")
#: the window transformer's default width, layers and heads
WINDOW_ARCH = {"d_model": 32, "layers": 2, "heads": 4}


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
                  rl: Optional[dict] = None, labels: str = "reference",
                  features: "str | Sequence[str] | None" = None) -> None:
    """Refuse bad values before any work, naming what is allowed."""
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
    if method == "rl":
        from framework.learning.rl import check_rl_options

        check_rl_options(**(rl or {}))


def _fit(kind: str, train: RolloutDataset, val: RolloutDataset, out: Path, opts: dict,
         init: Any = None) -> tuple:
    if kind == "logreg":
        return train_logreg(train, C=opts["C"], seed=opts["seed"]), {"epochs": None}
    arch = {"hidden": list(opts["hidden"])} if kind == "mlp" else dict(opts["window_arch"])
    if opts["residual"]:
        arch["residual"] = True
    return train_net(kind, train, val, out_dir=out, arch=arch, lr=opts["lr"], max_epochs=opts["max_epochs"],
                     patience=opts["patience"],
                     batch_size=opts["batch_size"] if kind == "mlp" else opts["window_batch"],
                     seed=opts["seed"], wandb_mode=opts["wandb_mode"], accelerator=opts["accelerator"],
                     progress=opts["progress"], run_config=opts["meta"], fast_dev_run=opts["fast_dev_run"],
                     init=init,
                     neg_weight=opts["neg_weight"])


def train_policy(
    task: str, *, model: Optional[str] = None, loaded: Any = None, task_params: Optional[dict] = None,
    out_dir: "str | os.PathLike | None" = None, method: str = "imitation",
    policies: Sequence[str] = ("mlp", "logreg"), n_train: int = 256, n_val: int = 64, n_test: int = 200,
    hidden: Sequence[int] = (32, 32), window_arch: Optional[dict] = None, residual: bool = False,
    neg_weight: float = 1.0, max_epochs: int = 40, patience: int = 5, batch_size: int = 256,
    window_batch: int = 64, lr: float = 3e-3, C: float = 1.0, seed: int = 0, wandb_mode: str = "offline",
    calibrate: bool = True, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, max_drop: float = 0.01,
    rollout: Optional[str] = None, rounds: int = 2, states_per_rollout: int = 4,
    dagger_threshold: float = 0.9, rl: Optional[dict] = None, decode_options: Optional[dict] = None,
    decode_batch_size: int = 64, device: str = "cpu", accelerator: str = "cpu", verbose: bool = True,
    fast_dev_run: bool = False, model_options: Optional[dict] = None, labels: str = "reference",
    features: "str | Sequence[str] | None" = None,
) -> PolicyResult:
    """Train the requested ``policies`` by ``method`` (module docstring); returns paths and figures.

    ``labels``: ``reference`` (a position is safe when its prediction equals the token the reference
    decode ends with) or ``set`` (safe *together with* the more confident positions of its step, by the
    task's verifier: :mod:`framework.learning.set_labels`), for the imitation rows and DAgger rounds.

    ``model`` is a folder, a built-in or a cached hub name (default: the task's built-in model),
    loaded with ``model_options`` (``dtype``, ``chat``, ``trust_remote_code``, ``query_chunk``);
    the ``data`` and ``lm_eval`` tasks need one.

    Training rows come from the train split, early stopping and calibration from the validation
    split, the reported decoding figures from the test split. ``rl`` holds the keyword arguments of
    :func:`framework.learning.rl_train.rl_finetune` (iterations, prompts, group, lam, reward_form, lr).
    """
    check_options(method, policies, rounds, states_per_rollout, rl, labels, features)
    t0, say = time.perf_counter(), _printer(verbose)
    from framework.tasks.base import get_task

    task_obj = get_task(task, **(task_params or {}))
    structure = task_generation_structure(task_obj)
    features = policy_features(features, structure, task_obj.name)  # before the model is loaded
    loaded, label = _model(task_obj, model, loaded, {**(model_options or {}), "device": device})
    if labels == "set":
        check_set_labels(task_obj)
    out = _out_folder(out_dir, method, task_obj.name, label)
    config = DecodeConfig.build(**{"gen_length": task_obj.gen_length,
                                   "block_length": task_obj.default_block_length, **(decode_options or {})})
    train, val, dataset = _rollout_datasets(loaded, task_obj, config, n_train, n_val, decode_batch_size,
                                            rollout, say, labels)
    train, val, dataset["features"] = train.select(features), val.select(features), list(features)
    meta = {"task": task_obj.name, "task_params": task_obj.get_params(), "model": label, "method": method,
            "residual": residual, "neg_weight": neg_weight, "decode": config.get_params(), "dataset": dataset,
            "seed": seed, "structure": structure, "features": list(features)}
    opts = dict(C=C, seed=seed, hidden=hidden, window_arch=window_arch or dict(WINDOW_ARCH), lr=lr,
                max_epochs=max_epochs, patience=patience, batch_size=batch_size, window_batch=window_batch,
                wandb_mode=wandb_mode, accelerator=accelerator, progress=verbose and sys.stderr.isatty(),
                meta=meta, fast_dev_run=fast_dev_run, residual=residual, neg_weight=neg_weight, labels=labels,
                features=features)
    paths = {kind: out / f"{kind}.pt" for kind in policies}
    nets, training = _imitation(policies, train, val, out, opts, paths, meta, dagger_threshold)
    rounds_log = []
    if method == "dagger":
        rounds_log = _dagger(loaded, task_obj, config, policies, paths, nets, train, val, out, opts, training,
                             rounds=rounds, n_train=n_train, states_per_rollout=states_per_rollout,
                             decode_batch_size=decode_batch_size, threshold=dagger_threshold, say=say)
        dataset["dagger_rows"] = [r["rows"] for r in rounds_log]
    if method == "rl":
        _rl_stage(loaded, task_obj, config, policies, paths, nets, training, meta, out, rl or {}, seed=seed,
                  wandb_mode=wandb_mode, verbose=verbose, batch=decode_batch_size, threshold=dagger_threshold)
    verify = (rl or {}).get("verify_threshold") if method == "rl" else None  # decoded inside `verified`
    calibration = _calibrate_all(loaded, task_obj, config, policies, paths, nets, meta, training, calibrate,
                                 n_val=n_val, thresholds=thresholds, max_drop=max_drop, verify=verify,
                                 decode_batch_size=decode_batch_size, threshold=dagger_threshold, say=say)
    metrics = {k: policy_metrics(nets[k], val, load_policy(paths[k]).threshold, k) for k in policies}
    test = _test_figures(loaded, task_obj, config, policies, paths, verify, n_test, decode_batch_size)
    training["seconds"] = round(time.perf_counter() - t0, 1)
    result = PolicyResult(paths, out, method, dataset, metrics, calibration, test, training,
                          rounds=rounds_log, verify_threshold=verify)
    (out / "summary.json").write_text(json.dumps(result.summary(), indent=2, default=str))
    if verbose:
        print(report(result))
    return result


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
        from framework.training.zoo import load_model_for_task

        loaded, model = load_model_for_task(task_obj, model, **options)
    return loaded, str(model or loaded.name)


def _out_folder(out_dir: "str | os.PathLike | None", method: str, task_name: str, label: str) -> Path:
    """``out_dir``, or ``DEFAULT_OUT/<task>-<model>[-<method>]`` (created)."""
    suffix = "" if method == "imitation" else f"-{method}"
    out = Path(out_dir) if out_dir is not None else DEFAULT_OUT / f"{task_name}-{Path(label).name}{suffix}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _rollout_datasets(loaded: Any, task_obj: Any, config: DecodeConfig, n_train: int, n_val: int,
                      decode_batch_size: int, rollout: Optional[str], say: Any,
                      labels: str = "reference") -> tuple[RolloutDataset, RolloutDataset, dict[str, Any]]:
    """The training and validation rows (from ``rollout``'s decodes, default sequential; labelled by
    ``labels``) and their figures."""
    roll = build_controller(rollout) if rollout else None
    if labels == "set":
        from framework.learning.set_labels import build_set_dataset

        ctrl = roll or build_controller("sequential")
        train = build_set_dataset(loaded, task_obj, "train", n_train, ctrl, config=config, batch_size=decode_batch_size)
        val = build_set_dataset(loaded, task_obj, "validation", n_val, ctrl, config=config,
                                batch_size=decode_batch_size)
    else:
        train = build_dataset(loaded, task_obj, "train", n_train, config=config, batch_size=decode_batch_size,
                              rollout=roll)
        val = build_dataset(loaded, task_obj, "validation", n_val, config=config, batch_size=decode_batch_size,
                            rollout=roll)
    dataset = {"train_rows": len(train), "val_rows": len(val), "train_positive_rate": train.positive_rate,
               "val_positive_rate": val.positive_rate, "n_train": n_train, "n_val": n_val,
               "rollout": rollout or "sequential", "labels": labels}
    say(f"rollouts: {len(train)} training rows ({train.positive_rate:.1%} safe), "
        f"{len(val)} validation rows ({val.positive_rate:.1%} safe)")
    return train, val, dataset


def _imitation(policies: Sequence[str], train: RolloutDataset, val: RolloutDataset, out: Path, opts: dict,
               paths: dict, meta: dict, threshold: float) -> tuple[dict, dict]:
    """Fit each policy kind on the rows (imitation) and save it: the nets and their training figures."""
    nets, training = {}, {}
    for kind in policies:
        t1 = time.perf_counter()
        nets[kind], info = _fit(kind, train, val, out, opts)
        save_policy(nets[kind], paths[kind], kind=kind, threshold=threshold, meta=meta)
        training[kind] = {**info, "imitation_seconds": round(time.perf_counter() - t1, 1)}
    return nets, training


def _rl_stage(loaded: Any, task_obj: Any, config: DecodeConfig, policies: Sequence[str], paths: dict,
              nets: dict,
              training: dict, meta: dict, out: Path, rl: dict, *, seed: int, wandb_mode: str, verbose: bool,
              batch: int, threshold: float) -> None:
    """Fine-tune each imitation policy by RL (:func:`rl_finetune`, ``rl`` its options) and save it."""
    from framework.learning.rl_train import rl_finetune

    for kind in policies:
        t1 = time.perf_counter()
        nets[kind], info = rl_finetune(loaded, task_obj, paths[kind], config, out_dir=out / kind,
                                       seed=seed, wandb_mode=wandb_mode, verbose=verbose,
                                       decode_batch_size=batch, **rl)
        save_policy(nets[kind], paths[kind], kind=kind, threshold=threshold, meta={**meta, "rl": info})
        training[kind]["rl"] = {**info, "seconds": round(time.perf_counter() - t1, 1)}


def _calibrate_all(loaded: Any, task_obj: Any, config: DecodeConfig, policies: Sequence[str], paths: dict,
                   nets: dict, meta: dict, training: dict, calibrate: bool, *, n_val: int,
                   thresholds: Sequence[float], max_drop: float, verify: Optional[float],
                   decode_batch_size: int, threshold: float, say: Any) -> dict[str, Any]:
    """Calibrate each policy's threshold on the validation split (when ``calibrate``; the sequential
    reference is decoded once) and save the policy with it: the calibration figures per kind."""
    calibration: dict[str, Any] = {}
    reference = None
    for kind in policies:
        chosen = threshold
        if calibrate:
            say(f"calibrating the {kind} policy's threshold on {n_val} validation prompts ...")
            cal = calibrate_threshold(loaded, task_obj, CONTROLLER_OF[kind], paths[kind], config, n=n_val,
                                      thresholds=thresholds, max_drop=max_drop, batch_size=decode_batch_size,
                                      reference=reference, verify_threshold=verify)
            reference = cal["reference"]
            calibration[kind] = cal
            chosen = cal["threshold"]
        save_policy(nets[kind], paths[kind], kind=kind, threshold=chosen,
                    meta={**meta, "calibration": calibration.get(kind), "training": training[kind]})
    return calibration


def _test_figures(loaded: Any, task_obj: Any, config: DecodeConfig, policies: Sequence[str], paths: dict,
                  verify: Optional[float], n_test: int, decode_batch_size: int) -> dict[str, Any]:
    """Sequential decoding and every saved policy (inside ``verified`` when ``verify``) on ``n_test``
    test prompts: their evaluation rows by label (none when ``n_test`` is 0)."""
    from framework.engine.evaluate import evaluate

    test: dict[str, Any] = {}
    if n_test:
        runs = [("sequential", build_controller("sequential"))] + [
            (CONTROLLER_OF[k] if verify is None else f"verified {CONTROLLER_OF[k]}",
             policy_controller(CONTROLLER_OF[k], paths[k], verify_threshold=verify)) for k in policies]
        for label_, ctrl in runs:
            test[label_] = evaluate(loaded, task_obj, ctrl, config, split="test", n=n_test,
                                    batch_size=decode_batch_size).row()
    return test


def _dagger(loaded: Any, task: Any, config: DecodeConfig, policies: Sequence[str], paths: dict, nets: dict,
            train: RolloutDataset, val: RolloutDataset, out: Path, opts: dict, training: dict, *, rounds: int,
            n_train: int, states_per_rollout: int, decode_batch_size: int, threshold: float,
            say: Any) -> list:
    """The DAgger rounds, per policy kind: visit, label from the visited states, aggregate, retrain."""
    from tqdm.auto import tqdm

    log = []
    data = {kind: train for kind in policies}
    for r in range(1, rounds + 1):
        for kind in policies:
            t1 = time.perf_counter()
            ctrl = build_controller(CONTROLLER_OF[kind], policy=str(paths[kind]), threshold=threshold)
            with tqdm(total=n_train, desc=f"DAgger round {r} ({kind}): visit and label", unit="prompt",
                      disable=not opts["progress"]) as bar:
                new = _visit_and_label(loaded, task, ctrl, config, opts, n_train=n_train, round_=r,
                                       states_per_rollout=states_per_rollout, batch_size=decode_batch_size,
                                       progress=bar)
            data[kind] = RolloutDataset.concat([data[kind], new])
            nets[kind], info = _fit(kind, data[kind], val, out, opts,
                                    init=None if kind == "logreg" else nets[kind])
            save_policy(nets[kind], paths[kind], kind=kind, threshold=threshold, meta=opts["meta"])
            entry = {"round": r, "policy": kind, "rows": len(new), "safe_rate": new.positive_rate,
                     "total_rows": len(data[kind]), "seconds": round(time.perf_counter() - t1, 1)}
            say(f"DAgger round {r} ({kind}): {len(new)} on-policy rows ({new.positive_rate:.1%} safe), "
                f"{len(data[kind])} in all")
            training[kind].setdefault("dagger", []).append({**entry, **{k: v for k, v in info.items()
                                                                        if k != "history"}})
            log.append(entry)
    return log


def _visit_and_label(loaded: Any, task: Any, ctrl: Any, config: DecodeConfig, opts: dict, *, n_train: int,
                     round_: int, states_per_rollout: int, batch_size: int, progress: Any) -> RolloutDataset:
    """One DAgger round's rows: the states ``ctrl`` visits on the train split, labelled by the reference
    continued from them (``states_per_rollout`` per prompt) or, with set labels, every one of them."""
    if opts.get("labels") == "set":
        from framework.learning.set_labels import build_set_dataset

        return build_set_dataset(loaded, task, "train", n_train, ctrl, config=config, batch_size=batch_size,
                                 progress=progress).select(opts["features"])
    from framework.learning.dagger import build_on_policy_dataset

    return build_on_policy_dataset(loaded, task, "train", n_train, ctrl, config=config, batch_size=batch_size,
                                   states_per_rollout=states_per_rollout, data_seed=0,
                                   seed=opts["seed"] + round_, progress=progress).select(opts["features"])


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
