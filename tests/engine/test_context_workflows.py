"""One decode context for every workflow (:meth:`DecodeContext.for_batch`).

For every controller that reads ``state.context`` (``compliance_entropy``: the tokenizer; ``number_guard``:
the tokenizer for ``rule=digits``, the task's ``span_mask`` for ``rule=meta``), the decisions (generated
text and NFE per example) under ``adec bench`` / ``evaluate``, an ``adec run`` cell, ``adec tune``'s
objective and ``adec generate`` equal those of ``decode`` given a context written out by hand; each
controller also decides differently from its inner controller alone (the context matters), and without
the context it needs it fails with :class:`MissingContextError` instead of acting as another decoder.

Models: the designed 2-digit adder (:func:`adaptive_decoding.framework.testing.carry.carry_model`) and the designed toy
over the ``pairs`` vocabulary (:func:`adaptive_decoding.experiments.cells.toy_model`); no training.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext, MissingContextError
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.evaluate import evaluate, item_seeds
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.tasks.base import get_task

N = 12
ODD_DIGITS = {"patterns": ["[13579]"], "numbers": "off"}
#: (case id, task name and params, controller name and params)
CASES = [
    ("compliance_entropy", ("addition", {"digits": 2}),
     ("compliance_entropy", {"inner": "entropy_topk", "weight": 4.0, "compliance": ODD_DIGITS})),
    ("number_guard_digits", ("addition", {"digits": 2}),
     ("number_guard", {"inner": "fast_dllm", "inner_params": {"threshold": 0.5}})),
    ("number_guard_meta", ("pairs", {}),
     ("number_guard", {"inner": "fast_dllm", "inner_params": {"threshold": 0.3}, "rule": "meta"})),
]


def setup(case: tuple) -> tuple[Any, Any, list, Any, DecodeConfig]:
    """The case's loaded model, task, test examples, controller and decoding options."""
    from adaptive_decoding.experiments.cells import toy_model
    from adaptive_decoding.framework.testing.carry import carry_model

    _, (task_name, task_params), _ = case
    task = get_task(task_name, **task_params)
    loaded = carry_model() if task_name == "addition" else toy_model(task_name)
    cfg = DecodeConfig(gen_length=task.gen_length, block_length=task.default_block_length, seed=0)
    return loaded, task, task.examples("test", N), controller_of(case), cfg


def controller_of(case: tuple) -> Any:
    name, params = case[2]
    return build_controller(name, **params)


def hand_context(loaded: Any, task: Any, examples: list, gen_length: int) -> DecodeContext:
    """The full context written out field by field (not through ``for_batch``)."""
    span = None
    if task.name == "pairs":
        span = torch.zeros(len(examples), gen_length, dtype=torch.bool)
        for b, ex in enumerate(examples):
            for s in range(len(ex.meta["groups"])):
                span[b, 3 * s: 3 * s + 2] = True
    return DecodeContext(tokenizer=loaded.tokenizer, prompt_text=[ex.prompt for ex in examples],
                         meta=[dict(ex.meta, task=task.name) for ex in examples], span_mask=span)


def decided(loaded: Any, task: Any, examples: list, controller: Any, cfg: DecodeConfig,
            context: Any) -> dict[str, tuple[str, int]]:
    """``decode`` of every example in one batch: id -> (text, NFE)."""
    tok = loaded.tokenizer
    res = decode(loaded.denoiser, [tok.encode(ex.prompt) for ex in examples], controller, cfg,
                 seeds=item_seeds([ex.id for ex in examples], cfg.seed), context=context)
    return {ex.id: (tok.decode(g, stop_at_eos=True), int(n))
            for ex, g, n in zip(examples, res.generated.tolist(), res.nfe.tolist())}


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request: Any) -> tuple:
    return request.param


@pytest.fixture(scope="module")
def expected(case: tuple) -> dict[str, tuple[str, int]]:
    loaded, task, examples, ctrl, cfg = setup(case)
    out = decided(loaded, task, examples, ctrl, cfg, hand_context(loaded, task, examples, cfg.gen_length))
    inner_name = case[2][1]["inner"]
    inner = build_controller(inner_name, **case[2][1].get("inner_params", {}))
    assert decided(loaded, task, examples, inner, cfg, None) != out  # the context changes the decisions
    return out


def test_bench_evaluate_decides_as_decode_with_the_full_context(case: tuple, expected: dict) -> None:
    loaded, task, _, ctrl, cfg = setup(case)
    res = evaluate(loaded, task, ctrl, cfg, n=N, batch_size=5)  # adec bench's call
    assert {s.id: (s.output, s.nfe) for s in res.samples} == expected


def test_run_cell_decides_as_decode_with_the_full_context(case: tuple, expected: dict) -> None:
    from adaptive_decoding.experiments.cells import evaluate_cell
    from adaptive_decoding.experiments.parse import parse_experiment

    loaded, task, _, _, cfg = setup(case)
    (task_name, task_params), (name, params) = case[1], case[2]
    exp = parse_experiment({"name": "ctx", "model": "tiny-{task}", "n": N, "batch_size": 5, "seeds": [0],
                            "tasks": [{"name": task_name, "params": task_params}],
                            "strategies": [{"label": case[0], "controller": name, "params": params}]})
    (cell,) = exp.cells()
    res = evaluate_cell(cell, loaded, task, exp)
    assert {s.id: (s.output, s.nfe) for s in res.samples} == expected


def test_tune_objective_scores_as_decode_with_the_full_context(case: tuple, expected: dict) -> None:
    from adaptive_decoding.framework.tuning.objective import score_examples

    loaded, task, examples, ctrl, cfg = setup(case)
    scored = score_examples(loaded, task, ctrl, cfg, examples, batch_size=5)
    assert scored.nfe == [expected[ex.id][1] for ex in examples]
    assert scored.correct == [float(task.score(ex, expected[ex.id][0])) for ex in examples]


def test_generate_job_decides_as_decode_with_the_full_context(case: tuple, expected: dict, tmp_path: Any) -> None:
    from adaptive_decoding.framework.cli.generate import example_items
    from adaptive_decoding.framework.jobs.options import JobOptions
    from adaptive_decoding.framework.jobs.output import read_results
    from adaptive_decoding.framework.jobs.runner import run_generation_job

    loaded, task, examples, ctrl, cfg = setup(case)
    out = tmp_path / "rows.jsonl"
    options = JobOptions.from_flat({"batch_size": 5, "progress": False, "fallback_controller": None, "fsync": False})
    summary = run_generation_job(loaded, example_items(examples), ctrl, cfg, out, options, task=task)
    assert summary.status == "completed" and summary.fallbacks == 0, summary.format()
    assert {r["id"]: (r["text"], r["nfe"]) for r in read_results(out)} == expected


def test_a_controller_without_the_context_it_needs_fails_clearly(case: tuple) -> None:
    loaded, task, examples, ctrl, cfg = setup(case)
    field = "span_mask" if case[2][1].get("rule") == "meta" else "tokenizer"
    with pytest.raises(MissingContextError, match=f"{case[2][0]} needs the {field} in the decode context"):
        decided(loaded, task, examples, ctrl, cfg, None)


def test_number_guard_on_spans_fails_on_a_task_that_marks_none() -> None:
    from adaptive_decoding.framework.testing.carry import carry_model

    task = get_task("addition", digits=2)
    ctrl = build_controller("number_guard", inner="fast_dllm", rule="both")
    cfg = DecodeConfig(gen_length=task.gen_length)
    with pytest.raises(MissingContextError, match="number_guard needs the span_mask.*rule='both'"):
        evaluate(carry_model(), task, ctrl, cfg, n=2)


def test_for_batch_reads_prompts_metas_and_the_task_spans() -> None:
    task = get_task("pairs")
    examples = task.examples("test", 3)
    ctx = DecodeContext.for_batch(task.tokenizer, examples, task=task, gen_length=task.gen_length + 2)
    assert ctx.prompt_text == [ex.prompt for ex in examples]
    assert ctx.meta == [dict(ex.meta, task="pairs") for ex in examples]
    assert ctx.span_mask.shape == (3, task.gen_length + 2)
    k = len(examples[0].meta["groups"])
    assert ctx.span_mask[0].tolist() == [i < 3 * k and i % 3 != 2 for i in range(task.gen_length + 2)]
    plain = DecodeContext.for_batch(task.tokenizer, ["a:", "b:"])
    assert (plain.prompt_text, plain.meta, plain.span_mask) == (["a:", "b:"], [{}, {}], None)
    assert DecodeContext.for_batch(None, examples, task=get_task("addition")).span_mask is None


def test_a_generate_job_whose_controller_needs_spans_the_task_lacks_fails_before_any_work(tmp_path: Any) -> None:
    from adaptive_decoding.framework.cli.generate import example_items
    from adaptive_decoding.framework.jobs.options import JobOptions
    from adaptive_decoding.framework.jobs.runner import run_generation_job
    from adaptive_decoding.framework.testing.carry import carry_model

    task = get_task("addition", digits=2)
    ctrl = build_controller("number_guard", inner="fast_dllm", rule="meta")
    out = tmp_path / "rows.jsonl"
    with pytest.raises(MissingContextError, match="number_guard needs the span_mask"):
        run_generation_job(carry_model(), example_items(task.examples("test", 2)), ctrl,
                           DecodeConfig(gen_length=task.gen_length), out, JobOptions.from_flat({"progress": False}),
                           task=task)
    assert not out.exists()
