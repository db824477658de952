"""Short-answer metrics: ``exact`` match, ``regex`` extraction then match, multiple-``choice`` letters."""

from __future__ import annotations

import re
from typing import ClassVar

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics.base import METRICS, Metric, fold_space


@METRICS.register("exact")
class ExactMatch(Metric):
    """Exact match of the output and the answer, whitespace folded."""

    figures = ("exact_match",)
    params: ClassVar[dict[str, Param]] = {
        "ignore_case": Param(bool, doc="compare case-insensitively"),
    }

    def __init__(self, ignore_case: bool = False) -> None:
        self.ignore_case = ignore_case

    def score(self, output: str, example: Example) -> float:
        out, ans = fold_space(output), fold_space(example.answer)
        if self.ignore_case:
            out, ans = out.lower(), ans.lower()
        return float(out == ans)


def regex_capture(regex: re.Pattern, text: str, group_select: int) -> str | None:
    """lm-eval's ``regex`` filter: the ``group_select``-th match of ``regex.findall(text)``; for a
    pattern with several groups its first non-empty group; stripped. ``None`` when nothing matches
    (or ``group_select`` is past the matches)."""
    found = regex.findall(text)
    if not found or not -len(found) <= group_select < len(found):
        return None
    match = found[group_select]
    if isinstance(match, tuple):
        match = next((m for m in match if m), None)
        if match is None:
            return None
    return match.strip()


@METRICS.register("regex")
class RegexMatch(Metric):
    """Exact match of the answer and the output's capture of a regular expression."""

    figures = ("exact_match",)
    params: ClassVar[dict[str, Param]] = {
        "pattern": Param(str, doc="regular expression; its first group (or the whole match) is the prediction"),
        "group_select": Param(int, doc="which match counts: 0 the first, -1 the last (lm-eval's group_select)"),
        "ignore_case": Param(bool, doc="compare (not match) case-insensitively"),
    }

    def __init__(self, pattern: str = "", group_select: int = -1, ignore_case: bool = False) -> None:
        self.pattern = pattern
        self.group_select = group_select
        self.ignore_case = ignore_case

    def check_combination(self) -> None:
        super().check_combination()
        if not self.pattern:
            raise ParameterError("regex.pattern is required (a regular expression whose first group is the answer)")
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ParameterError(f"regex.pattern={self.pattern!r} is not a valid regular expression: {exc}") from None

    def score(self, output: str, example: Example) -> float:
        got = regex_capture(re.compile(self.pattern), output, self.group_select)
        if got is None:
            return 0.0
        got, ans = fold_space(got), fold_space(example.answer)
        if self.ignore_case:
            got, ans = got.lower(), ans.lower()
        return float(got == ans)


def committed_letter(text: str, letters: str) -> str | None:
    """The option letter ``text`` commits to, or ``None``. Markdown emphasis (``*``, `````) is
    dropped first; then, in order: the last "answer/option/choice (is|:) X" phrase ("The answer is
    (B)"), a bare letter as the whole text ("B.", "(B)", "**B**"), a leading "B." / "(B)" / "B)" /
    "B:", the last parenthesised "(B)". Letters are upper-case and matched case-sensitively."""
    t, x = re.sub(r"[*`]", "", text), f"([{re.escape(letters)}])"
    patterns = (
        rf"(?i:\b(?:answer|option|choice)\b(?:\s+is)?)\s*[:=-]?\s*(?i:(?:option|choice)\s+)?[\(\[]?{x}(?![\w'])",
        rf"^\s*[\(\[]?{x}[\)\]]?[.:]?\s*$",
        rf"^\s*[\(\[]?{x}(?:[\)\].:]|\s*\n)",
        rf"\({x}\)",
    )
    for pattern in patterns:
        found = re.findall(pattern, t)
        if found:
            return found[-1]
    return None


@METRICS.register("choice")
class ChoiceMatch(Metric):
    """Multiple choice: the letter the output commits to equals the answer's letter."""

    figures = ("accuracy",)
    params: ClassVar[dict[str, Param]] = {
        "letters": Param(str, doc="the option letters, upper-case (default A to J)"),
    }

    def __init__(self, letters: str = "ABCDEFGHIJ") -> None:
        self.letters = letters

    def check_combination(self) -> None:
        super().check_combination()
        if not re.fullmatch(r"[A-Z]+", self.letters) or len(set(self.letters)) != len(self.letters):
            raise ParameterError(f"choice.letters={self.letters!r} is not allowed; allowed: distinct "
                                 f"upper-case letters A-Z, e.g. 'ABCD'")

    def score(self, output: str, example: Example) -> float:
        gold = committed_letter(example.answer, self.letters)
        if gold is None:
            raise ValueError(f"choice: the answer {example.answer!r} of example {example.id!r} is not one of "
                             f"the letters {self.letters!r} (write it as 'B' or '(B)')")
        return float(committed_letter(output, self.letters) == gold)
