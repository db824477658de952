"""Wrappers that turn a model's, controller's or lookahead's failure into a job fault: deadlines,
guarded calls.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from framework.engine.controller import Controller, DecodeState
from framework.jobs.errors import (
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


class GuardedController:
    """Delegates to a controller; its exceptions become :class:`ControllerFailure`."""

    def __init__(self, inner: Controller, name: str) -> None:
        self._inner, self._name = inner, name

    def reset(self, state: DecodeState) -> None:
        try:
            self._inner.reset(state)
        except Exception as exc:  # noqa: BLE001 - any controller bug must not kill the job
            if _passthrough(exc):
                raise
            raise ControllerFailure(f"controller {self._name!r} raised in reset: {failure_reason(exc)}") from exc

    def decide(self, features: Any, state: DecodeState) -> Any:
        try:
            return self._inner.decide(features, state)
        except Exception as exc:  # noqa: BLE001
            if _passthrough(exc):
                raise
            raise ControllerFailure(f"controller {self._name!r} raised: {failure_reason(exc)}") from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class GuardedLookahead:
    """Delegates to a lookahead; its exceptions become :class:`ScorerFailure`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def refine(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._inner.refine(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            if _passthrough(exc):
                raise
            raise ScorerFailure(f"lookahead/scorer raised: {failure_reason(exc)}") from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
