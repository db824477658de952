"""Every registered task passes the task conformance suite (small n, so it stays fast)."""

from __future__ import annotations

import random

import pytest

from adaptive_decoding.framework.tasks.base import TASKS, Task, get_task
from adaptive_decoding.framework.testing.task_conformance import check_task, registered_tasks, task_checks

#: tasks over a user's files would be checked on the project's own fixture files (none yet: see below)
FILE_TASKS: dict[str, dict] = {}
#: tasks the suite does not apply to, and why
NOT_APPLICABLE = {"lm_eval": "an lm-eval task keeps lm-eval's own splits (it has no validation split of ours); "
                             "its prompts and scores are checked against lm_eval itself in test_data_task.py",
                  "data": "the data task has no tokenizer of its own (the model's tokenizes its prompts), so the "
                          "suite's length checks do not apply; its splits, few-shot and errors are tested in "
                          "test_data_task.py"}


@pytest.mark.parametrize("name", registered_tasks())
def test_registered_task_conforms(name):
    if name in NOT_APPLICABLE:
        pytest.skip(NOT_APPLICABLE[name])
    task = get_task(name, **FILE_TASKS[name]) if name in FILE_TASKS else name
    n = 2 if name in FILE_TASKS else 4 if name == "sudoku9" else 6
    for check_name, check in task_checks(task, n=n):
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
