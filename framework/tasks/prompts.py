"""Reading a prompts JSONL file: one JSON object per line, every bad line reported by number.

A line is an object with

* ``"prompt"``: str, required, not empty or blank;
* ``"id"``: str, optional, not empty, unique in the file (default: a hash of the prompt and the
  settings, computed by :mod:`adaptive_decoding.framework.jobs`);
* ``"params"``: object, optional: per-item overrides of decoding options and controller parameters
  (the same keys as ``--set``; checked against the controller by the job before any work starts);
* ``"meta"``: object, optional: copied unchanged into the output row.

Any other field, a wrong type, bad JSON, bad UTF-8 or a duplicate id makes the line bad. Blank
lines are ignored. With ``on_error="skip"`` bad lines are returned as problems and the rest still
run; with ``on_error="refuse"`` :func:`read_prompts` raises :class:`PromptFileError` listing every
bad line, so that a job never starts on a file it would only half run.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from adaptive_decoding.framework.core.params import ParameterError

FIELDS = ("id", "prompt", "params", "meta")
ON_ERROR = ("skip", "refuse")


@dataclass
class PromptItem:
    """One prompt of a job. ``line`` is its 1-based line in the file (``None`` if built in code)."""

    prompt: str
    id: Optional[str] = None
    params: dict[str, Any] = field(default_factory=dict)
    meta: Optional[dict[str, Any]] = None
    line: Optional[int] = None


@dataclass(frozen=True)
class LineProblem:
    """Why one input line (or one item) cannot run."""

    line: Optional[int]
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}" if self.line is not None else self.reason


class PromptFileError(ParameterError):
    """The prompt file has bad lines and ``on_error="refuse"``; the message lists all of them."""

    def __init__(self, source: str, problems: list[LineProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        n = len({p.line for p in problems})
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(
            f"{source}: {n} bad line{'s' if n != 1 else ''}; the job did not start "
            f"(use --on-bad-line skip to run the other lines):\n{lines}"
        )


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_prompt_line(text: str, line: Optional[int] = None) -> tuple[Optional[PromptItem], list[str]]:
    """Parse one JSONL line into a :class:`PromptItem`, or return the reasons it is bad."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [f"not valid JSON: {exc.msg} (column {exc.colno})"]
    if not isinstance(obj, dict):
        return None, [f"expected a JSON object, got {_type_name(obj)}"]
    reasons: list[str] = []
    for key in obj:
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            hint = f"; did you mean \"{close[0]}\"?" if close else ""
            reasons.append(f"unknown field \"{key}\"{hint} allowed fields: {', '.join(FIELDS)}")
    prompt = obj.get("prompt")
    if "prompt" not in obj:
        reasons.append('missing required field "prompt"')
    elif not isinstance(prompt, str):
        reasons.append(f'"prompt" must be a string, got {_type_name(prompt)} ({_short(prompt)})')
    elif not prompt.strip():
        reasons.append('"prompt" is empty; allowed: a non-empty string')
    item_id = obj.get("id")
    if "id" in obj and (not isinstance(item_id, str) or not item_id.strip()):
        got = f"{_type_name(item_id)} ({_short(item_id)})" if not isinstance(item_id, str) else "an empty string"
        reasons.append(f'"id" must be a non-empty string, got {got}')
    for key in ("params", "meta"):
        if key in obj and not isinstance(obj[key], dict):
            reasons.append(f'"{key}" must be an object, got {_type_name(obj[key])} ({_short(obj[key])})')
    if reasons:
        return None, reasons
    return PromptItem(prompt=prompt, id=item_id, params=dict(obj.get("params") or {}),
                      meta=obj.get("meta"), line=line), []


def read_prompts(path: str | os.PathLike, on_error: str = "refuse") -> tuple[list[PromptItem], list[LineProblem]]:
    """Read a prompts JSONL file.

    Args:
        path: the file; one JSON object per line (see the module docstring for the fields).
        on_error: ``"skip"``: bad lines come back as problems, the good ones as items;
            ``"refuse"``: any bad line raises :class:`PromptFileError` listing all of them.

    Returns:
        ``(items, problems)``: items in file order; problems sorted by line.
    """
    if on_error not in ON_ERROR:
        raise ParameterError(f"on_error={on_error!r} is not allowed; allowed: one of {', '.join(map(repr, ON_ERROR))}")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt file not found: {path}")
    items: list[PromptItem] = []
    problems: list[LineProblem] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                reason = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
                problems.append(LineProblem(n, reason))
                continue
            if n == 1:
                text = text.lstrip("\ufeff")
            if not text.strip():
                continue
            item, reasons = parse_prompt_line(text, n)
            if item is not None and item.id is not None:
                if item.id in seen:
                    reasons = [f"duplicate id \"{item.id}\" (first on line {seen[item.id]})"]
                    item = None
                else:
                    seen[item.id] = n
            if item is None:
                problems.extend(LineProblem(n, r) for r in reasons)
            else:
                items.append(item)
    if problems and on_error == "refuse":
        raise PromptFileError(path, problems)
    return items, problems
