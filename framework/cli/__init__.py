"""``adec``: one module per command (``register(subparsers)`` + ``run(args)``); :func:`main` dispatches."""

from adaptive_decoding.framework.cli.main import main

__all__ = ["main"]
