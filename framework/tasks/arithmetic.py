"""Tasks with exact answers, generated and seeded, on which parallel decoding fails measurably.

* ``addition``: ``"123+456="`` -> ``"0579"`` (the sum zero-padded to digits+1 digits, then
  ``[EOS]``); carries couple the answer digits, so committing two digits at once produces the
  classic "256GB -> 265GB" error.
* ``sorting``: ``"sort:53813="`` -> ``"13358"``; every output digit depends on the whole list.
* ``sudoku``: a 4x4 puzzle ``"1.34|..1.|....|4..."`` (``.`` = blank) -> the 16 digits of the
  solution; cells constrain each other. Puzzles have a unique solution; the scorer accepts any
  valid completion consistent with the givens (so it stays right for non-unique puzzles).
* ``pairs``: ``"usa,asia:"`` -> ``"San Francisco,Hong Kong"``; each group names three two-word
  phrases and the prompt does not say which one, so the model learns a multimodal *joint* and
  committing both words of a slot in one step can give ``"New Francisco"``
  (see :meth:`PairsTask.joint_coherence`).

Each task generates its problems from a seeded ``random.Random``; the split of a problem is fixed
by a hash of its prompt (80 % train, 10 % validation, 10 % test), so the splits are disjoint for
every seed and every ``n``. Answers shorter than ``gen_length`` are padded with ``[EOS]`` in
:meth:`Task.target_ids` (end-of-text prediction).
"""

from __future__ import annotations

import random

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.tasks.base import TASKS, Recipe, Task
from adaptive_decoding.framework.tasks.vocab import VOCAB


# ====================================================================== addition
@TASKS.register("addition", aliases=("add",))
class AdditionTask(Task):
    """Multi-digit addition a+b with fixed-width operands; carries couple the answer digits."""

    vocabulary = VOCAB
    recipe = Recipe(max_steps=2500)  # val 100 % from ~2000 steps
    model_name = "tiny-addition"
    model_description = "3-digit addition, tiny bidirectional Transformer"

    params = {
        "digits": Param(int, low=1, high=8, doc="digits of each operand"),
        "zero_pad": Param(bool, doc="write the sum with digits+1 digits (leading zero), so answer "
                                    "position k always has place value 10^(digits-k)"),
    }

    def __init__(self, digits: int = 3, zero_pad: bool = True) -> None:
        self.digits = digits
        self.zero_pad = zero_pad

    @property
    def gen_length(self) -> int:
        return self.digits + 2  # the sum (at most digits+1) and at least one [EOS]

    @property
    def max_prompt_length(self) -> int:
        return 2 * self.digits + 2

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        lo = 10 ** (self.digits - 1) if self.digits > 1 else 0
        hi = 10**self.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        answer = str(a + b).zfill(self.digits + 1) if self.zero_pad else str(a + b)
        return f"{a}+{b}=", answer, {"a": a, "b": b, "carries": _carries(a, b)}


def _carries(a: int, b: int) -> int:
    n, carry = 0, 0
    while a or b:
        carry = int(a % 10 + b % 10 + carry >= 10)
        n += carry
        a, b = a // 10, b // 10
    return n
