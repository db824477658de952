"""The RL fine-tune as a Lightning run (see :mod:`adaptive_decoding.framework.learning.rl` for the method).

One epoch = one policy-gradient iteration: draw ``prompts`` training prompts (when the epoch first
reads its data), decode each ``group`` times with the current policy sampling its commits, score
the answers, compute group advantages, then take gradient steps over the recorded steps. Writes ``rl/``
under the output
folder: ``current.pt`` (the policy the rollouts used), Lightning checkpoints (``last.ckpt``, the
resume point), CSV and W&B (offline) logs with ``reward``, ``accuracy``, ``nfe`` per epoch.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.data import IterableDataset

from adaptive_decoding.framework.core.measure import tokens_per_forward
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.learning.features import FEATURE_NAMES
from adaptive_decoding.framework.learning.nets import CONTROLLER_OF, build_net
from adaptive_decoding.framework.learning.options import RLOptions, RunLogging
from adaptive_decoding.framework.learning.policy import load_policy, save_policy
from adaptive_decoding.framework.learning.rl import (
    ActionRecorder,
    group_advantages,
    reinforce_loss,
    reward,
    rl_windows,
    rollout_prompts,
)
from adaptive_decoding.framework.learning.rollouts import RolloutDataset
from adaptive_decoding.framework.learning.train import policy_controller


@lru_cache(maxsize=1)
def _rl_module_class() -> type:
    import pytorch_lightning as pl

    class RLPolicyModule(pl.LightningModule):
        """The policy under REINFORCE: loss = −mean A·log π(a | s); logs the rollouts' figures."""

        def __init__(self, kind: str = "mlp", arch: Optional[dict] = None, lr: float = 1e-3,
                     threshold: float = 0.99, temperature: float = 1.0,
                     n_features: int = len(FEATURE_NAMES)) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = build_net(kind, arch, n_features=n_features)
            self.stats: dict[str, float] = {}
            self.collect: Any = None  # epoch -> tensors of the rollouts' steps (set by rl_finetune)
            self.buffer: tuple = ()
            self.buffer_epoch = -1
            self.first_epoch = 0  # the epoch a resumed run starts at (read from its checkpoint)

        def rollouts(self) -> tuple:
            """This epoch's rollout steps, collected once per epoch (current_epoch is right here, also
            after a resume; Lightning's dataloader hooks run before the checkpoint is restored)."""
            epoch = max(self.current_epoch, self.first_epoch)
            if self.buffer_epoch != epoch:
                self.buffer, self.buffer_epoch = self.collect(epoch), epoch
            return self.buffer

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, valid, actions, adv = batch
            loss = reinforce_loss(self.net, x, valid, actions, adv, self.hparams.threshold,
                                  self.hparams.temperature)
            self.log("pg_loss", loss, on_step=False, on_epoch=True, batch_size=len(x))
            return loss

        def on_train_epoch_end(self) -> None:
            for k, v in self.stats.items():
                self.log(k, float(v), on_epoch=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    RLPolicyModule.__module__ = __name__
    RLPolicyModule.__qualname__ = "RLPolicyModule"
    return RLPolicyModule


def rl_finetune(loaded: Any, task: Any, init_policy: "str | os.PathLike", config: DecodeConfig,
                options: Optional[RLOptions] = None, *, out_dir: "str | os.PathLike",
                logging: Optional[RunLogging] = None, decode_batch_size: int = 64) -> tuple[Any, dict]:
    """Fine-tune the policy in ``init_policy`` with REINFORCE by ``options``
    (:class:`~adaptive_decoding.framework.learning.options.RLOptions`: λ, the reward form, K = ``group`` rollouts per
    prompt, τ and T of the sampled policy, τ₂; its ``seed`` null = 0), decoding ``decode_batch_size``
    rollouts together; W&B mode and progress from ``logging``. Returns the network and run info."""
    import pytorch_lightning as pl

    opts = options if options is not None else RLOptions()
    log = logging if logging is not None else RunLogging(progress=True)
    opts.validate()
    log.validate()
    seed = opts.seed or 0
    start = load_policy(init_policy)
    kind = start.kind
    out = Path(out_dir) / "rl"
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(seed, workers=True, verbose=False)
    module = _rl_module_class()(kind=kind, arch=start.net.arch(), lr=opts.lr, threshold=opts.threshold,
                                temperature=opts.temperature, n_features=len(start.feature_names))
    module.net.load_state_dict(copy.deepcopy(start.net).float().state_dict())
    collector = _RolloutCollector(module, start, out / "current.pt",
                                  _Rollouts(loaded, task, config, decode_batch_size), opts, log.progress)
    module.collect = collector
    loggers = _loggers(out, f"rl-{kind}-{Path(out_dir).name}", log.wandb_mode)
    last, resumed = _fit(module, _Minibatches(module, seed, opts.minibatch), out, loggers,
                         iterations=opts.iterations, resume=opts.resume, verbose=log.progress)
    info = {"iterations": opts.iterations, "prompts": opts.prompts, "group": opts.group, "lambda": opts.lam,
            "reward": opts.reward_form,
            "threshold": opts.threshold, "temperature": opts.temperature,
            "normalise": opts.normalise, "lr": opts.lr, "history": collector.history, "last_checkpoint": str(last),
            "resumed": resumed}
    return module.net.cpu().eval(), info


@dataclass
class _Rollouts:
    """What the rollouts decode: the model, the task, the loop options, and how many rollouts at once."""

    loaded: Any
    task: Any
    config: DecodeConfig
    batch_size: int


class _Minibatches(IterableDataset):
    """Each pass: the current epoch's rollout steps, shuffled (seeded), in minibatches."""

    def __init__(self, module: Any, seed: int, minibatch: int) -> None:
        self.module, self.seed, self.minibatch = module, seed, minibatch

    def __iter__(self) -> Any:
        tensors = self.module.rollouts()
        n = len(tensors[0])
        order = torch.randperm(n,
                               generator=torch.Generator().manual_seed(self.seed + self.module.buffer_epoch))
        for s in range(0, n, self.minibatch):
            yield tuple(t[order[s:s + self.minibatch]] for t in tensors)


class _RolloutCollector:
    """One epoch's rollouts (the module's ``collect``): save the current policy, decode ``group``
    samples of each of ``prompts`` training prompts with it (sampling its commits), score them,
    and turn rewards r(correct, NFE) into group advantages A over the recorded steps."""

    def __init__(self, module: Any, start: Any, current: Path, env: _Rollouts, options: RLOptions,
                 verbose: bool) -> None:
        self.module, self.start, self.current, self.env, self.opts = module, start, current, env, options
        self.verbose = verbose
        self.history: list[dict[str, float]] = []

    def __call__(self, epoch: int) -> tuple:
        module, kind, G, o = self.module, self.start.kind, self.env.config.gen_length, self.opts
        save_policy(copy.deepcopy(module.net).cpu().eval(), self.current, kind=kind,
                    threshold=self.start.threshold,
                    meta={**self.start.meta, "rl_epoch": epoch})
        examples = list(rollout_prompts(self.env.task, o.prompts, epoch, o.data_seed))
        jobs = [(g, ex, k) for g, ex in enumerate(examples) for k in range(o.group)]
        parts, correct, nfe, groups = [], [], [], []
        for s in range(0, len(jobs), self.env.batch_size):
            chunk = jobs[s:s + self.env.batch_size]
            data_part, chunk_correct, chunk_nfe = self._decode(chunk, epoch)
            parts.append(data_part)
            correct += chunk_correct
            nfe += chunk_nfe
            groups += [g for g, _, _ in chunk]
        data = RolloutDataset.concat(parts)  # rollout j of the epoch is sample j
        c, n = torch.tensor(correct), torch.tensor(nfe, dtype=torch.float64)
        r = reward(c, n, G, o.lam, o.reward_form)
        adv = group_advantages(r, torch.tensor(groups), o.normalise)
        module.stats = {"reward": float(r.mean()), "accuracy": float(c.mean()), "nfe": float(n.mean()),
                        "tpf": tokens_per_forward(torch.full_like(n, G), n)}  # every position: G / mean NFE
        self.history.append({"epoch": epoch, **module.stats})
        if self.verbose:
            st = module.stats
            print(f"rl epoch {epoch}: reward {st['reward']:.3f}  accuracy {st['accuracy']:.3f}"
                  f"  NFE {st['nfe']:.2f}  tokens/forward {st['tpf']:.2f}", file=sys.stderr, flush=True)
        return rl_windows(kind, data, adv)

    def _decode(self, chunk: list, epoch: int) -> tuple[RolloutDataset, list[float], list[int]]:
        """Decode one chunk of (group, example, sample) jobs with the saved current policy, sampling:
        the recorded steps, each sample's score and its NFE."""
        from adaptive_decoding.framework.engine.context import DecodeContext
        from adaptive_decoding.framework.engine.evaluate import item_seeds
        from adaptive_decoding.framework.engine.loop import decode

        env, o = self.env, self.opts
        tok, task, config = env.loaded.tokenizer, env.task, env.config
        rec = ActionRecorder(policy_controller(CONTROLLER_OF[self.start.kind], self.current, o.threshold,
                                               o.verify_threshold, sample=True,
                                               sample_temperature=o.temperature), config.gen_length,
                             self.start.structure)
        res = decode(env.loaded.denoiser, [tok.encode(ex.prompt) for _, ex, _ in chunk], rec, config,
                     seeds=item_seeds([f"{ex.id}/rl{epoch}/{k}" for _, ex, k in chunk], o.seed or 0),
                     context=DecodeContext.for_batch(tok, [ex for _, ex, _ in chunk], task=task,
                                                     gen_length=config.gen_length))
        correct = [float(task.score(ex, tok.decode(row, stop_at_eos=True)))
                   for (_, ex, _), row in zip(chunk, res.generated.tolist())]
        return rec.dataset().select(self.start.feature_names), correct, res.nfe.tolist()


def _loggers(out: Path, name: str, wandb_mode: str) -> list[Any]:
    """A CSV logger under ``out/lightning``, and a W&B one unless ``wandb_mode`` is ``disabled``."""
    from pytorch_lightning.loggers import CSVLogger

    loggers: list[Any] = [CSVLogger(str(out / "lightning"), name="csv")]
    if wandb_mode != "disabled":
        from pytorch_lightning.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        loggers.append(WandbLogger(project="adaptive-decoding", name=name,
                                   save_dir=str(out / "lightning"), mode=wandb_mode))
    return loggers


def _fit(module: Any, minibatches: _Minibatches, out: Path, loggers: list[Any], *, iterations: int,
         resume: bool, verbose: bool) -> tuple[Path, bool]:
    """Run ``iterations`` epochs (resuming from ``out/checkpoints/last.ckpt`` when ``resume`` and it
    exists): the last checkpoint's path and whether the run resumed."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    from adaptive_decoding.framework.learning.train import quiet_lightning

    ckpt = ModelCheckpoint(dirpath=str(out / "checkpoints"), save_last=True, save_top_k=1, every_n_epochs=1)
    last = out / "checkpoints" / "last.ckpt"
    resumed = bool(resume and last.is_file())
    if resumed:
        module.first_epoch = int(torch.load(last, map_location="cpu", weights_only=False)["epoch"]) + 1
    with quiet_lightning(True):
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=iterations, logger=loggers,
                             callbacks=[ckpt],
                             enable_progress_bar=verbose and sys.stderr.isatty(),
                             enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1,
                             default_root_dir=str(out / "lightning"), deterministic=True)
        trainer.fit(module, train_dataloaders=DataLoader(minibatches, batch_size=None),
                    ckpt_path=str(last) if resumed else None)
    for lg in loggers[1:]:
        lg.experiment.finish()
    return last, resumed
