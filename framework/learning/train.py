"""Learned commit policies: a dataset from rollouts of reference decoding, two models, one file.

**Dataset.** Decode a split with one-token-per-step decoding (``sequential``; or record the states
of another ``rollout`` controller). At every step, every eligible position gives one row: its
feature vector φ (:data:`FEATURE_NAMES`, computed by :func:`feature_matrix` from the step's
:class:`~adaptive_decoding.framework.engine.features.StepFeatures`) and the oracle label

    y = 1  ⇔  the position's current prediction x0 already equals the token that
              one-token-per-step decoding ends with at that position,

the label used to learn parallel decoding policies: committing every position with y = 1 now
loses nothing against the reference.

**Models** (:mod:`adaptive_decoding.framework.learning.nets`). p(safe | ·) = σ(g(·)) on standardised φ:

* ``logreg``: g linear in one position's φ, fitted by scikit-learn's ``LogisticRegression``;
* ``mlp``: g a small ReLU MLP of one position's φ;
* ``transformer``: g a one- or two-layer transformer over the step's window of eligible
  positions, so p(safe) at one position depends on the others;

``mlp`` and ``transformer`` train as the Lightning module :class:`PolicyModule` (binary
cross-entropy over the eligible slots, AdamW) with CSV and W&B (offline by default) logging,
``ModelCheckpoint`` and ``EarlyStopping`` on the validation loss. On-policy rounds (DAgger) are
:mod:`adaptive_decoding.framework.learning.dagger`, the RL fine-tune :mod:`adaptive_decoding.framework.learning.rl`, the whole
pipeline :mod:`adaptive_decoding.framework.learning.pipeline`.

**Policy file** (``.pt``, read with ``torch.load(weights_only=True)``, so loading runs no code)::

    {"format": "adaptive-decoding.policy", "version": 1, "kind": "mlp" | "logreg" | "transformer",
     "feature_names": [...], "arch": {"hidden": [32, 32]}, "state_dict": {...},
     "threshold": 0.9, "meta": {task, model, metrics, calibration, ...}}

``threshold`` is the operating point: with calibration, the lowest-NFE threshold of a grid whose
validation accuracy is within ``max_drop`` of sequential decoding (the tuning module's rule).
The controllers ``learned`` (MLP), ``learned_window`` (transformer) and ``logreg``
(:mod:`adaptive_decoding.controllers.learned`) load it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.learning.features import FEATURE_NAMES
from adaptive_decoding.framework.learning.nets import PolicyNet, build_net
from adaptive_decoding.framework.learning.options import NetTraining, RunLogging, ThresholdCalibration
from adaptive_decoding.framework.learning.rollouts import RolloutDataset
from adaptive_decoding.framework.learning.windows import Windows, as_windows


# ---------------------------------------------------------------------- training
def train_logreg(train: RolloutDataset, *, C: float = 1.0, seed: int = 0) -> PolicyNet:
    """scikit-learn ``StandardScaler`` + ``LogisticRegression``, copied into a linear PolicyNet."""
    from sklearn.linear_model import LogisticRegression

    net = PolicyNet(train.X.shape[1], ())
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


def make_policy_module(kind: str = "mlp", arch: Optional[dict] = None, lr: float = 3e-3,
                       weight_decay: float = 1e-4, neg_weight: float = 1.0,
                       n_features: int = len(FEATURE_NAMES)) -> Any:
    """A :class:`PolicyModule` over ``n_features`` columns (built lazily so that importing this file
    does not load Lightning)."""
    return _policy_module_class()(kind=kind, arch=dict(arch or {}), lr=lr, weight_decay=weight_decay,
                                  neg_weight=neg_weight, n_features=n_features)


def masked_bce(logits: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
               neg_weight: float = 1.0) -> torch.Tensor:
    """Binary cross-entropy over the valid (eligible) slots of the windows, unsafe rows (y = 0)
    weighted ``neg_weight``: a wrong commit can cost the whole answer, a held position one forward."""
    y = y.to(logits.dtype)
    loss = nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
    w = valid * torch.where(y > 0.5, 1.0, float(neg_weight))
    return (loss * w).sum() / w.sum().clamp(min=1e-12)


@lru_cache(maxsize=1)
def _policy_module_class() -> type:
    pl = _lightning()

    class PolicyModule(pl.LightningModule):
        """A policy network as a LightningModule: L = BCE(g(window), y) over the eligible slots,
        AdamW; logs ``train_loss``, ``val_loss`` and ``val_auc`` (scikit-learn's ROC-AUC)."""

        def __init__(self, kind: str = "mlp", arch: Optional[dict] = None, lr: float = 3e-3,
                     weight_decay: float = 1e-4, neg_weight: float = 1.0,
                     n_features: int = len(FEATURE_NAMES)) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = build_net(kind, arch, n_features=n_features)
            self._val: list[tuple[torch.Tensor, torch.Tensor]] = []

        def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            return self.net(x, valid)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, valid, y = batch
            loss = masked_bce(self.net(x, valid), y, valid, self.hparams.neg_weight)
            self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=int(valid.sum()))
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, valid, y = batch
            logits = self.net(x, valid)
            loss = masked_bce(logits, y, valid, self.hparams.neg_weight)
            self.log("val_loss", loss, on_step=False, on_epoch=True, prog_bar=True,
                     batch_size=int(valid.sum()))
            self._val.append((torch.sigmoid(logits[valid]).detach().cpu(), y[valid].detach().cpu()))

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
    """``adaptive_decoding.framework.learning.PolicyModule`` resolves lazily (importing Lightning only then)."""
    if name == "PolicyModule":
        return _policy_module_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_datamodule(train: Windows, val: Windows, batch_size: int = 256, seed: int = 0) -> Any:
    """A LightningDataModule over two sets of windows (shuffled training batches, seeded)."""
    pl = _lightning()
    from torch.utils.data import DataLoader, TensorDataset

    class PolicyData(pl.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(*train.tensors()), batch_size=batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))

        def val_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(*val.tensors()), batch_size=max(batch_size, 1024), shuffle=False)

    return PolicyData()


@contextlib.contextmanager
def quiet_lightning(quiet: bool) -> Any:
    """For a Lightning run of ours: hide the warnings that do not apply (few dataloader workers,
    short epochs, a checkpoint folder that DAgger rounds reuse) and, when ``quiet``, the INFO lines
    (accelerator, tips)."""
    import logging

    loggers = [logging.getLogger(n) for n in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")]
    levels = [lg.level for lg in loggers]
    if quiet:
        for lg in loggers:
            lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in (".*does not have many workers.*", ".*log_every_n_steps.*", ".*LeafSpec.*",
                            ".*exists and is not empty.*"):
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def train_net(kind: str, train: RolloutDataset, val: RolloutDataset, *, out_dir: "str | os.PathLike",
              arch: Optional[dict] = None, training: Optional[NetTraining] = None,
              logging: Optional[RunLogging] = None,
              init: Optional[nn.Module] = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train an ``mlp`` or ``transformer`` policy with Lightning by ``training``'s optimisation
    (:class:`~adaptive_decoding.framework.learning.options.NetTraining`, default every default), logging by ``logging``
    (:class:`~adaptive_decoding.framework.learning.options.RunLogging`), from ``init``'s weights if given (e.g. the
    previous DAgger round's); returns the best-validation-loss network and run info."""
    pl = _lightning()
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    t = training if training is not None else NetTraining()
    log = logging if logging is not None else RunLogging()
    t.validate()
    log.validate()
    out = Path(out_dir)
    pl.seed_everything(t.seed, workers=True, verbose=False)
    module = make_policy_module(kind, arch, t.lr, t.weight_decay, t.neg_weight, n_features=train.X.shape[1])
    if init is not None:
        module.net.load_state_dict(init.state_dict())
    else:
        module.net.set_normalisation(train.X)
    loggers, wandb_logger = _net_loggers(out, kind, log)
    ckpt = ModelCheckpoint(dirpath=str(out / "lightning" / "checkpoints"), monitor="val_loss", mode="min",
                           save_top_k=1, filename=kind + "-{epoch:02d}-{val_loss:.4f}")
    stop = EarlyStopping(monitor="val_loss", mode="min", patience=t.patience)
    with quiet_lightning(not log.progress):
        trainer = pl.Trainer(
            accelerator=t.accelerator, devices=t.devices, max_epochs=t.max_epochs, logger=loggers,
            callbacks=[ckpt, stop], enable_progress_bar=log.progress, enable_model_summary=log.progress,
            num_sanity_val_steps=0, log_every_n_steps=1, default_root_dir=str(out / "lightning"),
            deterministic=True, fast_dev_run=t.fast_dev_run,
        )
        trainer.fit(module, datamodule=make_datamodule(as_windows(kind, train), as_windows(kind, val),
                                                       t.batch_size, t.seed))
    best = ckpt.best_model_path
    if best:
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state)
    info = {"best_checkpoint": best or None, "epochs": int(trainer.current_epoch),
            "stopped_early": bool(stop.stopped_epoch), "csv_log": str(loggers[0].log_dir),
            "best_val_loss": float(ckpt.best_model_score) if ckpt.best_model_score is not None else None,
            "wandb": log.wandb_mode}
    if wandb_logger is not None:
        info["wandb_dir"] = str(out / "lightning")
        wandb_logger.experiment.finish()
    return module.net.cpu().eval(), info


def _net_loggers(out: Path, kind: str, log: RunLogging) -> tuple[list[Any], Any]:
    """A CSV logger under ``out/lightning``, and a W&B one (also returned alone) unless disabled."""
    from pytorch_lightning.loggers import CSVLogger

    loggers: list[Any] = [CSVLogger(str(out / "lightning"), name="csv")]
    wandb_logger = None
    if log.wandb_mode != "disabled":
        from pytorch_lightning.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        wandb_logger = WandbLogger(project="adaptive-decoding", name=f"policy-{kind}-{out.name}",
                                   save_dir=str(out / "lightning"), mode=log.wandb_mode,
                                   config=log.run_config or {})
        loggers.append(wandb_logger)
    return loggers, wandb_logger


def policy_metrics(net: nn.Module, data: RolloutDataset, threshold: float, kind: str = "mlp") -> dict[str,
                                                                                                      float]:
    """scikit-learn ROC-AUC and average precision; precision / recall / commit rate at ``threshold``."""
    from sklearn.metrics import (
        average_precision_score,
        precision_score,
        recall_score,
        roc_auc_score,
    )

    w = as_windows(kind, data)
    with torch.no_grad():
        p = torch.sigmoid(copy.deepcopy(net).double()(w.X.double(), w.valid))[w.valid].float().numpy()
    y = w.y[w.valid].numpy().astype(int)
    pred = (p > threshold).astype(int)
    both = 0 < y.sum() < len(y)
    return {
        "n": len(y), "positive_rate": float(y.mean()) if len(y) else float("nan"),
        "roc_auc": float(roc_auc_score(y, p)) if both else float("nan"),
        "average_precision": float(average_precision_score(y, p)) if both else float("nan"),
        "threshold": float(threshold),
        "precision": float(precision_score(y, pred, zero_division=0)),
        "recall": float(recall_score(y, pred, zero_division=0)),
        "commit_rate": float(pred.mean()) if len(y) else float("nan"),
    }


# ---------------------------------------------------------------------- calibration and the run
def policy_controller(controller: str, policy: "str | os.PathLike", threshold: Optional[float] = None,
                      verify_threshold: Optional[float] = None, **extra: Any) -> Any:
    """The learned controller over ``policy`` (``extra``: its other parameters, e.g. ``sample``);
    inside ``verified`` at τ₂ = ``verify_threshold`` if given."""
    params = {"policy": str(policy), **({} if threshold is None else {"threshold": float(threshold)}),
              **extra}
    if verify_threshold is None:
        return build_controller(controller, **params)
    return build_controller("verified", inner=controller, inner_params=params,
                            verify_threshold=verify_threshold)


def calibrate_threshold(loaded: Any, task: Any, controller: str, policy: "str | os.PathLike",
                        config: DecodeConfig, options: Optional[ThresholdCalibration] = None, *,
                        reference: Optional[dict] = None,
                        verify_threshold: Optional[float] = None) -> dict[str, Any]:
    """Decode ``options``' examples (:class:`~adaptive_decoding.framework.learning.options.ThresholdCalibration`, default
    64 of the validation split) at each threshold τ of its grid; pick the tuning rule's point: the
    fewest mean NFE with accuracy ≥ the sequential ``reference``'s − ``max_drop`` (the reference decoded
    here unless given). Inside ``verified`` when ``verify_threshold`` is given, as the policy will be
    decoded."""
    from adaptive_decoding.framework.tuning.front import choose_index
    from adaptive_decoding.framework.tuning.objective import REFERENCE, score_examples

    opts = options if options is not None else ThresholdCalibration()
    opts.validate()
    examples = task.examples(opts.split, opts.n, seed=opts.data_seed)
    if reference is None:
        reference = score_examples(loaded, task, build_controller(REFERENCE), config, examples,
                                   opts.batch_size).figures()
    sweep = []
    for thr in opts.thresholds:
        ctrl = policy_controller(controller, policy, thr, verify_threshold)
        sweep.append({"threshold": float(thr),
                      **score_examples(loaded, task, ctrl, config, examples, opts.batch_size).figures()})
    i, met = choose_index([(s["accuracy"], s["nfe"]) for s in sweep], reference["accuracy"], opts.max_drop)
    return {"threshold": sweep[i]["threshold"], "met_target": met, "sweep": sweep, "reference": reference,
            "rule": f"fewest mean NFE with {opts.split} accuracy >= {REFERENCE} - {opts.max_drop:g}"}
