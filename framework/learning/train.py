"""Learned commit policies: a dataset from rollouts of reference decoding, two models, one file.

**Dataset.** Decode a split with one-token-per-step decoding (``sequential``; or record the states
of another ``rollout`` controller). At every step, every eligible position gives one row: its
feature vector φ (:data:`FEATURE_NAMES`, computed by :func:`feature_matrix` from the step's
:class:`~framework.engine.features.StepFeatures`) and the oracle label

    y = 1  ⇔  the position's current prediction x0 already equals the token that
              one-token-per-step decoding ends with at that position,

the label used to learn parallel decoding policies: committing every position with y = 1 now
loses nothing against the reference.

**Models.** p(safe | φ) = σ(g((φ − μ)/s)) with μ, s the training mean and scale of φ:

* ``logreg``: g linear, fitted by scikit-learn's ``LogisticRegression`` (the baseline);
* ``mlp``: g a small ReLU MLP, trained as the Lightning module :class:`PolicyModule` (binary
  cross-entropy, AdamW) with CSV and W&B (offline by default) logging, ``ModelCheckpoint`` and
  ``EarlyStopping`` on the validation loss.

**Policy file** (``.pt``, read with ``torch.load(weights_only=True)``, so loading runs no code)::

    {"format": "adaptive-decoding.policy", "version": 1, "kind": "mlp" | "logreg",
     "feature_names": [...], "hidden": [32, 32], "state_dict": {...},
     "threshold": 0.9, "meta": {task, model, metrics, calibration, ...}}

``threshold`` is the operating point: with calibration, the lowest-NFE threshold of a grid whose
validation accuracy is within ``max_drop`` of sequential decoding (the tuning module's rule).
The controllers ``learned`` (MLP) and ``logreg`` (:mod:`controllers.learned`) load it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn

from framework.engine.config import DecodeConfig
from framework.engine.controller_io import build_controller
from framework.learning.features import FEATURE_NAMES
from framework.learning.policy import DEFAULT_OUT, PolicyNet, load_policy, save_policy
from framework.learning.rollouts import RolloutDataset, build_dataset

DEFAULT_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995)


# ---------------------------------------------------------------------- training
def train_logreg(train: RolloutDataset, *, C: float = 1.0, seed: int = 0) -> PolicyNet:
    """scikit-learn ``StandardScaler`` + ``LogisticRegression``, copied into a linear PolicyNet."""
    from sklearn.linear_model import LogisticRegression

    net = PolicyNet(len(FEATURE_NAMES), ())
    net.set_normalisation(train.X)
    Z = ((train.X - net.mean) / net.scale).numpy()
    y = train.y.numpy().astype(int)
    if len(y) == 0:
        raise ValueError("the training rollouts are empty; use more examples")
    if len(set(y.tolist())) < 2:
        # every position was (un)safe: the fitted policy is the constant p(safe) = y[0], as
        # LogisticRegression cannot fit one class; warn, since the dataset teaches nothing else
        warnings.warn(f"the training rollouts have a single label ({int(y[0])}): the logistic policy is "
                      f"the constant p(safe) = {int(y[0])}; use more examples or another rollout controller")
        with torch.no_grad():
            lin = net.net[0]
            lin.weight.zero_()
            lin.bias.fill_(12.0 if int(y[0]) == 1 else -12.0)
        return net
    clf = LogisticRegression(C=C, max_iter=2000, random_state=seed).fit(Z, y)
    with torch.no_grad():
        lin = net.net[0]
        lin.weight.copy_(torch.as_tensor(clf.coef_, dtype=torch.float32))
        lin.bias.copy_(torch.as_tensor(clf.intercept_, dtype=torch.float32))
    return net


def _lightning():
    import pytorch_lightning as pl

    return pl


def make_policy_module(n_features: int = len(FEATURE_NAMES), hidden: Sequence[int] = (32, 32),
                       lr: float = 3e-3, weight_decay: float = 1e-4) -> Any:
    """A :class:`PolicyModule` (built lazily so that importing this file does not load Lightning)."""
    return _policy_module_class()(n_features=n_features, hidden=tuple(hidden), lr=lr, weight_decay=weight_decay)


@lru_cache(maxsize=1)
def _policy_module_class() -> type:
    pl = _lightning()

    class PolicyModule(pl.LightningModule):
        """The MLP policy as a LightningModule: L = BCE(g(φ), y), AdamW; logs ``train_loss``,
        ``val_loss`` and ``val_auc`` (scikit-learn's ROC-AUC over the whole validation set)."""

        def __init__(self, n_features: int, hidden: tuple = (32, 32), lr: float = 3e-3,
                     weight_decay: float = 1e-4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = PolicyNet(n_features, hidden)
            self._val: list[tuple[torch.Tensor, torch.Tensor]] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.binary_cross_entropy_with_logits(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(y))
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            logits = self.net(x)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
            self.log("val_loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(y))
            self._val.append((torch.sigmoid(logits).detach().cpu(), y.detach().cpu()))

        def on_validation_epoch_end(self) -> None:
            if not self._val:
                return
            p, y = (torch.cat(t) for t in zip(*self._val))
            self._val.clear()
            if 0 < float(y.sum()) < len(y):
                from sklearn.metrics import roc_auc_score

                self.log("val_auc", float(roc_auc_score(y.numpy(), p.numpy())))

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr,
                                     weight_decay=self.hparams.weight_decay)

    PolicyModule.__module__ = __name__
    PolicyModule.__qualname__ = "PolicyModule"
    return PolicyModule


def __getattr__(name: str) -> Any:
    """``framework.learning.PolicyModule`` resolves lazily (importing Lightning only then)."""
    if name == "PolicyModule":
        return _policy_module_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_datamodule(train: RolloutDataset, val: RolloutDataset, batch_size: int = 256, seed: int = 0) -> Any:
    """A LightningDataModule over the two rollout datasets (shuffled training batches, seeded)."""
    pl = _lightning()
    from torch.utils.data import DataLoader, TensorDataset

    class PolicyData(pl.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(train.X, train.y), batch_size=batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))

        def val_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(val.X, val.y), batch_size=4096, shuffle=False)

    return PolicyData()


@contextlib.contextmanager
def _quiet_lightning(quiet: bool) -> Any:
    """Hide Lightning's INFO lines (accelerator, tips) while training quietly."""
    import logging

    loggers = [logging.getLogger(n) for n in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")]
    levels = [lg.level for lg in loggers]
    if quiet:
        for lg in loggers:
            lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def train_mlp(train: RolloutDataset, val: RolloutDataset, *, out_dir: "str | os.PathLike",
              hidden: Sequence[int] = (32, 32), lr: float = 3e-3, weight_decay: float = 1e-4,
              max_epochs: int = 40, patience: int = 5, batch_size: int = 256, seed: int = 0,
              wandb_mode: str = "offline", accelerator: str = "cpu", devices: Any = 1,
              progress: bool = False, run_config: Optional[dict] = None, fast_dev_run: bool = False,
              ) -> tuple[PolicyNet, dict[str, Any]]:
    """Train the MLP policy with Lightning; returns the best-validation-loss network and run info."""
    pl = _lightning()
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    if wandb_mode not in ("offline", "online", "disabled"):
        raise ValueError(f"wandb_mode={wandb_mode!r}; allowed: offline, online, disabled")
    out = Path(out_dir)
    pl.seed_everything(seed, workers=True, verbose=False)
    module = make_policy_module(len(FEATURE_NAMES), hidden, lr, weight_decay)
    module.net.set_normalisation(train.X)
    loggers: list[Any] = [CSVLogger(str(out / "lightning"), name="csv")]
    wandb_logger = None
    if wandb_mode != "disabled":
        from pytorch_lightning.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        wandb_logger = WandbLogger(project="adaptive-decoding", name=f"policy-{out.name}",
                                   save_dir=str(out / "lightning"), mode=wandb_mode, config=run_config or {})
        loggers.append(wandb_logger)
    ckpt = ModelCheckpoint(dirpath=str(out / "lightning" / "checkpoints"), monitor="val_loss", mode="min",
                           save_top_k=1, filename="policy-{epoch:02d}-{val_loss:.4f}")
    stop = EarlyStopping(monitor="val_loss", mode="min", patience=patience)
    with warnings.catch_warnings(), _quiet_lightning(not progress):
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        trainer = pl.Trainer(
            accelerator=accelerator, devices=devices, max_epochs=max_epochs, logger=loggers,
            callbacks=[ckpt, stop], enable_progress_bar=progress, enable_model_summary=progress,
            num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(out / "lightning"),
            deterministic=True, fast_dev_run=fast_dev_run,
        )
        trainer.fit(module, datamodule=make_datamodule(train, val, batch_size, seed))
    best = ckpt.best_model_path
    if best:
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state)
    info = {"best_checkpoint": best or None, "epochs": int(trainer.current_epoch),
            "stopped_early": bool(stop.stopped_epoch), "csv_log": str(loggers[0].log_dir),
            "best_val_loss": float(ckpt.best_model_score) if ckpt.best_model_score is not None else None,
            "wandb": wandb_mode}
    if wandb_logger is not None:
        info["wandb_dir"] = str(out / "lightning")
        wandb_logger.experiment.finish()
    return module.net.cpu().eval(), info


def policy_metrics(net: PolicyNet, data: RolloutDataset, threshold: float) -> dict[str, float]:
    """scikit-learn ROC-AUC and average precision; precision / recall / commit rate at ``threshold``."""
    from sklearn.metrics import (
        average_precision_score,
        precision_score,
        recall_score,
        roc_auc_score,
    )

    with torch.no_grad():
        p = torch.sigmoid(copy.deepcopy(net).double()(data.X.double())).float().numpy()
    y = data.y.numpy().astype(int)
    pred = (p > threshold).astype(int)
    both = 0 < y.sum() < len(y)
    return {
        "n": int(len(y)), "positive_rate": float(y.mean()) if len(y) else float("nan"),
        "roc_auc": float(roc_auc_score(y, p)) if both else float("nan"),
        "average_precision": float(average_precision_score(y, p)) if both else float("nan"),
        "threshold": float(threshold),
        "precision": float(precision_score(y, pred, zero_division=0)),
        "recall": float(recall_score(y, pred, zero_division=0)),
        "commit_rate": float(pred.mean()) if len(y) else float("nan"),
    }


# ---------------------------------------------------------------------- calibration and the run
def calibrate_threshold(loaded: Any, task: Any, controller: str, policy: "str | os.PathLike",
                        config: DecodeConfig, *, n: int = 64, thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                        max_drop: float = 0.01, batch_size: int = 64, data_seed: int = 0,
                        reference: Optional[dict] = None) -> dict[str, Any]:
    """Decode ``n`` validation examples at each threshold; pick the tuning rule's point."""
    from framework.tuning.front import choose_index
    from framework.tuning.objective import REFERENCE, _figures, score_examples

    examples = task.examples("validation", n, seed=data_seed)
    if reference is None:
        c, m = score_examples(loaded, task, build_controller(REFERENCE), config, examples, batch_size)
        reference = _figures(c, m, config.gen_length)
    sweep = []
    for thr in thresholds:
        ctrl = build_controller(controller, policy=str(policy), threshold=float(thr))
        c, m = score_examples(loaded, task, ctrl, config, examples, batch_size)
        sweep.append({"threshold": float(thr), **_figures(c, m, config.gen_length)})
    i, met = choose_index([(s["accuracy"], s["nfe"]) for s in sweep], reference["accuracy"], max_drop)
    return {"threshold": sweep[i]["threshold"], "met_target": met, "sweep": sweep, "reference": reference,
            "rule": f"fewest mean NFE with validation accuracy >= {REFERENCE} - {max_drop:g}"}


@dataclass
class PolicyResult:
    """Outcome of :func:`train_policy`: the two policy files and every figure measured."""

    mlp_path: Path
    logreg_path: Path
    out_dir: Path
    dataset: dict
    metrics: dict
    calibration: dict
    test: dict
    training: dict

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("mlp_path", "logreg_path", "out_dir"):
            d[k] = str(d[k])
        return d


def train_policy(
    task: str,
    *,
    model: Optional[str] = None,
    loaded: Any = None,
    task_params: Optional[dict] = None,
    out_dir: "str | os.PathLike | None" = None,
    n_train: int = 256,
    n_val: int = 64,
    n_test: int = 200,
    hidden: Sequence[int] = (32, 32),
    max_epochs: int = 40,
    patience: int = 5,
    batch_size: int = 256,
    lr: float = 3e-3,
    C: float = 1.0,
    seed: int = 0,
    wandb_mode: str = "offline",
    calibrate: bool = True,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    max_drop: float = 0.01,
    rollout: Optional[str] = None,
    decode_options: Optional[dict] = None,
    decode_batch_size: int = 64,
    device: str = "cpu",
    accelerator: str = "cpu",
    verbose: bool = True,
    fast_dev_run: bool = False,
) -> PolicyResult:
    """Build the rollout datasets, train ``logreg`` and ``mlp``, calibrate, measure, save.

    Training rows come from the train split, early stopping and calibration from the validation
    split, the reported decoding figures from the test split. Returns the policy paths
    (``--controller learned --set policy=PATH`` / ``--controller logreg --set policy=PATH``).
    """
    from framework.engine.evaluate import evaluate
    from framework.tasks.base import get_task

    t0 = __import__("time").perf_counter()
    task_obj = get_task(task, **(task_params or {}))
    if loaded is None:
        from framework.training.zoo import load_model

        model = model or f"tiny-{task_obj.name}"
        loaded = load_model(model, device=device)
    label = str(model or loaded.name)
    out = Path(out_dir) if out_dir is not None else DEFAULT_OUT / f"{task_obj.name}-{Path(label).name}"
    out.mkdir(parents=True, exist_ok=True)
    config = DecodeConfig.build(**{"gen_length": task_obj.gen_length,
                                   "block_length": task_obj.default_block_length, **(decode_options or {})})
    roll = build_controller(rollout) if rollout else None
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if verbose else (lambda *a: None)  # noqa: E731
    train = build_dataset(loaded, task_obj, "train", n_train, config=config, batch_size=decode_batch_size, rollout=roll)
    val = build_dataset(loaded, task_obj, "validation", n_val, config=config, batch_size=decode_batch_size, rollout=roll)
    dataset = {"train_rows": len(train), "val_rows": len(val), "train_positive_rate": train.positive_rate,
               "val_positive_rate": val.positive_rate, "n_train": n_train, "n_val": n_val,
               "rollout": rollout or "sequential", "features": list(FEATURE_NAMES)}
    say(f"rollouts: {len(train)} training rows ({train.positive_rate:.1%} safe), "
        f"{len(val)} validation rows ({val.positive_rate:.1%} safe)")
    meta = {"task": task_obj.name, "task_params": task_obj.get_params(), "model": label,
            "decode": config.get_params(), "dataset": dataset, "seed": seed}
    logreg = train_logreg(train, C=C, seed=seed)
    mlp, info = train_mlp(train, val, out_dir=out, hidden=hidden, lr=lr, max_epochs=max_epochs,
                          patience=patience, batch_size=batch_size, seed=seed, wandb_mode=wandb_mode,
                          accelerator=accelerator, progress=verbose and sys.stderr.isatty(),
                          run_config={**meta, "hidden": list(hidden), "lr": lr}, fast_dev_run=fast_dev_run)
    paths = {"logreg": out / "logreg.pt", "mlp": out / "mlp.pt"}
    nets = {"logreg": logreg, "mlp": mlp}
    for kind, net in nets.items():
        save_policy(net, paths[kind], kind=kind, threshold=0.9, meta=meta)
    calibration: dict[str, Any] = {}
    names = {"mlp": "learned", "logreg": "logreg"}
    reference = None
    for kind in ("logreg", "mlp"):
        if calibrate:
            cal = calibrate_threshold(loaded, task_obj, names[kind], paths[kind], config, n=n_val,
                                      thresholds=thresholds, max_drop=max_drop, batch_size=decode_batch_size,
                                      reference=reference)
            reference = cal["reference"]
            calibration[kind] = cal
            threshold = cal["threshold"]
        else:
            threshold = 0.9
        save_policy(nets[kind], paths[kind], kind=kind, threshold=threshold,
                    meta={**meta, "calibration": calibration.get(kind)})
    metrics = {kind: policy_metrics(nets[kind], val, load_policy(paths[kind]).threshold) for kind in nets}
    test: dict[str, Any] = {}
    if n_test:
        for label_, name, params in (("sequential", "sequential", {}),
                                     ("logreg", "logreg", {"policy": str(paths["logreg"])}),
                                     ("learned", "learned", {"policy": str(paths["mlp"])})):
            test[label_] = evaluate(loaded, task_obj, build_controller(name, **params), config, split="test",
                                    n=n_test, batch_size=decode_batch_size).row()
    training = {**info, "seconds": round(__import__("time").perf_counter() - t0, 1)}
    result = PolicyResult(mlp_path=paths["mlp"], logreg_path=paths["logreg"], out_dir=out, dataset=dataset,
                          metrics=metrics, calibration=calibration, test=test, training=training)
    (out / "summary.json").write_text(json.dumps(result.summary(), indent=2, default=str))
    if verbose:
        print(report(result))
    return result


def report(result: PolicyResult) -> str:
    """Classification metrics (validation rows) and decoding figures (test split) as text."""
    lines = [f"{'policy':<8} {'ROC-AUC':>8} {'avg prec':>8} {'thresh':>7} {'prec':>6} {'recall':>6} {'commit':>7}"]
    for kind, m in result.metrics.items():
        lines.append(f"{kind:<8} {m['roc_auc']:>8.4f} {m['average_precision']:>8.4f} {m['threshold']:>7.3f} "
                     f"{m['precision']:>6.3f} {m['recall']:>6.3f} {m['commit_rate']:>7.3f}")
    if result.test:
        lines += ["", f"{'test split':<12} {'acc':>6} {'NFE':>7} {'tok/fwd':>8}"]
        for label, row in result.test.items():
            lines.append(f"{label:<12} {row['accuracy']:>6.3f} {row['nfe']:>7.2f} {row['tpf']:>8.2f}")
    lines += ["", f"policies: {result.mlp_path} (--controller learned --set policy=...), "
                  f"{result.logreg_path} (--controller logreg ...)",
              f"logs: {result.training.get('csv_log')}  best checkpoint: {result.training.get('best_checkpoint')}"]
    return "\n".join(lines)
