"""The typed decoding context (:class:`DecodeContext`): what the loop fills in, and its tensor fields
following the rows decided when a ragged batch's rows finish at different steps."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.testing.toys import ContextToyDenoiser

PROMPTS = [[1, 2], [3], [4, 5, 6]]
G = 8


class ContextSpy(Controller):
    """One token per step (the most confident); keeps what ``state.context`` held at every step."""

    params: dict = {}

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def decide(self, f, state):
        ctx = state.context
        self.seen.append({"sample_index": ctx.sample_index.clone(), "span_mask": ctx.span_mask.clone(),
                          "reference_tokens": ctx.reference_tokens.clone(), "canvas": ctx.canvas.clone(),
                          "generation": ctx.generation.clone(), "meta": ctx.sample_rows(ctx.meta),
                          "x0_shape": tuple(f.x0.shape), "eligible": f.eligible.clone(),
                          "position": f.position.clone(), "prompt_ids": ctx.prompt_ids,
                          "eos": ctx.eos_token_ids})
        return Decision(commit=select_topk(f.confidence, f.eligible, 1))


def test_tensor_fields_follow_a_ragged_sub_batch():
    model = ContextToyDenoiser()
    mask = model.mask_token_id
    # rows finish after 8, 2 and 4 steps: row 1 and row 2 start with 6 and 4 decided positions
    initial = torch.full((3, G), mask)
    initial[1, :6] = 3
    initial[2, 2:6] = 4
    span = torch.arange(3 * G).reshape(3, G) % 3 == 0
    span[1] = ~span[1]
    ref = torch.arange(3 * G).reshape(3, G) % 7
    metas = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    given = DecodeContext(span_mask=span, reference_tokens=ref, meta=metas, prompt_text=["x", "y", "z"])
    spy = ContextSpy()
    res = decode(model, PROMPTS, spy, DecodeConfig(gen_length=G), trace=True, initial=initial, context=given)
    assert res.steps.tolist() == [8, 2, 4]
    assert [len(s["sample_index"]) for s in spy.seen] == [3, 3, 2, 2, 1, 1, 1, 1]
    for step, (seen, rec) in enumerate(zip(spy.seen, res.trace)):
        rows = seen["sample_index"]
        assert rows.tolist() == rec["rows"].tolist(), step
        assert torch.equal(seen["span_mask"], span[rows]) and torch.equal(seen["reference_tokens"], ref[rows])
        assert seen["meta"] == [metas[i] for i in rows.tolist()]
        assert tuple(seen["canvas"].shape) == seen["x0_shape"] and seen["generation"].shape == (len(rows), G)
        assert (seen["canvas"][seen["eligible"]] == mask).all()
        # the window's tokens are the generation's at the window's positions
        assert torch.equal(seen["generation"].gather(1, seen["position"]), seen["canvas"])
        assert seen["prompt_ids"] == PROMPTS and seen["eos"] == (model.eos_token_id,)
    # the caller's context is never written to
    assert given.sample_index is None and given.canvas is None and given.generation is None
    assert given.prompt_ids is None and given.eos_token_ids == ()


def test_context_rows_selects_every_tensor_field_and_keeps_lists():
    ctx = DecodeContext(meta=[{"a": 1}, {"a": 2}, {"a": 3}], span_mask=torch.eye(3, dtype=torch.bool),
                        sample_index=torch.tensor([4, 5, 6]), canvas=torch.arange(6).reshape(3, 2))
    sub = ctx.rows(torch.tensor([2, 0]))
    assert sub.sample_index.tolist() == [6, 4] and sub.canvas.tolist() == [[4, 5], [0, 1]]
    assert sub.span_mask.tolist() == [[False, False, True], [True, False, False]]
    assert sub.meta is ctx.meta and sub.reference_tokens is None


def test_context_is_checked_early():
    model = ContextToyDenoiser()
    spy = ContextSpy()
    with pytest.raises(ValueError, match=r"context.span_mask has shape \(2, 8\).*batch = 3"):
        decode(model, PROMPTS, spy, DecodeConfig(gen_length=G), context=DecodeContext(span_mask=torch.ones(2, G)))
    assert spy.seen == []
