"""The code's size and style rules, checked on the code itself.

* ``ruff check`` with the project's configuration (``[tool.ruff]`` in pyproject.toml: pycodestyle
  errors, pyflakes, import order with ``framework``, ``controllers``, ``scorers`` and
  ``experiments`` first-party; line length is not checked, E501 being ignored).
* No function or method in the packages longer than :data:`MAX_FUNCTION_LINES` lines (from its
  ``def`` line to its last line, decorators excluded): a long function is split into named steps.
"""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "controllers", "scorers", "experiments")
LINTED = (*PACKAGES, "tests")
MAX_FUNCTION_LINES = 80


def _ruff() -> str | None:
    """The ruff executable: the one the ``ruff`` Python package installs, else one on PATH."""
    try:
        import ruff

        return ruff.find_ruff_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("ruff")


def long_functions(source: str, limit: int) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of every function in ``source`` longer than ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return found


def test_ruff_check_passes():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install ruff, or the project's dev extra)")
    done = subprocess.run([ruff, "check", "--no-cache", *LINTED], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_no_function_is_longer_than_the_limit():
    too_long = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
                for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
                for name, line, length in long_functions(path.read_text(encoding="utf-8"),
                                                         MAX_FUNCTION_LINES)]
    assert too_long == []


def test_long_function_finder_measures_def_to_last_line():
    """The checker itself: a 5-line function is over a limit of 4, not over 5; nested ones count."""
    source = "def f(x):\n    y = x\n    def g():\n        return y\n    return g\n"
    assert long_functions(source, 4) == [("f", 1, 5)]
    assert long_functions(source, 1) == [("f", 1, 5), ("g", 3, 2)]
    assert long_functions(source, 5) == []
