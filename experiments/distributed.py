"""Scaling out with the existing engines: torch.distributed for evaluation, Lightning DDP for training.

Evaluation (:func:`evaluate_sharded`): the task's examples are drawn once (the same list on every
rank), rank r decodes examples ``r, r + W, r + 2W, …`` (W ranks), and the per-sample results are
gathered with ``all_gather_object`` and put back in the original order. Decoding is batch-invariant
and every sample's randomness comes from its own seed (``item_seeds``), so accuracy, NFE and every
output equal a single-process run exactly; wall time is the slowest rank's, peak memory the
largest rank's. The same code runs

* on CPU with the ``gloo`` backend: :func:`spawn` starts W local processes (``adec run --procs 2``),
* on GPUs with ``nccl``: ``torchrun --nproc_per_node=8 -m adaptive_decoding.framework.cli run experiments/configs/X.yaml``;
  :func:`init_from_env` reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and each rank uses
  ``cuda:<local rank>``.

Training: :func:`lightning_ddp_smoke` fits :class:`adaptive_decoding.framework.training.MaskedDiffusionLM` with
``Trainer(strategy="ddp", accelerator="cpu", devices=2)``; Lightning's launcher re-runs the
command for the second rank, so it is started as ``python -m adaptive_decoding.experiments.workers train-smoke``
(on GPUs the same with ``--accelerator gpu --devices 8``).
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from adaptive_decoding.experiments.options import ShardedEvaluation


@dataclass
class DistContext:
    """This process's place in a process group (defaults: a single process, no group)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: Optional[str] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def init_from_env(backend: Optional[str] = None) -> DistContext:
    """Join the group that ``torchrun`` (or :func:`spawn`) describes in the environment.

    Without ``WORLD_SIZE > 1`` this is a single process. ``backend`` defaults to ``nccl`` when CUDA
    is available, else ``gloo``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if not torch.distributed.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(local)
        torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistContext(rank=rank, world_size=world, local_rank=local, backend=backend)


def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    """Indices of rank ``rank``'s share of ``n`` items (strided, so shards differ by at most one)."""
    return list(range(rank, n, world_size))


class _ShardTask:
    """A task whose ``examples()`` is a fixed list (one rank's shard); everything else is the task's."""

    def __init__(self, task: Any, examples: list, split: str) -> None:
        self._task = task
        self._examples = examples
        self._split = split

    def examples(self, split: str, n: int, seed: int = 0) -> list:
        if split != self._split:
            raise ValueError(f"shard of split {self._split!r} asked for {split!r}")
        return list(self._examples)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


def evaluate_sharded(loaded: Any, task: Any, controller: Any, config: Any,
                     options: Optional[ShardedEvaluation] = None, *, dist: Optional[DistContext] = None,
                     lookahead: Any = None) -> Any:
    """:func:`adaptive_decoding.framework.engine.evaluate.evaluate` over the ranks of ``dist`` (see the module docstring)
    by ``options`` (:class:`~adaptive_decoding.experiments.options.ShardedEvaluation`, default every default: ``n``
    examples of ``split`` drawn with ``data_seed``, ``batch_size`` at a time, ``repeats`` timed runs,
    the ``strategy`` label).

    With one rank it is exactly ``evaluate(...)``.
    """
    from adaptive_decoding.framework.engine.evaluate import evaluate

    opts = options if options is not None else ShardedEvaluation()
    opts.validate()
    split, n, data_seed = opts.split, opts.n, opts.data_seed
    kw = dict(strategy=opts.strategy, split=split, batch_size=opts.batch_size, lookahead=lookahead,
              repeats=opts.repeats, data_seed=data_seed)
    dist = dist or DistContext()
    if not dist.active:
        return evaluate(loaded, task, controller, config, n=n, **kw)
    examples = task.examples(split, n, seed=data_seed)
    mine = shard_indices(len(examples), dist.rank, dist.world_size)
    part = evaluate(loaded, _ShardTask(task, [examples[i] for i in mine], split), controller, config,
                     n=len(mine), **kw) if mine else None
    parts = dist.gather((mine, part))
    merged = merge_results(parts, len(examples), config.gen_length)
    # per-slot fractions: recount exactly
    if hasattr(task, "joint_coherence") and "valid_slots" in merged.extra:
        from adaptive_decoding.framework.engine.evaluate import coherence_summary

        merged.extra.update(coherence_summary(task, examples, [s.output for s in merged.samples]))
    return merged


def merge_results(parts: Sequence[tuple[list[int], Any]], n: int, gen_length: int) -> Any:
    """One :class:`EvalResult` from the ranks' ``(indices, result)``, samples in the original order."""
    from dataclasses import replace

    from adaptive_decoding.framework.core.measure import tokens_per_forward, tokens_per_forward_mean
    from adaptive_decoding.framework.engine.evaluate import EvalResult

    parts = [(idx, r) for idx, r in parts if r is not None and idx]
    samples: list[Any] = [None] * n
    for idx, r in parts:
        for i, s in zip(idx, r.samples):
            samples[i] = s
    if any(s is None for s in samples):
        raise RuntimeError("a rank returned fewer samples than its shard")
    k = max(1, n)
    weight = lambda attr: sum(getattr(r, attr) * len(idx) for idx, r in parts) / k  # noqa: E731
    # wall time: the slowest rank's; ms_per_token is total time / (samples x G)
    wall = max(r.ms_per_token * len(idx) * gen_length for idx, r in parts) / 1000.0
    extra: dict[str, Any] = {}
    for key in parts[0][1].extra:
        vals = [(r.extra.get(key), len(idx)) for idx, r in parts]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v, _ in vals):
            extra[key] = sum(v * m for v, m in vals) / k
        else:
            extra[key] = vals[0][0]
    extra["world_size"] = len(parts)
    first = parts[0][1]
    nfe = torch.tensor([s.nfe for s in samples]).float()  # the same float32 means as evaluate()
    answers = [gen_length if s.answer_tokens is None else s.answer_tokens for s in samples]
    return replace(
        first, n=n, samples=samples,
        accuracy=sum(s.correct for s in samples) / k,
        nfe=float(nfe.mean()),
        tpf=tokens_per_forward(answers, nfe), tpf_mean=tokens_per_forward_mean(answers, nfe),
        ms_per_token=1000.0 * wall / max(1, n * gen_length),
        peak_mem_mb=max(r.peak_mem_mb for _, r in parts),
        lookahead_nfe=weight("lookahead_nfe"), forced_steps=weight("forced_steps"), extra=extra,
    ) if isinstance(first, EvalResult) else first


# ---------------------------------------------------------------------- local multi-process launcher
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned(rank: int, fn: Callable[..., Any], world_size: int, port: int, backend: str, result_path: str,
             threads: int, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    ctx = init_from_env(backend)
    finished = False
    try:
        out = fn(ctx, *args)
        if ctx.is_main:
            with open(result_path, "wb") as fh:
                pickle.dump(out, fh)
        finished = True
    finally:
        if finished:  # no rank tears the group down while another still talks to it
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    _exit_now()


def _exit_now() -> None:
    """End a spawned rank without the interpreter's shutdown.

    Gloo's C++ worker threads can still hold work objects (and tensors with Python references) after
    ``destroy_process_group``; destroying them while the interpreter is finalized aborts the process
    now and then ("terminate called without an active exception", SIGABRT; pytorch/pytorch#190489,
    #179291), which failed a run whose results were already written. Everything this rank had to do
    is done and on disk, so it flushes its streams and logs and leaves with status 0.
    """
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def spawn(fn: Callable[..., Any], nprocs: int, *args: Any, backend: str = "gloo", threads: int = 1) -> Any:
    """Run ``fn(DistContext, *args)`` in ``nprocs`` new processes; return rank 0's result.

    ``fn`` must be importable by name (a module-level function): the processes are started with
    the ``spawn`` method, which pickles it.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="adec-spawn-") as tmp:
        result = os.path.join(tmp, "result.pkl")
        mp.start_processes(_spawned, args=(fn, nprocs, free_port(), backend, result, threads, args),
                           nprocs=nprocs, join=True, start_method="spawn")
        with open(result, "rb") as fh:
            return pickle.load(fh)


# ---------------------------------------------------------------------- Lightning DDP training
def lightning_ddp_smoke(out_dir: "str | os.PathLike", *, task: str = "addition", steps: int = 4,
                        accelerator: str = "cpu", devices: int = 2, batch_size: int = 32, size: str = "tiny",
                        seed: int = 0) -> dict:
    """Fit :class:`MaskedDiffusionLM` for ``steps`` steps under ``Trainer(strategy="ddp", ...)``.

    Every rank writes ``rank<r>.json`` into ``out_dir`` with the world size it saw, the global
    step, the last loss and a checksum of its weights: after DDP's gradient all-reduce the ranks'
    weights must be identical.
    """
    import warnings

    import pytorch_lightning as pl

    from adaptive_decoding.framework.models.tiny import MODEL_SIZES
    from adaptive_decoding.framework.training.data import TaskDataModule
    from adaptive_decoding.framework.training.masked_diffusion import MaskedDiffusionLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(seed, workers=True, verbose=False)
    module = MaskedDiffusionLM(task=task, model=MODEL_SIZES[size], max_steps=steps, warmup_steps=1)
    data = TaskDataModule(module.task, batch_size=batch_size, val_size=0, seed=seed)
    trainer = pl.Trainer(strategy="ddp", accelerator=accelerator, devices=devices, max_steps=steps,
                         logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=str(out))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=data)
    params = torch.cat([p.detach().float().reshape(-1).cpu() for p in module.denoiser.parameters()])
    info = {"rank": trainer.global_rank, "world_size": trainer.world_size, "global_step": trainer.global_step,
            "strategy": type(trainer.strategy).__name__,
            "loss": float(trainer.callback_metrics.get("train/loss", float("nan"))),
            "checksum": float(params.double().sum()), "abs_checksum": float(params.double().abs().sum())}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(info) + "\n")
    return info
