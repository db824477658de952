"""``gsm8k``: lm-evaluation-harness's GSM8K scoring (``lm_eval/tasks/gsm8k/gsm8k.yaml``, v3.0).

Two filters extract the prediction from the output, as lm-eval's ``regex`` filter followed by
``take_first``:

* ``strict-match``      ``#### (\\-?[0-9\\.\\,]+)``, the first match (group_select 0);
* ``flexible-extract``  ``(-?[$0-9.,]{2,})|(-?[0-9]+)``, the last match (group_select -1).

No match gives lm-eval's fallback ``[invalid]``. Each prediction is then compared with the answer
by lm-eval's ``exact_match`` with the task's settings: ``regexes_to_ignore`` ``,`` ``\\$``
``(?s).*#### `` ``\\.$`` removed from both sides in that order, ``ignore_case`` true,
``ignore_punctuation`` false. The answer may be the bare number or GSM8K's whole solution ending
in ``#### N`` (the ``(?s).*#### `` rule strips the reasoning). The headline is flexible-extract,
as lm-eval reports it first for the task.
"""

from __future__ import annotations

import re
from typing import ClassVar

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics.answers import regex_capture
from adaptive_decoding.framework.tasks.metrics.base import METRICS, Metric

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
FALLBACK = "[invalid]"
REGEXES_TO_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


def normalise(text: str) -> str:
    """lm-eval's ``exact_match`` preprocessing with gsm8k's settings (numpy's string equality also
    ignores trailing NUL characters, kept here so the comparison is the same)."""
    for pattern in REGEXES_TO_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower().rstrip("\x00")


@METRICS.register("gsm8k")
class GSM8K(Metric):
    """GSM8K final number: lm-eval's flexible-extract (headline) and strict-match exact match."""

    figures = ("flexible-extract", "strict-match")
    params: ClassVar[dict[str, Param]] = {}

    def __init__(self) -> None:
        pass

    @staticmethod
    def extract(output: str) -> dict[str, str]:
        """The prediction each filter takes from ``output`` (``[invalid]`` where none matches)."""
        flexible, strict = regex_capture(FLEXIBLE, output, -1), regex_capture(STRICT, output, 0)
        return {"flexible-extract": FALLBACK if flexible is None else flexible,
                "strict-match": FALLBACK if strict is None else strict}

    def scores(self, output: str, example: Example) -> dict[str, float]:
        gold = normalise(example.answer)
        return {name: float(normalise(pred) == gold) for name, pred in self.extract(output).items()}

    def score(self, output: str, example: Example) -> float:
        return self.scores(output, example)[self.figures[0]]
