"""Training the tiny denoisers with the masked-diffusion loss (Lightning).

Forward process (MDLM / LLaDA, SFT-style): for a clean sequence x_0 with prompt p and answer slot
r (answer + ``[EOS]`` padding, length G), draw ``t ~ U(0, 1)`` per example, set the masking
probability ``p_mask = (1 - ε) t + ε`` and replace each *answer* position by ``[MASK]``
independently with probability ``p_mask``; the prompt is never masked. The loss is the
cross-entropy of x_0 at the masked positions, weighted by ``1 / p_mask`` and normalised by the
answer length G (LLaDA's SFT objective, an upper bound on the negative log-likelihood)::

    L = E_t E_{x_t} [ 1/G  Σ_{i ∈ r, x_t^i = [MASK]}  −log p_θ(x_0^i | x_t) / p_mask ]

Optimiser: AdamW with linear warm-up and a cosine decay whose progress is
``max(step / max_steps, elapsed / max_seconds)``: the schedule always completes, whether the step
or the wall-time budget binds first (the run stops when either is spent).

Validation and test: exact match with one-token-per-step decoding (the ``sequential``
controller of :mod:`adaptive_decoding.controllers.baselines` through :func:`adaptive_decoding.framework.engine.loop.decode`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from adaptive_decoding.framework.core.options import RunLogging

#: architecture presets (``--size``); a dict of :class:`TinyConfig` fields is accepted too
from adaptive_decoding.framework.models.tiny import MODEL_SIZES, TinyConfig, TinyDenoiser
from adaptive_decoding.framework.tasks.base import Example, Recipe, Task, get_task, recipe_for  # noqa: F401 - Recipe, recipe_for re-exported
from adaptive_decoding.framework.training.data import TaskDataModule
from adaptive_decoding.framework.training.options import DenoiserOptions


def __getattr__(name: str) -> Any:
    if name == "RECIPES":  # the per-task defaults, now declared on each task class
        from adaptive_decoding.framework.tasks.base import TASKS

        return {n: TASKS.get(n).recipe for n in TASKS.names() if TASKS.get(n).recipe is not None}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------- the loss
def forward_process(
    input_ids: torch.Tensor, answer_mask: torch.Tensor, mask_token_id: int, t: torch.Tensor,
    eps: float = 1e-3, generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask each answer position with probability ``p_mask = (1 - ε) t + ε``.

    Returns ``(x_t, masked, p_mask)``: the noised batch, the bool mask of replaced positions (a
    subset of ``answer_mask``) and ``p_mask`` ``[B]``.
    """
    p_mask = (1.0 - eps) * t + eps
    u = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    masked = (u < p_mask[:, None]) & answer_mask
    x_t = torch.where(masked, torch.full_like(input_ids, mask_token_id), input_ids)
    return x_t, masked, p_mask


def sample_t(batch: int, low_discrepancy: bool = True, generator: Optional[torch.Generator] = None,
             device: Any = "cpu") -> torch.Tensor:
    """Diffusion times ``t ∈ [0, 1)`` for a batch: stratified (``(u + b/B) mod 1``) or i.i.d."""
    if low_discrepancy:
        u = torch.rand(1, generator=generator, device=device)
        return (u + torch.arange(batch, device=device) / batch) % 1.0
    return torch.rand(batch, generator=generator, device=device)


def masked_diffusion_loss(
    logits: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor, p_mask: torch.Tensor,
    answer_mask: torch.Tensor,
) -> torch.Tensor:
    """``mean_b 1/G_b Σ_{masked i} CE(logits_bi, x0_bi) / p_mask_b`` (MDLM/LLaDA weighting)."""
    ce = F.cross_entropy(logits.transpose(1, 2).float(), x0, reduction="none")  # [B, L]
    per_example = (ce * masked).sum(1) / p_mask
    return (per_example / answer_mask.sum(1).clamp(min=1)).mean()


def exact_match(
    denoiser: Any, task: Task, examples: Sequence[Example], batch_size: int = 256,
    controller: str = "sequential",
) -> float:
    """Exact-match accuracy (``task.score``) of ``denoiser`` decoding one token per step."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.context import DecodeContext
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.loop import decode

    if not examples:
        return float("nan")
    ctrl = build_controller(controller)
    config = DecodeConfig(gen_length=task.gen_length)
    tok = task.tokenizer
    total = 0.0
    for i in range(0, len(examples), batch_size):
        chunk = list(examples[i : i + batch_size])
        result = decode(denoiser, [task.prompt_ids(e) for e in chunk], ctrl, config,
                        context=DecodeContext.for_batch(tok, chunk, task=task, gen_length=config.gen_length))
        for ex, gen in zip(chunk, result.generated):
            total += task.score(ex, tok.decode(gen.tolist(), stop_at_eos=True))
    return total / len(examples)


# ---------------------------------------------------------------------- LightningModule
class MaskedDiffusionLM(pl.LightningModule):
    """A :class:`TinyDenoiser` trained with the masked-diffusion loss on one task.

    Args:
        task: registered task name; ``task_params`` its parameters.
        model: :class:`TinyConfig` fields other than the vocabulary ids (``d_model``, ...).
        lr, weight_decay, warmup_steps: AdamW and its warm-up.
        max_steps, max_seconds: the budgets the cosine schedule runs over (whichever ends first).
        eps: the smallest masking probability ε.
        low_discrepancy: draw the batch's t stratified, ``t_b = (u + b / B) mod 1`` (MDLM's
            low-discrepancy sampler: same expectation, lower variance), else i.i.d. uniform.
    """

    def __init__(
        self,
        task: str = "addition",
        task_params: Optional[dict] = None,
        model: Optional[dict] = None,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_steps: int = 200,
        max_steps: int = 4000,
        max_seconds: Optional[float] = None,
        eps: float = 1e-3,
        low_discrepancy: bool = True,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.task = get_task(task, **(task_params or {}))
        tok = self.task.tokenizer
        self.tiny_config = TinyConfig(
            vocab_size=tok.vocab_size, mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, max_len=self.task.canvas_length,
            structure=self.task.attention_structure, **(model or {}),
        )
        self.denoiser = TinyDenoiser(self.tiny_config)
        self._t0: Optional[float] = None
        self._val_generator = torch.Generator().manual_seed(1234)

    # -------------------------------------------------------------- schedule
    def progress(self) -> float:
        """Fraction of the budget spent: ``max(step / max_steps, elapsed / max_seconds)``."""
        p = self.global_step / max(1, self.hparams.max_steps)
        if self.hparams.max_seconds and self._t0 is not None:
            p = max(p, (time.perf_counter() - self._t0) / self.hparams.max_seconds)
        return min(1.0, p)

    def lr_factor(self, step: int) -> float:
        warm = self.hparams.warmup_steps
        if warm and step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * self.progress()))

    def on_train_start(self) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.progress() >= 1.0:
            self.trainer.should_stop = True

    def configure_optimizers(self) -> Any:
        decay, no_decay = [], []
        for name, p in self.denoiser.named_parameters():
            (no_decay if p.dim() < 2 or "norm" in name else decay).append(p)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr, betas=(0.9, 0.98),
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -------------------------------------------------------------- steps
    def _loss(self, batch: dict, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        if self.denoiser.block_causal:
            return self._block_loss(batch, generator)
        x0, answer = batch["input_ids"], batch["answer_mask"]
        t = sample_t(x0.shape[0], self.hparams.low_discrepancy, generator, x0.device)
        x_t, masked, p_mask = forward_process(x0, answer, self.tiny_config.mask_token_id, t,
                                              self.hparams.eps, generator)
        attn = batch["attention_mask"]
        logits = self.denoiser(x_t, attention_mask=None if bool(attn.all()) else attn)
        return masked_diffusion_loss(logits, x0, masked, p_mask, answer)

    def _block_loss(self, batch: dict, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """The block-diffusion objective (:mod:`adaptive_decoding.framework.training.block_diffusion`)."""
        from adaptive_decoding.framework.training import block_diffusion as bd

        x0, answer, attn = batch["input_ids"], batch["answer_mask"], batch["attention_mask"]
        x_t, masked, p_mask = bd.block_forward_process(x0, answer, self.tiny_config.mask_token_id,
                                                       int(self.denoiser.block_size), self.hparams.eps, generator)
        logits = bd.noisy_copy_logits(self.denoiser, x_t, x0, None if bool(attn.all()) else attn)
        return bd.block_diffusion_loss(logits, x0, masked, p_mask, answer)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=1)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._val_generator.manual_seed(1234)  # the same noise at every validation

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        n = batch["input_ids"].shape[0]
        loss = self._loss(batch, generator=self._val_generator) if batch["input_ids"].device.type == "cpu" \
            else self._loss(batch)
        acc = exact_match(self.denoiser, self.task, batch["examples"], batch_size=n)
        self.log("val/loss", loss, prog_bar=False, batch_size=n)
        self.log("val/exact_match", acc, prog_bar=True, batch_size=n)


# ---------------------------------------------------------------------- the entry point
@dataclass
class TrainResult:
    """What :func:`train_denoiser` produced: the saved folder and the measured figures."""

    path: Path
    task: str
    test_accuracy: float
    n_test: int
    val_accuracy: Optional[float]
    steps: int
    train_seconds: float
    total_seconds: float
    model_config: dict = field(default_factory=dict)
    recipe: dict = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.task}: test exact match {self.test_accuracy:.1%} on {self.n_test} problems "
                f"(one token per step), {self.steps} steps in {self.train_seconds / 60:.1f} min; "
                f"saved to {self.path}")


def auto_threads() -> int:
    """Torch threads for training: the cores not already busy (by the 1-minute load average),
    at least 1. Oversubscribed OpenMP threads spin-wait: on a 2-core machine shared with another
    job, 2 threads measured 12x slower per step than 1."""
    cores = os.cpu_count() or 1
    try:
        busy = round(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover - not POSIX
        busy = 0
    return max(1, min(cores, cores - busy))


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Set torch's intra-op threads for a block, then restore them (the caller may decode next)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _resolve_size(model_size: Any) -> dict[str, Any]:
    if isinstance(model_size, dict):
        return dict(model_size)
    if model_size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {model_size!r}; allowed: {', '.join(MODEL_SIZES)} or a dict")
    return dict(MODEL_SIZES[model_size])


def train_denoiser(task: "str | Task", options: Optional[DenoiserOptions] = None, **flat: Any) -> TrainResult:
    """Train a tiny denoiser on ``task``, measure its test exact match, save it as a folder.

    Args:
        task: a registered task name or a :class:`Task` instance.
        options: :class:`~adaptive_decoding.framework.training.options.DenoiserOptions` (default every default):
            ``recipe``, the task's declared ``Task.recipe`` fields to override (``model_size``:
            ``tiny``, ``small``, ``base`` or a dict of :class:`TinyConfig` fields; the budgets
            ``max_minutes`` and ``max_steps``, whichever is spent first ends training; ``lr``,
            ``batch_size``, ``train_size``, ``val_size``, ``val_every``, ``n_test``,
            ``warmup_steps``, ``weight_decay``, ``eps``); ``run``: ``out_dir``, where the model
            folder goes (``config.json``, ``model.pt``, ``metrics.json``) and the Lightning logs and
            checkpoints (``lightning/``; default a new folder under ``default_cache_dir()/runs``),
            ``seed`` (weights, data and masking), ``init_from`` (a saved tiny denoiser, folder or
            built-in name, of the same architecture and vocabulary to start from instead of random
            weights; its position table is grown to this task's canvas by repeating its last row,
            :func:`adaptive_decoding.framework.training.warm_start.warm_start`), the Trainer's ``accelerator`` /
            ``devices`` and torch's ``num_threads`` (default :func:`auto_threads`: the idle cores);
            ``logging``: ``wandb_mode`` (``offline``, ``online`` or ``disabled``: no W&B logger at
            all), ``progress`` (the progress bar and the model summary), ``run_config`` (more W&B config).
        flat: any field of those groups by name (``max_steps=20, out_dir=..., wandb_mode="disabled"``),
            replacing ``options``' (:meth:`~adaptive_decoding.framework.core.options.OptionGroups.with_flat`); ``None``
            keeps the default.
    """
    from adaptive_decoding.framework.models.saved import default_cache_dir

    t_begin = time.perf_counter()
    opts = DenoiserOptions.with_flat(options, {k: v for k, v in flat.items() if v is not None})
    run, log = opts.run, opts.logging
    task_obj = task if isinstance(task, Task) else get_task(task)
    recipe = resolve_recipe(task_obj, opts.recipe.overrides())
    arch = _resolve_size(recipe["size"])
    with _torch_threads(run.num_threads or auto_threads()):
        pl.seed_everything(run.seed, workers=True, verbose=False)
        module = MaskedDiffusionLM(
            task=task_obj.name, task_params=task_obj.get_params(), model=arch, lr=recipe["lr"],
            weight_decay=recipe["weight_decay"], warmup_steps=recipe["warmup_steps"],
            max_steps=recipe["max_steps"],
            max_seconds=None if recipe["max_minutes"] is None else 60.0 * recipe["max_minutes"], eps=recipe["eps"],
        )
        init_note = _warm_start_from(module, run.init_from) if run.init_from is not None else None  # before any file
        out = Path(run.out_dir) if run.out_dir is not None else \
            default_cache_dir() / "runs" / f"{task_obj.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        out.mkdir(parents=True, exist_ok=True)
        data = TaskDataModule(task_obj, batch_size=recipe["batch_size"], train_size=recipe["train_size"],
                              val_size=recipe["val_size"], seed=run.seed)
        wandb_logger = _wandb_logger(out, log, task_obj, arch, recipe, run.seed)
        trainer = _trainer(out, recipe, run.accelerator, run.devices, log.progress, wandb_logger)
        _fit(trainer, module, data)
        train_seconds = time.perf_counter() - (module._t0 or t_begin)
        return _test_and_save(out, module, trainer, task_obj, recipe, run.seed, wandb_logger,
                              train_seconds=train_seconds, t_begin=t_begin, init_from=init_note)


def _warm_start_from(module: "MaskedDiffusionLM", init_from: "str | os.PathLike") -> str:
    """Load the trained tiny denoiser ``init_from`` names (a folder or built-in name) and copy its
    weights into ``module``'s (:func:`adaptive_decoding.framework.training.warm_start.warm_start`, which names every
    architecture field that differs); returns what the metrics record, ``NAME (+N positions)``."""
    from adaptive_decoding.framework.models.saved import CheckpointError
    from adaptive_decoding.framework.models.zoo import load_model
    from adaptive_decoding.framework.training.warm_start import warm_start

    source = load_model(str(init_from), train_if_missing=False)
    if not isinstance(source.denoiser, TinyDenoiser):
        raise CheckpointError(f"--init-from {init_from}: not a tiny denoiser of this framework "
                              f"({type(source.denoiser).__name__}); allowed: a folder written by train-denoiser "
                              f"or a built-in name")
    added = warm_start(module.denoiser, source.denoiser, str(init_from))
    return f"{init_from} (+{added} positions)"


def resolve_recipe(task: Task, overrides: dict[str, Any]) -> dict[str, Any]:
    """The task's declared recipe (``Task.recipe``) with the caller's overrides (``None`` keeps the
    recipe's value); an unknown option raises ``TypeError`` listing the allowed ones."""
    base = task.training_recipe()
    unknown = set(overrides) - set(base.to_dict())
    if unknown:
        raise TypeError(f"train_denoiser() got unknown options {sorted(unknown)}; "
                        f"allowed: {', '.join(sorted(base.to_dict()))}")
    fields = base.to_dict()
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return fields


def _wandb_logger(out: Path, log: RunLogging, task: Task, arch: dict, recipe: dict, seed: int) -> Any:
    """A W&B logger of the run (``None`` when ``log.wandb_mode`` is ``disabled``); ``log.run_config``
    is merged into its config."""
    if log.wandb_mode == "disabled":
        return None
    from pytorch_lightning.loggers import WandbLogger

    os.environ.setdefault("WANDB_SILENT", "true")
    return WandbLogger(
        project="adaptive-decoding", name=f"train-{task.name}", save_dir=str(out / "lightning"),
        mode=log.wandb_mode, config={"task": task.name, "task_params": task.get_params(),
                                     "model": arch, "recipe": recipe, "seed": seed, **(log.run_config or {})},
    )


def _trainer(out: Path, recipe: dict, accelerator: Any, devices: Any, progress: bool, wandb_logger: Any) -> pl.Trainer:
    """The Lightning trainer: CSV (and W&B) logs, the best and last checkpoints under ``out/lightning``,
    validation every ``val_every`` steps when there is a validation set."""
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger

    loggers: list[Any] = [CSVLogger(str(out / "lightning"), name="csv")]
    if wandb_logger is not None:
        loggers.append(wandb_logger)
    has_val = bool(recipe["val_size"])
    ckpt = ModelCheckpoint(
        dirpath=str(out / "lightning" / "checkpoints"), save_last=True,
        monitor="val/exact_match" if has_val else None, mode="max", save_top_k=1 if has_val else 0,
    )
    val_every = min(int(recipe["val_every"]), int(recipe["max_steps"]))
    if not progress:  # keep Lightning's start-up chatter (device summary, tips) out of quiet runs
        logging.getLogger("pytorch_lightning.utilities.rank_zero").setLevel(logging.WARNING)
        logging.getLogger("pytorch_lightning.accelerators.cuda").setLevel(logging.WARNING)
    return pl.Trainer(
        accelerator=accelerator, devices=devices, max_steps=int(recipe["max_steps"]),
        logger=loggers, callbacks=[ckpt], enable_progress_bar=progress, enable_model_summary=progress,
        val_check_interval=val_every if has_val else None, check_val_every_n_epoch=None,
        **({} if has_val else {"limit_val_batches": 0}), num_sanity_val_steps=0, log_every_n_steps=25,
        default_root_dir=str(out / "lightning"), deterministic=False, gradient_clip_val=1.0,
    )


def _fit(trainer: pl.Trainer, module: MaskedDiffusionLM, data: TaskDataModule) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*IterableDataset.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        trainer.fit(module, datamodule=data)


def _test_and_save(out: Path, module: MaskedDiffusionLM, trainer: pl.Trainer, task: Task, recipe: dict,
                   seed: int, wandb_logger: Any, *, train_seconds: float, t_begin: float,
                   init_from: Optional[str] = None) -> TrainResult:
    """Measure test exact match one token per step, save the folder, close the W&B run."""
    from adaptive_decoding.framework.models.saved import save_pretrained

    denoiser = module.denoiser.cpu().eval()
    val_acc = trainer.callback_metrics.get("val/exact_match")
    val_acc = float(val_acc) if val_acc is not None else None
    test = task.examples("test", int(recipe["n_test"]), seed=seed) if recipe["n_test"] else []
    test_acc = exact_match(denoiser, task, test) if test else float("nan")
    metrics = {
        "task": task.name, "test_exact_match": test_acc, "n_test": len(test),
        "decoder": "sequential (one token per step)", "val_exact_match": val_acc,
        "steps": int(trainer.global_step), "train_seconds": round(train_seconds, 1),
        "torch_threads": torch.get_num_threads(), "seed": seed,
        **({"init_from": init_from} if init_from else {}),
    }
    save_pretrained(out, denoiser, task=task, recipe={**recipe, "seed": seed}, metrics=metrics)
    if wandb_logger is not None:
        wandb_logger.experiment.summary["test/exact_match"] = test_acc
        wandb_logger.experiment.finish()
    return TrainResult(
        path=out, task=task.name, test_accuracy=test_acc, n_test=len(test), val_accuracy=val_acc,
        steps=int(trainer.global_step), train_seconds=train_seconds, total_seconds=time.perf_counter() - t_begin,
        model_config=denoiser.config.to_dict(), recipe=recipe,
    )
