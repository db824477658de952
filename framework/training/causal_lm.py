"""A small causal Transformer LM trained on the task data: the verifier of the ``ar_logprob`` scorer.

Adaptive parallel decoding with an autoregressive verifier (APD, Israel et al. 2025) checks the
tokens a diffusion model proposes in parallel with a small left-to-right model. Here the causal LM
is trained on the same task data as the denoisers (:class:`adaptive_decoding.framework.training.data.TaskDataModule`), on
``prompt + answer + [EOS]`` sequences, with next-token cross-entropy on the answer slot:

    L = − (1/|r|) Σ_{i ∈ r} log q_φ(x_i | x̃_{<i})

where x̃ is x with each answer token replaced by ``[MASK]`` with probability ``c·u``,
``u ~ U(0, 1)`` per example (``corrupt = c``). The corruption teaches the LM to read a canvas that
is still partly masked, so it can score a lookahead rollout whose later blocks are undecided.

A saved model is a folder like the denoisers' (``config.json`` with ``format =
adaptive-decoding.causal-lm``, ``model.pt``, ``metrics.json``), cached under
``default_cache_dir()/models/causal-<task>`` and trained on first use by :func:`load_causal_lm`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from adaptive_decoding.framework.core.options import RunLogging
from adaptive_decoding.framework.training.options import CAUSAL_RECIPE, CausalOptions

FORMAT = "adaptive-decoding.causal-lm"
FORMAT_VERSION = 1

#: the default recipe: small and quick (a verifier need not be strong to catch incoherent rollouts)
RECIPE: dict[str, Any] = CAUSAL_RECIPE
_ARCH = ("d_model", "n_layers", "n_heads", "d_ff")


@dataclass
class CausalConfig:
    """Size and vocabulary of :class:`CausalLM`."""

    vocab_size: int
    pad_token_id: int
    mask_token_id: int
    eos_token_id: Optional[int] = None
    max_len: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class CausalLM(nn.Module):
    """A decoder-only Transformer: ``logits[:, i]`` is q_φ(x_{i+1} | x_{≤i})."""

    def __init__(self, config: CausalConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id = config.mask_token_id
        self.pad_token_id = config.pad_token_id
        self.eos_token_id = config.eos_token_id
        self.vocab_size = config.vocab_size
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_len, config.d_model)
        layer = nn.TransformerEncoderLayer(config.d_model, config.n_heads, config.d_ff, config.dropout,
                                           batch_first=True, norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, seq_len = input_ids.shape
        if seq_len > self.config.max_len:
            raise ValueError(f"sequence of {seq_len} tokens is longer than the causal LM's "
                             f"max_len={self.config.max_len}")
        h = self.tok(input_ids) + self.pos(torch.arange(seq_len, device=input_ids.device))[None]
        causal = torch.triu(torch.full((seq_len, seq_len), float("-inf"), device=input_ids.device),
                            diagonal=1)
        h = self.blocks(h, mask=causal, is_causal=True)  # right padding never reaches earlier positions
        return self.head(self.norm(h))


def token_logprobs(model: CausalLM, ids: torch.Tensor) -> torch.Tensor:
    """``out[:, i] = log q(x_i | x_{<i})`` ``[B, L]`` (0 at i = 0)."""
    empty = ids.new_zeros((ids.shape[0], 0, model.vocab_size)).float()
    logits = model(ids[:, :-1]) if ids.shape[1] > 1 else empty
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(ids[:, :1], dtype=torch.float), lp], 1)


@torch.no_grad()
def generate_greedy(model: CausalLM, prompts: Sequence[Sequence[int]], gen_length: int) -> torch.Tensor:
    """Greedy left-to-right answers ``[B, G]`` (one forward per token; rows share a length)."""
    out = []
    for p in prompts:  # evaluation helper; prompts differ in length, the LM has no padding mask
        seq = torch.tensor([list(p)], dtype=torch.long, device=model.device)
        for _ in range(gen_length):
            nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
        out.append(seq[0, len(p):])
    return torch.stack(out)


# ---------------------------------------------------------------------- training
class CausalLMModule(pl.LightningModule):
    """:class:`CausalLM` trained on one task with next-token CE on the answer slot (see module doc)."""

    def __init__(self, task: str = "addition", task_params: Optional[dict] = None,
                 model: Optional[dict] = None, lr: float = 2e-3, weight_decay: float = 0.01,
                 warmup_steps: int = 100, max_steps: int = 1500, max_seconds: Optional[float] = None,
                 corrupt: float = 0.5) -> None:
        super().__init__()
        from adaptive_decoding.framework.tasks.base import get_task

        self.save_hyperparameters()
        self.task = get_task(task, **(task_params or {}))
        tok = self.task.tokenizer
        self.lm_config = CausalConfig(vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id,
                                      mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                                      max_len=self.task.canvas_length, **(model or {}))
        self.lm = CausalLM(self.lm_config)
        self._t0: Optional[float] = None

    def progress(self) -> float:
        p = self.global_step / max(1, self.hparams.max_steps)
        if self.hparams.max_seconds and self._t0 is not None:
            p = max(p, (time.perf_counter() - self._t0) / self.hparams.max_seconds)
        return min(1.0, p)

    def lr_factor(self, step: int) -> float:
        if self.hparams.warmup_steps and step < self.hparams.warmup_steps:
            return (step + 1) / self.hparams.warmup_steps
        return 0.5 * (1.0 + math.cos(math.pi * self.progress()))

    def on_train_start(self) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.progress() >= 1.0:
            self.trainer.should_stop = True

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.lm.parameters(), lr=self.hparams.lr,
                                weight_decay=self.hparams.weight_decay,
                                betas=(0.9, 0.98))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _loss(self, batch: dict, corrupt: float) -> tuple[torch.Tensor, torch.Tensor]:
        x, answer = batch["input_ids"], batch["answer_mask"]
        if corrupt > 0:
            u = torch.rand(x.shape[0], 1, device=x.device) * corrupt
            hide = (torch.rand(x.shape, device=x.device) < u) & answer
            inp = torch.where(hide, torch.full_like(x, self.lm_config.mask_token_id), x)
        else:
            inp = x
        logits = self.lm(inp[:, :-1])
        target, where = x[:, 1:], answer[:, 1:]
        ce = F.cross_entropy(logits.transpose(1, 2).float(), target, reduction="none")
        loss = (ce * where).sum() / where.sum().clamp(min=1)
        acc = ((logits.argmax(-1) == target) & where).sum().float() / where.sum().clamp(min=1)
        return loss, acc

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self._loss(batch, float(self.hparams.corrupt))
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, acc = self._loss(batch, 0.0)
        n = batch["input_ids"].shape[0]
        self.log("val/loss", loss, batch_size=n)
        self.log("val/next_token_acc", acc, prog_bar=True, batch_size=n)


@dataclass
class CausalTrainResult:
    path: Path
    task: str
    test_exact_match: float
    next_token_acc: Optional[float]
    steps: int
    train_seconds: float
    config: dict = field(default_factory=dict)

    def summary(self) -> str:
        return (f"causal LM for {self.task}: greedy AR exact match {self.test_exact_match:.1%}, "
                f"{self.steps} steps in {self.train_seconds:.0f} s; saved to {self.path}")


def ar_exact_match(model: CausalLM, task: Any, examples: Sequence[Any]) -> float:
    """Exact match of greedy left-to-right generation (the LM's own accuracy on the task)."""
    if not examples:
        return float("nan")
    gen = generate_greedy(model, [task.prompt_ids(e) for e in examples], task.gen_length)
    tok = task.tokenizer
    return sum(task.score(e, tok.decode(g.tolist(), stop_at_eos=True))
               for e, g in zip(examples, gen)) / len(examples)


def train_causal_lm(task: Any, options: Optional[CausalOptions] = None, **flat: Any) -> CausalTrainResult:
    """Train the verifier LM on ``task`` (a name or a Task), measure it, save it as a folder.

    ``options``: :class:`~adaptive_decoding.framework.training.options.CausalOptions` (default every default): ``recipe``
    (:data:`RECIPE`'s keys: ``d_model``, ``batch_size``, ``lr``, ``corrupt``, ``val_size``, ``n_test``,
    the budgets ``max_steps`` and ``max_minutes`` ...), ``run`` (``out_dir``, ``seed``, ``num_threads``:
    torch CPU threads, one is fastest on a shared machine) and ``logging`` (``wandb_mode``: offline,
    online or disabled; ``progress``; ``run_config``). ``flat``: any of those fields by name, replacing
    ``options``' (``None`` keeps the default).
    """
    from adaptive_decoding.framework.models.saved import default_cache_dir
    from adaptive_decoding.framework.tasks.base import Task, get_task
    from adaptive_decoding.framework.training.data import TaskDataModule

    opts = CausalOptions.with_flat(options, {k: v for k, v in flat.items() if v is not None})
    r, run = opts.recipe.get_params(), opts.run
    if run.num_threads:
        torch.set_num_threads(run.num_threads)
    task_obj = task if isinstance(task, Task) else get_task(task)
    out = Path(run.out_dir) if run.out_dir is not None else default_cache_dir() / "runs" / \
        f"causal-{task_obj.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(run.seed, workers=True, verbose=False)
    module = CausalLMModule(task=task_obj.name, task_params=task_obj.get_params(),
                            model={k: r[k] for k in _ARCH}, lr=r["lr"], weight_decay=r["weight_decay"],
                            warmup_steps=r["warmup_steps"], max_steps=r["max_steps"],
                            max_seconds=60.0 * r["max_minutes"] if r["max_minutes"] else None,
                            corrupt=r["corrupt"])
    data = TaskDataModule(task_obj, batch_size=r["batch_size"], val_size=r["val_size"], seed=run.seed)
    loggers = _loggers(out, task_obj.name, r, opts.logging)
    trainer = _trainer(r, loggers, out, opts.logging.progress)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*IterableDataset.*")
        trainer.fit(module, datamodule=data)
    secs = time.perf_counter() - (module._t0 or time.perf_counter())
    lm = module.lm.cpu().eval()
    metrics = _measure(lm, task_obj, trainer, r, run.seed, secs)
    save_causal_lm(out, lm, task=task_obj, recipe=r, metrics=metrics)
    for lg in loggers[1:]:
        lg.experiment.finish()
    return CausalTrainResult(path=out, task=task_obj.name, test_exact_match=metrics["test_ar_exact_match"],
                             next_token_acc=metrics["val_next_token_acc"], steps=int(trainer.global_step),
                             train_seconds=secs, config=lm.config.to_dict())


def _loggers(out: Path, task_name: str, r: dict[str, Any], log: RunLogging) -> list[Any]:
    """A CSV logger under ``out/lightning``, and a W&B one unless ``log.wandb_mode`` is ``disabled``
    (its config: the task, the recipe and ``log.run_config``)."""
    from pytorch_lightning.loggers import CSVLogger

    loggers: list[Any] = [CSVLogger(str(out / "lightning"), name="csv")]
    if log.wandb_mode != "disabled":
        from pytorch_lightning.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        loggers.append(WandbLogger(project="adaptive-decoding", name=f"causal-lm-{task_name}",
                                   save_dir=str(out / "lightning"), mode=log.wandb_mode,
                                   config={"task": task_name, **r, **(log.run_config or {})}))
    return loggers


def _trainer(r: dict[str, Any], loggers: list[Any], out: Path, progress: bool) -> pl.Trainer:
    """The CPU trainer: ``max_steps`` steps, validation every ``val_every`` steps (none without a
    validation set), gradients clipped at 1."""
    has_val = bool(r["val_size"])
    return pl.Trainer(
        accelerator="cpu", devices=1, max_steps=int(r["max_steps"]), logger=loggers,
        enable_progress_bar=progress, enable_model_summary=progress, enable_checkpointing=False,
        val_check_interval=min(int(r["val_every"]), int(r["max_steps"])) if has_val else None,
        check_val_every_n_epoch=None, limit_val_batches=1.0 if has_val else 0, num_sanity_val_steps=0,
        log_every_n_steps=25, default_root_dir=str(out / "lightning"), gradient_clip_val=1.0,
    )


def _measure(lm: CausalLM, task_obj: Any, trainer: pl.Trainer, r: dict[str, Any], seed: int,
             secs: float) -> dict[str, Any]:
    """The trained LM's figures: greedy exact match on ``n_test`` test examples, the last validation
    next-token accuracy, steps and training time."""
    acc = trainer.callback_metrics.get("val/next_token_acc")
    test = task_obj.examples("test", int(r["n_test"]), seed=seed) if r["n_test"] else []
    em = ar_exact_match(lm, task_obj, test) if test else float("nan")
    return {"task": task_obj.name, "test_ar_exact_match": em, "n_test": len(test),
            "val_next_token_acc": float(acc) if acc is not None else None,
            "steps": int(trainer.global_step), "train_seconds": round(secs, 1), "seed": seed}


# ---------------------------------------------------------------------- save / load / cache
def save_causal_lm(folder: "str | os.PathLike", lm: CausalLM, *, task: Any, recipe: dict,
                   metrics: dict) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in lm.state_dict().items()}, folder / "model.pt")
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    cfg = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": lm.config.to_dict(),
           "task": task.name,
           "task_params": task.get_params(), "vocab": list(task.tokenizer.vocab), "recipe": recipe}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")  # last: marks completeness
    return folder


def load_causal_lm_folder(folder: "str | os.PathLike", device: str = "cpu") -> CausalLM:
    """Load a folder written by :func:`save_causal_lm` (a missing or foreign file is named)."""
    from adaptive_decoding.framework.models.saved import CheckpointError

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path}: file not found")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({exc})") from None
    if cfg.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_path}: format {cfg.get('format')!r} is not {FORMAT!r}")
    lm = CausalLM(CausalConfig(**cfg["model"]))
    w = folder / "model.pt"
    if not w.is_file():
        raise CheckpointError(f"{w}: file not found")
    lm.load_state_dict(torch.load(w, map_location="cpu", weights_only=True))
    lm.task_name = cfg.get("task")  # type: ignore[attr-defined]
    return lm.to(device).eval()


def causal_lm_dir(task: str) -> Path:
    from adaptive_decoding.framework.models.saved import default_cache_dir

    return default_cache_dir() / "models" / f"causal-{task}"


_CACHE: dict[tuple[str, str], CausalLM] = {}


def load_causal_lm(task: str, device: str = "cpu", train_if_missing: bool = True,
                   progress: bool = True) -> CausalLM:
    """The cached verifier LM of a built-in task (trained on first use, then reused; per process too)."""
    from adaptive_decoding.framework.models.saved import CheckpointError, file_lock

    key = (task, str(device))
    if key in _CACHE:
        return _CACHE[key]
    folder = causal_lm_dir(task)
    if not (folder / "config.json").exists():
        if not train_if_missing:
            raise CheckpointError(f"{folder / 'config.json'}: file not found (the causal LM of task "
                                  f"{task!r} is not trained yet; call "
                                  f"adaptive_decoding.framework.training.causal_lm.train_causal_lm({task!r}) or allow "
                                  f"train_if_missing)")
        with file_lock(folder.parent / f".causal-{task}.lock"):
            if not (folder / "config.json").exists():
                print(f"adec: training the causal LM verifier for task {task!r} (about "
                      f"{RECIPE['max_minutes']:g} min on CPU) into {folder}", file=sys.stderr, flush=True)
                staging = folder.parent / f".causal-{task}.partial-{os.getpid()}"
                res = train_causal_lm(task, out_dir=staging, progress=progress,
                                      wandb_mode=os.environ.get("WANDB_MODE", "offline")
                                      if os.environ.get("WANDB_MODE") in ("offline", "online",
                                                                          "disabled") else "offline")
                if folder.exists() and not any(folder.iterdir()):
                    folder.rmdir()
                os.replace(staging, folder)
                print(f"adec: {res.summary().replace(str(staging), str(folder))}", file=sys.stderr,
                      flush=True)
    _CACHE[key] = load_causal_lm_folder(folder, device=device)
    return _CACHE[key]
