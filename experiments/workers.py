"""Entry points of spawned ranks: ``python -m adaptive_decoding.experiments.workers train-smoke`` and the experiment
worker that :func:`adaptive_decoding.experiments.distributed.spawn` starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.experiments.distributed import DistContext, evaluate_sharded, lightning_ddp_smoke
from adaptive_decoding.experiments.options import ExperimentOptions, ShardedEvaluation


def run_experiment_worker(ctx: DistContext, path: str, out_dir: str, options: ExperimentOptions,
                          overrides: Optional[dict] = None) -> Any:
    """One rank of ``adec run --procs N`` (module level, so :func:`spawn` can start it): the experiment
    file ``path`` (with ``overrides``) run by ``options``; only rank 0 logs to W&B and shows progress."""
    from adaptive_decoding.experiments.parse import load_experiment
    from adaptive_decoding.experiments.runner import run_experiment

    exp = load_experiment(path, overrides=overrides)
    if not ctx.is_main:
        options = options.replace(logging=options.logging.replace(wandb_mode="disabled", progress=False))
    return run_experiment(exp, out_dir, options, dist=ctx)


def evaluate_jobs(ctx: Optional[DistContext], jobs: Sequence[dict]) -> list:
    """Evaluate ``jobs`` (dicts: ``model``, ``task``, ``task_params``, ``controller``, ``params``, ``decode``,
    ``n``, ``batch_size``, optional ``lookahead``) with :func:`evaluate_sharded` over ``ctx``'s ranks.

    Module level, so ``spawn(evaluate_jobs, 2, jobs)`` runs it on 2 processes; ``evaluate_jobs(None, jobs)``
    is the single-process run it must equal.
    """
    from adaptive_decoding.experiments.cells import load_any_model
    from adaptive_decoding.experiments.spec import ensure_text_task
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.tasks.base import get_task

    ensure_text_task()
    out = []
    for job in jobs:
        task = get_task(job["task"], **job.get("task_params", {}))
        loaded = load_any_model(job["model"], device="cpu")
        config = DecodeConfig.build(**{"gen_length": task.gen_length, **job.get("decode", {})})
        lookahead = None
        if job.get("lookahead"):
            from adaptive_decoding.framework.engine.lookahead import Lookahead

            lookahead = Lookahead.build(**job["lookahead"])
        controller = build_controller(job["controller"], **job.get("params", {}))
        evaluation = ShardedEvaluation.build(n=job["n"], batch_size=job.get("batch_size", 64))
        out.append(evaluate_sharded(loaded, task, controller, config, evaluation, dist=ctx, lookahead=lookahead))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adaptive_decoding.experiments.workers",
                                description="Lightning DDP training smoke (re-run by Lightning for each "
                                            "rank).")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train-smoke", help="fit a tiny denoiser for a few steps under strategy='ddp'")
    t.add_argument("--out", required=True)
    t.add_argument("--task", default="addition")
    t.add_argument("--steps", type=int, default=4)
    t.add_argument("--accelerator", default="cpu")
    t.add_argument("--devices", type=int, default=2)
    t.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    torch.set_num_threads(1)
    info = lightning_ddp_smoke(args.out, task=args.task, steps=args.steps, accelerator=args.accelerator,
                               devices=args.devices, batch_size=args.batch_size)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
