"""``phrases``: pairs at scale (128-token answers, variable length, several joint modes per slot)."""

from __future__ import annotations

import pytest

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.tasks.base import Example, get_task


def test_layout_fixed_prompt_and_eos_padding():
    task = get_task("phrases")
    exs = task.examples("test", 20)
    assert task.gen_length == 128 and task.default_block_length == 32
    assert all(len(task.prompt_ids(e)) == 43 for e in exs)  # the answer always starts at column 43
    lengths = {len(task.tokenizer.encode(e.answer)) for e in exs}
    assert len(lengths) > 1 and max(lengths) <= 125  # variable length, the rest is [EOS]
    eos = task.tokenizer.eos_token_id
    assert all(task.target_ids(e)[-1] == eos for e in exs)


def test_score_accepts_another_joint_mode_and_rejects_a_mix():
    task = get_task("phrases", min_groups=2, max_groups=2, length=8)
    ex = Example(id="x", prompt="usa usa:", answer="San Francisco,New York")
    assert task.groups_of(ex) == ["usa", "usa"]
    assert task.score(ex, "New York,Los Angeles") == 1.0
    assert task.score(ex, "New Francisco,Los Angeles") == 0.0
    assert task.joint_coherence(ex, "New Francisco,Los Angeles")["incoherent"] == 1
    assert task.score(ex, "New York,Los Angeles,San Jose") == 0.0  # an extra slot


def test_length_must_hold_the_slots():
    with pytest.raises(ParameterError, match="length=64 cannot hold max_groups=42"):
        get_task("phrases", length=64)
