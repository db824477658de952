"""``adec``: the command-line entry point.

Each sub-command lives in its own module under :mod:`framework.cli` and exposes
``register(subparsers)``; this dispatcher only collects them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from framework.cli.errors import CLIError
from framework.core.params import ParameterError
from framework.core.registry import UnknownNameError

COMMAND_MODULES = (
    "decode",
    "train",
    "listing",
    "bench",
    "tune",
    "train_controller",
    "generate",
    "run",
    "report",
    "profile",
    "lm_eval",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adec",
        description=(
            "Adaptive parallel decoding of masked diffusion language models: decode with any "
            "registered controller, train the tiny denoisers and learned controllers, tune with "
            "Optuna, benchmark against LLaDA / Dream / Fast-dLLM / EB baselines."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'adec COMMAND --help' for the options of one command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        mod_name = f"framework.cli.{name}"
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ParameterError, UnknownNameError, CLIError, FileNotFoundError) as exc:
        print(f"adec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"adec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
