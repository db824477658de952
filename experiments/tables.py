"""The one number formatter and the one markdown table writer of the reports and command-line tables.

:func:`figure` writes a number with a fixed count of decimals (signed on request) and an en dash for
a missing or non-finite one; :func:`markdown_table` writes a header, its rule and one row per list
of cells, a ``|`` inside a cell escaped so that the table keeps its columns.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

MISSING = "–"


def figure(value: Any, digits: int = 3, signed: bool = False) -> str:
    """``value`` with ``digits`` decimals (``+`` before a positive one when ``signed``), or
    :data:`MISSING` when it is ``None``, not a number (a bool is none) or not finite."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return MISSING
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def markdown_row(cells: Iterable[Any]) -> str:
    """One table row; a cell is written with ``str`` and its ``|`` escaped."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a markdown table: ``head``, the rule under it, then one line per row."""
    return [markdown_row(head), "|" + "---|" * len(head), *(markdown_row(r) for r in rows)]
