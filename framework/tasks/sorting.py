"""``sorting``: ``"sort:53813="`` -> ``"13358"``; every output digit depends on the whole input.
"""

from __future__ import annotations

import random

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import TASKS, Recipe, Task
from adaptive_decoding.framework.tasks.vocab import VOCAB


# ====================================================================== sorting
@TASKS.register("sorting", aliases=("sort",))
class SortingTask(Task):
    """Sort a short list of digits ascending; every output digit depends on the whole list."""

    vocabulary = VOCAB
    recipe = Recipe(max_steps=2500)  # val 100 % from ~1500 steps
    model_name = "tiny-sorting"
    model_description = "sort 4-8 digits, tiny bidirectional Transformer"

    params = {
        "min_length": Param(int, low=1, high=16, doc="shortest list"),
        "max_length": Param(int, low=1, high=16, doc="longest list (= gen_length)"),
    }

    def __init__(self, min_length: int = 4, max_length: int = 8) -> None:
        self.min_length = min_length
        self.max_length = max_length

    def check_combination(self) -> None:
        if self.min_length > self.max_length:
            raise ParameterError(
                f"sorting.min_length={self.min_length} is larger than max_length={self.max_length}"
            )

    @property
    def gen_length(self) -> int:
        return self.max_length

    @property
    def max_prompt_length(self) -> int:
        return self.max_length + 3  # "sort" ":" digits "="

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        n = rng.randint(self.min_length, self.max_length)
        digits = [rng.randrange(10) for _ in range(n)]
        return f"sort:{''.join(map(str, digits))}=", "".join(map(str, sorted(digits))), {"digits": digits}
