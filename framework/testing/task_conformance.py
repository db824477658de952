"""One conformance suite for every task (the counterpart of :mod:`adaptive_decoding.framework.testing.conformance`).

A plugin author runs it on their task, registered or not::

    from adaptive_decoding.framework.testing.task_conformance import check_task
    check_task("my_task")                   # a registered name, a Task class or an instance

The checks (:func:`task_checks` yields them in this order), on ``n`` examples of each split:

``declarations``   ``gen_length`` and ``max_prompt_length`` are positive integers, ``recipe`` is a
                   :class:`~adaptive_decoding.framework.tasks.base.Recipe` or ``None``, ``attention_structure`` a dict
                   or ``None``, and a declared ``vocabulary`` is the tokenizer's.
``deterministic``  ``examples(split, n, seed)`` gives the same examples twice, and from a fresh
                   instance built with the same parameters.
``disjoint``       train, validation and test share no prompt, and each example lies in the split
                   it was drawn for (``split_of``, where the task defines it).
``lengths``        every prompt has at most ``max_prompt_length`` tokens and every answer at most
                   ``gen_length`` (``target_ids`` pads it to exactly ``gen_length``).
``scorer``         for each example, the right output of :meth:`Task.designed_answers` (by default
                   the exact answer) scores 1.0, as text and as target ids, and the designed wrong
                   one scores 0.0.
"""

from __future__ import annotations

from typing import Callable, Iterator, Union

from adaptive_decoding.framework.tasks.base import SPLITS, TASKS, Example, Recipe, Task, get_task

TaskLike = Union[str, type, Task]


def _instance(task: TaskLike) -> Task:
    if isinstance(task, Task):
        return task
    if isinstance(task, str):
        return get_task(task)
    if isinstance(task, type) and issubclass(task, Task):
        return task.build()  # type: ignore[return-value]
    raise TypeError(f"check_task() takes a task name, a Task class or a Task instance, not {task!r}")


def _draw(task: Task, n: int, seed: int) -> dict[str, list[Example]]:
    return {split: task.examples(split, n, seed=seed) for split in SPLITS}


def check_declarations(task: Task, drawn: dict[str, list[Example]]) -> None:
    for attr in ("gen_length", "max_prompt_length"):
        value = getattr(task, attr)
        assert isinstance(value, int) and value > 0, f"{task.name}.{attr} = {value!r} is not a positive int"
    assert task.recipe is None or isinstance(task.recipe, Recipe), f"{task.name}.recipe is not a Recipe"
    structure = task.attention_structure
    assert structure is None or isinstance(structure, dict), f"{task.name}.attention_structure is not a dict"
    if task.vocabulary is not None:
        assert tuple(task.tokenizer.vocab) == tuple(task.vocabulary), \
            f"{task.name}: the tokenizer's vocabulary is not the declared one"


def check_deterministic(task: Task, drawn: dict[str, list[Example]], n: int, seed: int) -> None:
    fresh = type(task).build(**task.get_params())
    for split, examples in drawn.items():
        key = [(e.prompt, e.answer) for e in examples]
        assert len(examples) == n, f"{task.name}: asked for {n} {split} examples, got {len(examples)}"
        for other in (task, fresh):
            again = [(e.prompt, e.answer) for e in other.examples(split, n, seed=seed)]
            assert again == key, f"{task.name}: examples({split!r}, {n}, seed={seed}) differ between calls"


def check_disjoint(task: Task, drawn: dict[str, list[Example]]) -> None:
    prompts = {split: {e.prompt for e in examples} for split, examples in drawn.items()}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            shared = prompts[a] & prompts[b]
            assert not shared, f"{task.name}: splits {a} and {b} share the prompt {sorted(shared)[0]!r}"
    for split, examples in drawn.items():
        for ex in examples:
            try:
                where = task.split_of(ex.prompt)
            except NotImplementedError:  # splits decided otherwise (e.g. by paragraph)
                break
            assert where == split, f"{task.name}: a {split} example has a {where} prompt {ex.prompt!r}"


def check_lengths(task: Task, drawn: dict[str, list[Example]]) -> None:
    for examples in drawn.values():
        for ex in examples:
            n_prompt = len(task.prompt_ids(ex))
            assert n_prompt <= task.max_prompt_length, \
                f"{task.name}: prompt {ex.prompt!r} has {n_prompt} tokens > max_prompt_length={task.max_prompt_length}"
            n_answer = len(task.tokenizer.encode(ex.answer))
            assert n_answer <= task.gen_length, \
                f"{task.name}: answer {ex.answer!r} has {n_answer} tokens > gen_length={task.gen_length}"
            assert len(task.target_ids(ex)) == task.gen_length, f"{task.name}: target_ids is not gen_length long"


def check_scorer(task: Task, drawn: dict[str, list[Example]]) -> None:
    for examples in drawn.values():
        for ex in examples:
            right, wrong = task.designed_answers(ex)
            assert task.score(ex, right) == 1.0, f"{task.name}: score({right!r}) != 1.0 for {ex.prompt!r}"
            ids = task.tokenizer.encode(right)
            ids += [task.tokenizer.eos_token_id] * (task.gen_length - len(ids))
            assert task.score_ids(ex, ids) == 1.0, f"{task.name}: score_ids of {right!r} != 1.0"
            assert task.score(ex, wrong) == 0.0, \
                f"{task.name}: the designed wrong output {wrong!r} scores {task.score(ex, wrong)} for {ex.prompt!r}"


def task_checks(task: TaskLike, n: int = 6, seed: int = 0) -> Iterator[tuple[str, Callable[[], None]]]:
    """``(name, check)`` pairs of the suite, in order; each check raises ``AssertionError`` naming the task."""
    inst = _instance(task)
    drawn: dict[str, list[Example]] = {}

    def draw() -> dict[str, list[Example]]:
        if not drawn:
            drawn.update(_draw(inst, n, seed))
        return drawn

    yield "declarations", lambda: check_declarations(inst, draw())
    yield "deterministic", lambda: check_deterministic(inst, draw(), n, seed)
    yield "disjoint", lambda: check_disjoint(inst, draw())
    yield "lengths", lambda: check_lengths(inst, draw())
    yield "scorer", lambda: check_scorer(inst, draw())


def check_task(task: TaskLike, n: int = 6, seed: int = 0) -> None:
    """Run every check of the suite on ``task``; the first failure raises ``AssertionError``."""
    for _, check in task_checks(task, n=n, seed=seed):
        check()


def registered_tasks() -> list[str]:
    """Every registered task name (for a parametrised test over the registry)."""
    return TASKS.names()


__all__ = ["check_task", "task_checks", "registered_tasks"]
