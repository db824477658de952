"""``adec train-denoiser``: train a tiny masked-diffusion denoiser on a built-in task."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

EPILOG = """\
The model is trained with the masked-diffusion loss (MDLM/LLaDA: answer positions masked with
probability t ~ U(0,1), cross-entropy weighted by 1/t), then scored on the task's test split
with one-token-per-step decoding; the figure is printed and saved in metrics.json.

By default the folder is the cache entry of the built-in model tiny-TASK (so 'adec decode' and
'adec bench' reuse it); if that entry already exists, a new folder under the cache's runs/ is
used instead and the cached model is left alone.

With --task-param (a task at another size), --init-from or --block-size, the model is not the built-in
tiny-TASK, so it goes to --out (or a new folder under the cache's runs/), never the cache entry.
--init-from starts from a trained model of the same size and vocabulary instead of random weights;
a longer canvas gets its extra position rows from the model's last one, so only they need teaching.

--block-size b trains a block-diffusion model (LLaDA2.x's and SDAR's layout): canvas blocks of b
positions, each attending to itself and earlier blocks, trained with the two-copy objective (a
noisy copy beside the clean one, so each block sees a clean prefix, as when it is decoded). With
--init-from a bidirectional model it is adapted to blocks by fine-tuning, as Fast-dLLM v2 and SDAR
adapt theirs; the built-in tiny-phrases-bd32 is made this way. Decoding then runs one block at a
time, and the block length must be b.

examples:
  adec train-denoiser --task addition
  adec train-denoiser --task phrases --init-from tiny-phrases --block-size 32 --max-steps 400 \\
      --lr 1e-3 --out runs/models/phrases-bd32
  adec train-denoiser --task sudoku --minutes 5 --wandb disabled --out runs/sudoku
  adec train-denoiser --task phrases --task-param length=256 --init-from tiny-phrases \\
      --minutes 8 --lr 5e-4 --out runs/models/tiny-phrases-256
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from adaptive_decoding.framework.models.tiny import MODEL_SIZES
    from adaptive_decoding.framework.tasks.base import TASKS

    p = subparsers.add_parser(
        "train-denoiser", help="train a tiny denoiser on a built-in task and print its test accuracy",
        description="Train a tiny bidirectional masked denoiser on one built-in task (CPU, Lightning).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", required=True, help=f"task to train on: {', '.join(trainable_tasks(TASKS))}")
    p.add_argument("--task-param", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help="task parameter, repeatable (--task-param length=256); see 'adec list tasks -v'")
    p.add_argument("--init-from", default=None, metavar="MODEL",
                   help="start from this trained tiny denoiser (folder or built-in name) of the same size "
                        "and vocabulary; a longer canvas repeats its last position row")
    p.add_argument("--minutes", type=float, default=None,
                   help="wall-time budget of training (default: the task's recipe, about 10)")
    p.add_argument("--max-steps", type=int, default=None, help="step budget (default: the task's recipe)")
    p.add_argument("--out", default=None,
                   help="output folder (default: the cache folder of tiny-TASK, see below)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, data and masking (default: 0)")
    p.add_argument("--wandb", choices=("offline", "online", "disabled"), default="offline",
                   help="Weights & Biases logging (default: offline; a CSV log is always written)")
    p.add_argument("--size", choices=tuple(MODEL_SIZES), default=None,
                   help="architecture preset (default: the task's recipe)")
    p.add_argument("--block-size", type=_positive_int, default=None, metavar="B",
                   help="train a block-diffusion model with canvas blocks of B (block-causal attention; "
                        "default: bidirectional)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe)")
    p.add_argument("--batch-size", type=int, default=None, help="training batch size (default: the recipe)")
    p.add_argument("--n-test", type=int, default=None,
                   help="test problems the final accuracy is measured on (default: the recipe, 1000)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: the idle cores by the load average, at least 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a block size; allowed: a positive integer")
    return value


def _model_size(args: argparse.Namespace) -> Any:
    """``--size``, or with ``--block-size`` the preset's fields (``--size`` or the task's) plus it."""
    if args.block_size is None:
        return args.size
    from adaptive_decoding.framework.models.tiny import MODEL_SIZES
    from adaptive_decoding.framework.tasks.base import recipe_for

    preset = args.size or recipe_for(args.task).size
    return dict(preset if isinstance(preset, dict) else MODEL_SIZES[preset], block_size=args.block_size)


def trainable_tasks(tasks: Any) -> list[str]:
    """The registered tasks a tiny denoiser can be trained on: those with a built-in model (the
    ``data`` and ``lm_eval`` tasks run on the researcher's own model)."""
    from adaptive_decoding.framework.models.zoo import builtin_model_of

    return [n for n in tasks.names() if builtin_model_of(tasks.get(n), n) is not None]


def _runs_dir(task: str) -> Path:
    import time

    from adaptive_decoding.framework.models.saved import default_cache_dir

    return default_cache_dir() / "runs" / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def denoiser_options(args: argparse.Namespace, out: Path) -> Any:
    """The :class:`~adaptive_decoding.framework.training.options.DenoiserOptions` of the flags (unset recipe flags keep
    the task's recipe), writing into ``out``."""
    from adaptive_decoding.framework.training.options import DenoiserOptions

    return DenoiserOptions.from_flat({
        "max_minutes": args.minutes, "max_steps": args.max_steps, "model_size": _model_size(args), "lr": args.lr,
        "batch_size": args.batch_size, "n_test": args.n_test, "out_dir": str(out), "seed": args.seed,
        "init_from": args.init_from, "num_threads": args.threads, "wandb_mode": args.wandb,
        "progress": not args.no_progress,
    })


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.cli.options import parse_task_params
    from adaptive_decoding.framework.models.saved import model_dir
    from adaptive_decoding.framework.tasks.base import TASKS, get_task
    from adaptive_decoding.framework.training.masked_diffusion import train_denoiser
    from adaptive_decoding.framework.training.zoo import MODELS

    if args.task in TASKS and args.task not in trainable_tasks(TASKS):
        raise CLIError(f"--task {args.task}: this task has no vocabulary of its own (it runs on your model "
                       f"with your model's tokenizer), so there is no tiny denoiser to train for it; "
                       f"allowed: {', '.join(trainable_tasks(TASKS))}")
    task = get_task(args.task, **parse_task_params(args.task, args.task_params))  # unknown: lists the known
    cache_entry = None
    if args.out:
        out = Path(args.out)
    else:  # train under runs/, then move into the cache entry if it is still free
        out = _runs_dir(task.name)
        name = f"tiny-{task.name}"
        builtin = not args.task_params and args.init_from is None and args.block_size is None
        if builtin and name in MODELS and not model_dir(name).exists():
            cache_entry = model_dir(name)
    result = train_denoiser(task, denoiser_options(args, out))
    path = result.path
    if cache_entry is not None:
        if not cache_entry.exists():
            cache_entry.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, cache_entry)
            path = cache_entry
        else:
            print(f"note: {cache_entry} appeared while training; it was left alone")
    print(f"test exact match ({task.name}, one token per step): {result.test_accuracy:.2%} "
          f"on {result.n_test} test problems")
    print(f"trained {result.steps} steps in {result.train_seconds / 60:.1f} min "
          f"(total {result.total_seconds / 60:.1f} min)")
    print(f"checkpoint: {path}")
    return 0
