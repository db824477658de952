"""``compliance``: penalties for banned phrases and for numbers miscopied from the prompt.

Two kinds of violation are counted in a candidate's text:

* a **banned phrase**: an entry of the lexicon ``banned`` (default: absolute advertising claims
  such as "the cheapest", "最便宜") or a match of a regular expression in ``patterns``;
  ASCII phrases match on word boundaries, case-insensitively unless ``case_sensitive``;
* a **miscopied number**: a number of the candidate that is not one of the numbers it must copy
  but is a near miss of one: the same digits in another order (256GB → 265GB) or, for two or
  more digits, one digit changed (256 → 257). The numbers to copy are those of the prompt
  (``numbers="prompt"``), those listed in the task meta's ``copy_numbers`` (``numbers="meta"``),
  or none (``numbers="off"``, e.g. for arithmetic, where the answer differs on purpose).

``s = −(1 − decay^v)`` for v violations: 0 when clean, −0.5 for one at ``decay=0.5``, → −1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.scorer import SCORERS, Candidates, Scorer, ScoringContext

DEFAULT_BANNED = (
    "the cheapest", "cheapest ever", "the best", "the lowest price", "number one", "guaranteed",
    "最便宜", "最低价", "最好", "最佳", "第一",
)
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


@dataclass(frozen=True)
class Violation:
    start: int
    end: int
    kind: str  # "banned" or "number"
    text: str


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [p for p in (s.strip() for s in value.split("|")) if p]
    return [str(p) for p in value]


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def near_miss(number: str, target: str) -> bool:
    """``number`` (digits) differs from ``target`` but is a permutation or one-digit edit of it."""
    if number == target or len(number) != len(target) or len(number) < 2:
        return False
    if sorted(number) == sorted(target):
        return True
    return sum(a != b for a, b in zip(number, target)) == 1


@SCORERS.register("compliance")
class Compliance(Scorer):
    """Penalty for banned phrases and for near-miss copies of numbers the answer must copy."""

    needs_text = True
    params = {
        "banned": Param(tuple, doc="banned phrases: a list, or one string separated by '|'"),
        "patterns": Param(tuple, doc="banned regular expressions: a list, or one string separated by '|'"),
        "case_sensitive": Param(bool, doc="match phrases and patterns case-sensitively"),
        "numbers": Param(str, choices=("prompt", "meta", "off"), doc="where the numbers to copy come from"),
        "decay": Param(float, low=0.0, high=1.0, low_exclusive=True, doc="score = −(1 − decay^violations)"),
    }

    def __init__(
        self,
        banned: Sequence[str] | str = DEFAULT_BANNED,
        patterns: Sequence[str] | str = (),
        case_sensitive: bool = False,
        numbers: str = "prompt",
        decay: float = 0.5,
    ) -> None:
        self.banned = banned
        self.patterns = patterns
        self.case_sensitive = case_sensitive
        self.numbers = numbers
        self.decay = decay

    def check_combination(self) -> None:
        for name in ("banned", "patterns"):
            value = getattr(self, name)
            if not (value is None or isinstance(value, str)
                    or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))):
                raise ParameterError(
                    f"compliance.{name}={value!r} is not allowed; allowed: a list of strings or one "
                    f"string separated by '|'"
                )
        self._compiled()

    def _compiled(self) -> list[re.Pattern]:
        key = (tuple(_as_list(self.banned)), tuple(_as_list(self.patterns)), bool(self.case_sensitive))
        if getattr(self, "_cache_key", None) != key:
            flags = 0 if self.case_sensitive else re.IGNORECASE
            regs = []
            for phrase in key[0]:
                body = re.escape(phrase)
                if phrase.isascii():
                    body = rf"(?<!\w){body}(?!\w)"
                regs.append(re.compile(body, flags))
            for pat in key[1]:
                try:
                    regs.append(re.compile(pat, flags))
                except re.error as exc:
                    raise ParameterError(
                        f"compliance.patterns: {pat!r} is not a valid regular expression ({exc})"
                    ) from None
            self._cache_key, self._regs = key, regs
        return self._regs

    def copy_targets(self, prompt: str, meta: dict[str, Any]) -> list[str]:
        """Digit strings the candidate must copy exactly."""
        if self.numbers == "off":
            return []
        if self.numbers == "meta":
            return [d for d in (_digits(str(v)) for v in meta.get("copy_numbers", ()) or ()) if d]
        return [_digits(m.group()) for m in NUMBER.finditer(prompt)]

    def violations(self, text: str, prompt: str = "", meta: dict[str, Any] | None = None) -> list[Violation]:
        """Every violation in ``text`` with its character span."""
        out = []
        for reg in self._compiled():
            out.extend(Violation(m.start(), m.end(), "banned", m.group()) for m in reg.finditer(text) if m.end() > m.start())
        targets = self.copy_targets(prompt, meta or {})
        if targets:
            exact = set(targets)
            for m in NUMBER.finditer(text):
                d = _digits(m.group())
                if d not in exact and any(near_miss(d, t) for t in targets):
                    out.append(Violation(m.start(), m.end(), "number", m.group()))
        return sorted(out, key=lambda v: (v.start, v.end))

    def count(self, texts: Iterable[str], prompts: Iterable[str], metas: Iterable[dict]) -> torch.Tensor:
        return torch.tensor([float(len(self.violations(t, p, m))) for t, p, m in zip(texts, prompts, metas)])

    def _score(self, c: Candidates, context: ScoringContext) -> torch.Tensor:
        texts = context.candidate_texts(c)
        prompts = context.prompt_texts(c)
        metas = [context.meta_for(s) for s in c.source.tolist()]
        v = self.count(texts, prompts, metas)
        return -(1.0 - torch.pow(torch.tensor(float(self.decay)), v))
