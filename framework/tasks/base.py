"""The task contract (:class:`Task`, :class:`Example`), seeded disjoint splits and the ``TASKS``
registry.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Optional

from framework.core.params import Configurable, Param
from framework.core.registry import Registry
from framework.tasks.vocab import TaskTokenizer, get_tokenizer

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

    A task is a :class:`~framework.core.params.Configurable`: its size knobs (``digits``, ``max_blanks``)
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
            drawn = self._sample_for(split, rng)
            if drawn is not None and self.split_of(drawn[0]) == split:
                yield self._example(*drawn)

    def _sample_for(self, split: str, rng: random.Random) -> Optional[tuple[str, str, dict]]:
        """One draw for ``split`` (``None`` = rejected, draw again); by default :meth:`_sample`. A task
        whose training examples are drawn differently, or whose test examples are filtered, overrides it."""
        return self._sample(rng)

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


#: the modules whose decorators register the built-in tasks (imported on first lookup)
BUILTIN_TASK_MODULES = tuple(f"framework.tasks.{m}" for m in ("arithmetic", "sorting", "sudoku", "sudoku9", "pairs", "text", "data", "lm_eval_task"))

TASKS: Registry[Task] = Registry("task", base=Task, entry_point_group="adaptive_decoding.tasks",
                                 builtin_modules=BUILTIN_TASK_MODULES)


def get_task(name: str, **params: Any) -> Task:
    """A validated task instance by registered name (unknown names list the known ones)."""
    return TASKS.get(name).build(**params)  # type: ignore[return-value]
