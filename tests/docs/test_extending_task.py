"""The "Write a task" example of docs/extending.md runs: it adds a task without touching any other
file, registers it, draws examples, passes the task conformance suite and trains a few steps."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_write_a_task_example_runs():
    from adaptive_decoding.framework.models.zoo import MODELS
    from adaptive_decoding.framework.tasks.base import TASKS

    text = (ROOT / "docs" / "extending.md").read_text()
    section = text.split("## Write a task", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2
    namespace = {"__name__": "docs_example_task"}  # a temporary module
    try:
        exec(compile(blocks[0], "extending-task", "exec"), namespace)
        exec(compile(blocks[1], "extending-task-train", "exec"), namespace)
        assert "reverse" in TASKS and "tiny-reverse" in MODELS
    finally:
        TASKS._table.pop("reverse", None)
        MODELS._table.pop("tiny-reverse", None)
    assert "reverse" not in TASKS
