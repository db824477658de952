"""``math``: mathematical equivalence through Hugging Face's ``math-verify`` (no hand-written normaliser)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics.base import METRICS, Metric


def as_gold(answer: str) -> str:
    """The answer as math-verify reads a gold best: bare LaTeX or a number goes inside ``\\boxed{}``;
    an answer that already has a ``\\boxed{}`` or ``$`` delimiters is kept as it is."""
    text = answer.strip()
    return text if ("\\boxed" in text or "$" in text) else "\\boxed{" + text + "}"


@METRICS.register("math")
class MathVerify(Metric):
    """Math answer equivalence by math-verify: the output's boxed (else last) answer versus the answer."""

    figures = ("math_verify",)
    requires = ("math_verify",)
    params: ClassVar[dict[str, Param]] = {
        "timeout": Param(int, low=0, high=600,
                         doc="seconds allowed to parse or verify (0 = no limit; the limit uses SIGALRM, "
                             "so it applies in the main thread only)"),
    }

    def __init__(self, timeout: int = 5) -> None:
        self.timeout = timeout

    def seconds(self) -> int | None:
        """The timeout math-verify gets: ``None`` off the main thread, where SIGALRM cannot be set."""
        on_main = threading.current_thread() is threading.main_thread()
        return self.timeout if (self.timeout and on_main) else None

    def parsed(self, text: str) -> list[Any]:
        """math-verify's ``parse`` with its default LaTeX-then-expression extraction (boxed first)."""
        from math_verify import parse

        return parse(text, parsing_timeout=self.seconds())

    def score(self, output: str, example: Example) -> float:
        from math_verify import verify

        gold, pred = self.parsed(as_gold(example.answer)), self.parsed(output)
        if not gold or not pred:
            return 0.0
        return float(verify(gold, pred, timeout_seconds=self.seconds()))
