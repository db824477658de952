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

import hashlib
import itertools
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, Iterator, Optional

from .params import Configurable, Param, ParameterError
from .registry import Registry
from .vocab import TaskTokenizer, get_tokenizer

SPLITS: tuple[str, ...] = ("train", "validation", "test")
#: cumulative bucket bounds (out of 1000) of the train / validation / test splits
_SPLIT_BOUNDS = {"train": (0, 800), "validation": (800, 900), "test": (900, 1000)}


@dataclass(frozen=True)
class Example:
    """One problem: ``prompt`` text, exact ``answer`` text, task-specific ``meta``."""

    id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class Task(Configurable):
    """Base of every task. Subclasses implement :meth:`_sample` and the length properties.

    A task is a :class:`~framework.params.Configurable`: its size knobs (``digits``, ``max_blanks``)
    are validated keyword parameters, so ``get_task("addition", digits=4)`` is a different task.
    """

    params: ClassVar[dict[str, Param]] = {}
    #: what :meth:`score` measures, one line for ``adec list tasks``
    metric: ClassVar[str] = "exact match"

    # ------------------------------------------------------------------ to implement
    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:  # pragma: no cover
        """One ``(prompt, answer, meta)`` drawn from ``rng``, ignoring splits."""
        raise NotImplementedError

    @property
    def gen_length(self) -> int:  # pragma: no cover
        """Answer slot length G (answers are padded with ``[EOS]`` to it)."""
        raise NotImplementedError

    @property
    def max_prompt_length(self) -> int:  # pragma: no cover
        """Longest prompt in tokens."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared API
    @property
    def name(self) -> str:
        return self.display_name()

    @property
    def default_block_length(self) -> int:
        """Semi-autoregressive block length the benchmarks use by default (``gen_length``)."""
        return self.gen_length

    @property
    def canvas_length(self) -> int:
        """Longest canvas ``prompt + gen_length`` in tokens."""
        return self.max_prompt_length + self.gen_length

    @property
    def tokenizer(self) -> TaskTokenizer:
        return get_tokenizer()

    def describe(self) -> str:
        return (type(self).__doc__ or "").strip().splitlines()[0]

    def split_of(self, prompt: str) -> str:
        """The split a prompt belongs to (a hash of the task name and the prompt)."""
        digest = hashlib.sha256(f"{self.name}\x00{prompt}".encode()).digest()
        bucket = int.from_bytes(digest[:4], "big") % 1000
        for split, (lo, hi) in _SPLIT_BOUNDS.items():
            if lo <= bucket < hi:
                return split
        raise AssertionError(bucket)  # pragma: no cover

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} for task {self.name!r}; allowed: {', '.join(SPLITS)}")

    def _example(self, prompt: str, answer: str, meta: dict) -> Example:
        digest = hashlib.sha256(f"{prompt}\x00{answer}".encode()).hexdigest()[:12]
        return Example(id=f"{self.name}-{digest}", prompt=prompt, answer=answer, meta=meta)

    def iter_examples(self, split: str, seed: int = 0) -> Iterator[Example]:
        """Endless stream of examples of ``split`` (repeats possible), deterministic in ``seed``."""
        self._check_split(split)
        self.validate()
        rng = random.Random(f"{self.name}|{sorted(self.get_params().items())}|{split}|{seed}")
        while True:
            prompt, answer, meta = self._sample(rng)
            if self.split_of(prompt) == split:
                yield self._example(prompt, answer, meta)

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """``n`` distinct examples of ``split`` (train, validation or test), deterministic in ``seed``."""
        self._check_split(split)
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n={n!r} must be a non-negative integer")
        out: list[Example] = []
        seen: set[tuple[str, str]] = set()
        attempts, limit = 0, 50 * n + 10_000
        for ex in self.iter_examples(split, seed):
            if len(out) >= n:
                break
            attempts += 1
            if attempts > limit:
                raise ValueError(
                    f"task {self.name!r} has fewer than n={n} distinct {split} examples "
                    f"(found {len(out)}); ask for fewer"
                )
            key = (ex.prompt, ex.answer)
            if key not in seen:
                seen.add(key)
                out.append(ex)
        return out

    def prompt_ids(self, example: Example) -> list[int]:
        return self.tokenizer.encode(example.prompt)

    def target_ids(self, example: Example) -> list[int]:
        """Answer ids padded with ``[EOS]`` to ``gen_length``."""
        ids = self.tokenizer.encode(example.answer)
        if len(ids) > self.gen_length:
            raise ValueError(
                f"answer {example.answer!r} has {len(ids)} tokens, more than gen_length={self.gen_length}"
            )
        return ids + [self.tokenizer.eos_token_id] * (self.gen_length - len(ids))

    def score(self, example: Example, output_text: str) -> float:
        """1.0 if ``output_text`` (decoded up to the first EOS) is exactly the answer, else 0.0."""
        return float(_norm(output_text) == example.answer)

    def score_ids(self, example: Example, generated_ids: Any) -> float:
        """:meth:`score` of generated token ids (decoded up to the first EOS)."""
        return self.score(example, self.tokenizer.decode(generated_ids, stop_at_eos=True))


def _norm(text: str) -> str:
    return " ".join(text.split())


TASKS: Registry[Task] = Registry("task", base=Task, entry_point_group="adaptive_decoding.tasks",
                                 builtin_modules=("framework.text",))


def get_task(name: str, **params: Any) -> Task:
    """A validated task instance by registered name (unknown names list the known ones)."""
    return TASKS.get(name).build(**params)  # type: ignore[return-value]


# ====================================================================== addition
@TASKS.register("addition", aliases=("add",))
class AdditionTask(Task):
    """Multi-digit addition a+b with fixed-width operands; carries couple the answer digits."""

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


# ====================================================================== sorting
@TASKS.register("sorting", aliases=("sort",))
class SortingTask(Task):
    """Sort a short list of digits ascending; every output digit depends on the whole list."""

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


# ====================================================================== sudoku
@lru_cache(maxsize=1)
def sudoku_solutions() -> tuple[tuple[int, ...], ...]:
    """All 288 valid 4x4 Sudoku grids (row-major, digits 1-4)."""
    perms = list(itertools.permutations(range(1, 5)))
    out = []

    def ok(rows: list[tuple[int, ...]]) -> bool:
        r = len(rows)
        for c in range(4):
            col = [row[c] for row in rows]
            if len(set(col)) != r:
                return False
        if r % 2 == 0:
            for bc in (0, 2):
                box = rows[r - 2][bc : bc + 2] + rows[r - 1][bc : bc + 2]
                if len(set(box)) != 4:
                    return False
        return True

    def extend(rows: list[tuple[int, ...]]) -> None:
        if len(rows) == 4:
            out.append(tuple(v for row in rows for v in row))
            return
        for p in perms:
            if ok(rows + [p]):
                extend(rows + [p])

    extend([])
    return tuple(out)


def sudoku_valid(grid: list[int]) -> bool:
    """Whether 16 digits form a valid 4x4 Sudoku (rows, columns, 2x2 boxes are permutations of 1-4)."""
    if len(grid) != 16 or any(v not in (1, 2, 3, 4) for v in grid):
        return False
    units = [[r * 4 + c for c in range(4)] for r in range(4)]
    units += [[r * 4 + c for r in range(4)] for c in range(4)]
    units += [[(br + dr) * 4 + bc + dc for dr in (0, 1) for dc in (0, 1)] for br in (0, 2) for bc in (0, 2)]
    return all(len({grid[i] for i in u}) == 4 for u in units)


@lru_cache(maxsize=1)
def _agreement_masks() -> tuple[tuple[int, ...], ...]:
    """``masks[j][k]``: bit ``i`` set where solutions ``j`` and ``k`` agree at cell ``i``."""
    sols = sudoku_solutions()
    return tuple(tuple(sum(1 << i for i in range(16) if a[i] == b[i]) for b in sols) for a in sols)


def sudoku_completions(givens: dict[int, int]) -> list[tuple[int, ...]]:
    """Every valid grid consistent with ``givens`` (cell index -> digit)."""
    return [s for s in sudoku_solutions() if all(s[int(i)] == int(v) for i, v in givens.items())]


@TASKS.register("sudoku")
class SudokuTask(Task):
    """4x4 Sudoku with a unique solution; any valid completion consistent with the givens scores 1."""

    metric = "valid completion"
    params = {
        "min_blanks": Param(int, low=1, high=12, doc="fewest blank cells"),
        "max_blanks": Param(int, low=1, high=12, doc="most blank cells (fewer if uniqueness needs it)"),
    }

    def __init__(self, min_blanks: int = 8, max_blanks: int = 12) -> None:
        self.min_blanks = min_blanks
        self.max_blanks = max_blanks

    def check_combination(self) -> None:
        if self.min_blanks > self.max_blanks:
            raise ParameterError(
                f"sudoku.min_blanks={self.min_blanks} is larger than max_blanks={self.max_blanks}"
            )

    @property
    def gen_length(self) -> int:
        return 16

    @property
    def max_prompt_length(self) -> int:
        return 20  # 16 cells, 3 '|', '='

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        sols = sudoku_solutions()
        j = rng.randrange(len(sols))
        sol = sols[j]
        target = rng.randint(self.min_blanks, self.max_blanks)
        agree = _agreement_masks()[j]  # bit i of agree[k]: solution k equals sol at cell i
        givens = (1 << 16) - 1
        order = list(range(16))
        rng.shuffle(order)
        blanks: list[int] = []
        for cell in order:
            if len(blanks) >= target:
                break
            trial = givens & ~(1 << cell)
            if sum(1 for m in agree if m & trial == trial) == 1:  # still a unique solution
                givens = trial
                blanks.append(cell)
        cells = [str(sol[i]) if givens >> i & 1 else "." for i in range(16)]
        prompt = "|".join("".join(cells[r * 4 : r * 4 + 4]) for r in range(4)) + "="
        return prompt, "".join(map(str, sol)), {"givens": {i: sol[i] for i in range(16) if givens >> i & 1},
                                                 "blanks": sorted(blanks)}

    @staticmethod
    def parse_givens(prompt: str) -> dict[int, int]:
        cells = [c for c in prompt if c in "1234."]
        if len(cells) != 16:
            raise ValueError(f"sudoku prompt {prompt!r} does not have 16 cells")
        return {i: int(c) for i, c in enumerate(cells) if c != "."}

    def score(self, example: Example, output_text: str) -> float:
        text = _norm(output_text).replace("|", "")
        if len(text) != 16 or not text.isdigit():
            return 0.0
        grid = [int(c) for c in text]
        givens = example.meta.get("givens") or self.parse_givens(example.prompt)
        if any(grid[int(i)] != int(v) for i, v in givens.items()):
            return 0.0
        return float(sudoku_valid(grid))


# ====================================================================== pairs
#: group word -> its three two-word phrases; within a group no first or second word repeats, so a
#: first word from one phrase and a second from another is always an incoherent ("New Francisco")
PAIR_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "usa": (("New", "York"), ("San", "Francisco"), ("Los", "Angeles")),
    "asia": (("Hong", "Kong"), ("New", "Delhi"), ("Kuala", "Lumpur")),
    "west": (("San", "Diego"), ("Las", "Vegas"), ("Santa", "Fe")),
    "south": (("New", "Orleans"), ("San", "Antonio"), ("El", "Paso")),
    "world": (("Buenos", "Aires"), ("Tel", "Aviv"), ("Cape", "Town")),
    "coast": (("San", "Jose"), ("Santa", "Cruz"), ("Long", "Beach")),
}


@TASKS.register("pairs", aliases=("paired_phrases",))
class PairsTask(Task):
    """Paired phrases: each prompt group admits three two-word phrases, right only as a pair."""

    metric = "every slot a valid pair"
    params = {
        "min_groups": Param(int, low=1, high=4, doc="fewest phrase slots per answer"),
        "max_groups": Param(int, low=1, high=4, doc="most phrase slots per answer"),
    }

    def __init__(self, min_groups: int = 1, max_groups: int = 4) -> None:
        self.min_groups = min_groups
        self.max_groups = max_groups

    def check_combination(self) -> None:
        if self.min_groups > self.max_groups:
            raise ParameterError(
                f"pairs.min_groups={self.min_groups} is larger than max_groups={self.max_groups}"
            )

    @property
    def gen_length(self) -> int:
        return 3 * self.max_groups - 1  # two words per slot, commas between

    @property
    def max_prompt_length(self) -> int:
        return 2 * self.max_groups  # group words, commas, ':'

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        k = rng.randint(self.min_groups, self.max_groups)
        groups = [rng.choice(sorted(PAIR_GROUPS)) for _ in range(k)]
        chosen = [rng.randrange(3) for _ in groups]
        answer = ",".join(" ".join(PAIR_GROUPS[g][c]) for g, c in zip(groups, chosen))
        return ",".join(groups) + ":", answer, {"groups": groups, "choices": chosen}

    @staticmethod
    def groups_of(example: Example) -> list[str]:
        return list(example.meta.get("groups") or example.prompt.rstrip(":").split(","))

    def _slots(self, output_text: str) -> list[tuple[str, ...]]:
        return [tuple(part.split()) for part in _norm(output_text).split(",")]

    def score(self, example: Example, output_text: str) -> float:
        """1.0 if the output has one valid phrase of its group per slot, in order."""
        c = self.joint_coherence(example, output_text)
        return float(c["valid"] == c["slots"] and c["extra"] == 0)

    def joint_coherence(self, example: Example, output_text: str) -> dict[str, int]:
        """Counts over the answer's slots: ``valid`` phrases, ``incoherent`` mixes of two valid phrases
        (a first word of one phrase, the second of another: "New Francisco"), ``other`` wrong slots,
        ``extra`` slots beyond the prompt's groups."""
        groups = self.groups_of(example)
        slots = self._slots(output_text)
        valid = incoherent = other = 0
        for i, group in enumerate(groups):
            phrases = PAIR_GROUPS[group]
            got = slots[i] if i < len(slots) else ()
            if got in phrases:
                valid += 1
            elif len(got) == 2 and got[0] in {p[0] for p in phrases} and got[1] in {p[1] for p in phrases}:
                incoherent += 1
            else:
                other += 1
        return {"slots": len(groups), "valid": valid, "incoherent": incoherent, "other": other,
                "extra": max(0, len(slots) - len(groups))}
