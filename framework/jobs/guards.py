"""What turns a model's, controller's or lookahead's failure into a job fault: the deadline checked
before every forward (:class:`DeadlineModel`) and the guarded decode call (:func:`guarded_decode`).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from adaptive_decoding.framework.engine.controller import Controller
from adaptive_decoding.framework.engine.loop import DecodeResult, decode
from adaptive_decoding.framework.jobs.errors import (
    ControllerFailure,
    DeadlineExceeded,
    ScorerFailure,
    failure_reason,
    is_oom,
)


# ---------------------------------------------------------------------------------- guards
class DeadlineModel:
    """The denoiser, checking the deadlines before every forward pass (steps and rollouts)."""

    def __init__(self, inner: Any, started: float, item_limit: Optional[float], job_deadline: Optional[float],
                 job_limit: Optional[float], job_started: float) -> None:
        self._inner, self._started, self._item_limit = inner, started, item_limit
        self._job_deadline, self._job_limit, self._job_started = job_deadline, job_limit, job_started

    #: the windowed model's forwards (the engine calls these instead of the plain protocol)
    FORWARDS = ("window_logits", "shadow_window_logits", "shadow_logits", "full_logits", "core")

    def _check(self) -> None:
        now = time.monotonic()
        if self._job_deadline is not None and now >= self._job_deadline:
            raise DeadlineExceeded("job", float(self._job_limit), now - self._job_started)
        if self._item_limit is not None and now - self._started >= self._item_limit:
            raise DeadlineExceeded("item", self._item_limit, now - self._started)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self._inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in self.FORWARDS and callable(attr):
            def checked(*args: Any, **kwargs: Any) -> Any:
                self._check()
                return attr(*args, **kwargs)

            return checked
        return attr


def _passthrough(exc: BaseException) -> bool:
    return isinstance(exc, (DeadlineExceeded, ControllerFailure, ScorerFailure)) or is_oom(exc)


def failing_part(exc: BaseException, controller: Any, lookahead: Any = None) -> tuple[Optional[str], str]:
    """Which part of a decode raised ``exc``: ``("controller", method)`` when the innermost frame of
    its traceback that belongs to ``controller`` or ``lookahead`` (a frame whose ``self`` is that
    object) is the controller's, ``method`` being the contract method the loop called (``reset``,
    ``decide``); ``("lookahead", "refine")`` when it is the lookahead's; ``(None, "")`` otherwise
    (the model, the loop, the input)."""
    parts: list[tuple[str, str]] = []
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and owner is controller:
            parts.append(("controller", tb.tb_frame.f_code.co_name))
        elif owner is not None and lookahead is not None and owner is lookahead:
            parts.append(("lookahead", tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    if not parts:
        return None, ""
    part = parts[-1][0]
    first = len(parts) - 1
    while first > 0 and parts[first - 1][0] == part:  # the outermost frame of the innermost run: the call
        first -= 1
    return part, parts[first][1]


def guarded_decode(model: Any, prompts: Any, controller: Controller, config: Any, *, name: str,
                   lookahead: Any = None, **kwargs: Any) -> DecodeResult:
    """:func:`~adaptive_decoding.framework.engine.loop.decode` with the job's failure classes: an exception raised in a
    method of ``controller`` (its ``reset`` or ``decide``, nested controllers included) becomes
    :class:`ControllerFailure` naming the controller ``name``, one raised in ``lookahead`` (its
    rollouts or scorers) :class:`ScorerFailure`; deadlines, out-of-memory errors and anything
    raised elsewhere propagate unchanged. The controller and lookahead are passed to the loop as
    they are: the guard wraps the call, not the parts (:func:`failing_part` finds which part raised)."""
    try:
        return decode(model, prompts, controller, config, lookahead=lookahead, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any controller or scorer bug must not kill the job
        if _passthrough(exc):
            raise
        part, method = failing_part(exc, controller, lookahead)
        if part == "controller":
            where = " in reset" if method == "reset" else ""
            raise ControllerFailure(f"controller {name!r} raised{where}: {failure_reason(exc)}") from exc
        if part == "lookahead":
            raise ScorerFailure(f"lookahead/scorer raised: {failure_reason(exc)}") from exc
        raise
