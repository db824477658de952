"""``adec``: the command-line entry point.

Each sub-command lives in its own module under :mod:`adaptive_decoding.framework.cli` and exposes
``register(subparsers)``; this dispatcher only collects them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from adaptive_decoding.framework.cli.errors import CLIError
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.registry import (
    PluginImportError,
    UnknownNameError,
    import_plugin,
    skip_broken_plugins,
)

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
    parser.add_argument("--skip-broken-plugins", action="store_true",
                        help="warn about, instead of failing on, a plugin module or entry point that does not "
                             "import (the broken plugin is left out)")
    for name in COMMAND_MODULES:
        mod = import_plugin(f"adaptive_decoding.framework.cli.{name}", "command module")
        if mod is not None:
            mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    skip_broken_plugins("--skip-broken-plugins" in argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ParameterError, UnknownNameError, CLIError, FileNotFoundError, PluginImportError) as exc:
        print(f"adec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"adec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
