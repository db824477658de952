"""Every registered task passes the task conformance suite (small n, so it stays fast)."""

from __future__ import annotations

import random

import pytest

from framework.tasks.base import TASKS, Task
from framework.testing.task_conformance import check_task, registered_tasks, task_checks


@pytest.mark.parametrize("name", registered_tasks())
def test_registered_task_conforms(name):
    for check_name, check in task_checks(name, n=4 if name == "sudoku9" else 6):
        check()


class _LeakyTask(Task):
    """A broken task: the split is not decided by the prompt, so splits share prompts."""

    vocabulary = TASKS.get("addition").vocabulary

    @property
    def gen_length(self) -> int:
        return 2

    @property
    def max_prompt_length(self) -> int:
        return 2

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:
        return f"{rng.randrange(3)}=", "1", {}

    def split_of(self, prompt: str) -> str:
        return "train"

    def iter_examples(self, split: str, seed: int = 0):
        rng = random.Random(seed)
        while True:
            yield self._example(*self._sample(rng))


class _GenerousTask(_LeakyTask):
    """A broken scorer: every output scores 1."""

    def iter_examples(self, split: str, seed: int = 0):
        offset = {"train": 0, "validation": 3, "test": 6}[split]
        rng = random.Random(seed)
        while True:
            yield self._example(f"{offset + rng.randrange(3)}=", "1", {})

    def split_of(self, prompt: str) -> str:
        raise NotImplementedError

    def score(self, example, output_text: str) -> float:
        return 1.0


def test_suite_catches_shared_prompts_and_a_scorer_that_accepts_anything():
    with pytest.raises(AssertionError, match="share the prompt"):
        check_task(_LeakyTask(), n=2)
    with pytest.raises(AssertionError, match="designed wrong output"):
        check_task(_GenerousTask(), n=2)


def test_suite_catches_a_prompt_longer_than_declared():
    class Long(_GenerousTask):
        @property
        def max_prompt_length(self) -> int:
            return 1

        score = Task.score

    with pytest.raises(AssertionError, match="max_prompt_length=1"):
        check_task(Long(), n=2)
