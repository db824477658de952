"""The errors of a generation job and how a failure is classified (OOM, reason text).
"""

from __future__ import annotations

import gc
from typing import Sequence

import torch

from adaptive_decoding.framework.core.params import ParameterError, StopDecoding
from adaptive_decoding.framework.tasks.prompts import LineProblem

MAX_REASON = 500


# ---------------------------------------------------------------------------------- errors
class JobInputError(ParameterError):
    """Items whose per-item ``params`` are invalid, with ``on_error="refuse"``; lists all of them."""

    def __init__(self, problems: Sequence[LineProblem]) -> None:
        self.problems = list(problems)
        n = len(self.problems)
        body = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{n} item{'s' if n != 1 else ''} with invalid params; the job did not start "
                         f"(use --on-bad-line skip to run the others):\n{body}")


class OutputFileError(ValueError):
    """The output file cannot be resumed safely (corrupt row, other settings, locked)."""


class DeadlineExceeded(StopDecoding):
    """Raised before a forward pass once the batch's item deadline or the job deadline passed."""

    def __init__(self, kind: str, limit_s: float, elapsed_s: float) -> None:
        self.kind, self.limit_s, self.elapsed_s = kind, limit_s, elapsed_s
        what = "item_timeout_s" if kind == "item" else "job_timeout_s"
        super().__init__(f"timed out: ran past {what}={limit_s:g} (stopped after {elapsed_s:.2f} s, "
                         f"at a forward-pass boundary)")


class ControllerFailure(Exception):
    """A controller's ``reset`` or ``decide`` raised (the cause is chained)."""


class ScorerFailure(Exception):
    """The lookahead (its scorers or rollouts) raised (the cause is chained)."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of CUDA, another accelerator, or the CPU allocator."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError):
        msg = str(exc).lower()
        return "out of memory" in msg or "can't allocate memory" in msg or "defaultcpuallocator" in msg
    return False


def failure_reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
