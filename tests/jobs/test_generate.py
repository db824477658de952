"""Batch generation under injected faults: OOM, kills, failing controllers and scorers, timeouts,
bad input. Every test checks that no row is lost or duplicated and that outputs equal a clean run.

The model is a designed toy (:class:`PromptEcho`): at generation position r of a row whose prompt
tokens sum to s it predicts token ``10 + (s + r) % 10`` with a confidence that depends on r, so
the output is a known function of the prompt and a threshold controller commits several tokens
per step. Rows are computed independently (batch-invariant by construction).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

from adaptive_decoding.controllers.baselines import FastDLLM
from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.core.rng import stable_seed
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.lookahead import LookaheadResult
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.jobs.batcher import BatchSizer
from adaptive_decoding.framework.jobs.errors import JobInputError, OutputFileError
from adaptive_decoding.framework.jobs.options import JobOptions
from adaptive_decoding.framework.jobs.output import (
    RESULT_FIELDS,
    RowSchemaError,
    read_results,
    validate_row,
)
from adaptive_decoding.framework.jobs.runner import run_generation_job
from adaptive_decoding.framework.models.protocol import LoadedModel
from adaptive_decoding.framework.tasks.prompts import PromptItem

EOS, MASK, PAD, V = 20, 21, 22, 23
ROOT = Path(__file__).resolve().parents[2]


class CharTokenizer:
    """Prompt letters a..j are ids 0..9; generated ids 10..19 read as A..J; 20 EOS, 21 MASK, 22 PAD."""

    mask_token_id, eos_token_id, pad_token_id, vocab_size = MASK, EOS, PAD, V

    def encode(self, text: str) -> list[int]:
        out = []
        for ch in text.replace(" ", ""):
            if not "a" <= ch <= "j":
                raise ValueError(f"unknown character {ch!r}")
            out.append(ord(ch) - ord("a"))
        return out

    def decode(self, ids, stop_at_eos: bool = True) -> str:
        out = []
        for i in (int(t) for t in ids):
            if i == EOS and stop_at_eos:
                break
            out.append(chr(ord("A") + i - 10) if 10 <= i < 20 else "?")
        return "".join(out)


class PromptEcho(nn.Module):
    """Toy denoiser (see the module docstring); context of ``max_len`` positions."""

    mask_token_id, eos_token_id, pad_token_id, vocab_size = MASK, EOS, PAD, V
    CONF = (4.0, 1.0, 3.0, 0.5)  # logit of the answer by r % 4: p = 0.74, 0.13, 0.51, 0.08

    def __init__(self, max_len: int = 24) -> None:
        super().__init__()
        self.max_len = max_len
        self.calls = 0

    def forward(self, x: torch.Tensor, attention_mask=None) -> torch.Tensor:
        self.calls += 1
        b, l = x.shape  # noqa: E741
        if l > self.max_len:
            raise ValueError(f"sequence of {l} positions is longer than max_len={self.max_len}")
        is_prompt = x < 10
        plen, s = is_prompt.long().sum(1), (x * is_prompt).sum(1)
        rel = (torch.arange(l)[None] - plen[:, None]).clamp(min=0)
        logits = torch.zeros(b, l, V)
        logits[..., 20:] = -30.0
        logits.scatter_(2, (10 + (s[:, None] + rel) % 10)[..., None], torch.tensor(self.CONF)[rel % 4][..., None])
        own = torch.full((b, l, V), -10.0).scatter_(2, x[..., None], 10.0)
        return torch.where((x != MASK)[..., None], own, logits)


def expected_text(prompt: str, g: int) -> str:
    s = sum(ord(c) - ord("a") for c in prompt)
    return "".join(chr(ord("A") + (s + r) % 10) for r in range(g))


class Wrap:
    """A denoiser wrapper that injects a fault in ``before(x)``; everything else is the inner model's."""

    def __init__(self, inner: nn.Module) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def before(self, x: torch.Tensor) -> None:
        pass

    def __call__(self, x, attention_mask=None):
        self.sizes.append(x.shape[0])
        self.before(x)
        return self.inner(x, attention_mask)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class OOMAbove(Wrap):
    def __init__(self, inner, limit: int, exc) -> None:
        super().__init__(inner)
        self.limit, self.exc = limit, exc

    def before(self, x):
        if x.shape[0] > self.limit:
            raise self.exc


class InterruptAt(Wrap):
    """Ctrl-C at the n-th forward pass, or a real signal to this process (``sig``: SIGKILL, SIGTERM)."""

    def __init__(self, inner, at: int, sig: int | None = None) -> None:
        super().__init__(inner)
        self.at, self.sig, self.n = at, sig, 0

    def before(self, x):
        self.n += 1
        if self.n == self.at:
            if self.sig is not None:
                os.kill(os.getpid(), self.sig)
                return
            raise KeyboardInterrupt


class SlowWhen(Wrap):
    """Sleeps ``delay`` s per forward pass while a row whose prompt starts with ``first`` is in it."""

    def __init__(self, inner, delay: float, first: int | None = None) -> None:
        super().__init__(inner)
        self.delay, self.first = delay, first

    def before(self, x):
        if self.first is None or bool((x[:, 0] == self.first).any()):
            time.sleep(self.delay)


class Picky(FastDLLM):
    """Fast-dLLM that raises whenever a sample with a seed in ``BAD`` is in the batch."""

    registry_name = "picky"
    BAD: set = set()

    def decide(self, f, state):
        if any(int(s) in self.BAD for s in state.seeds.tolist()):
            raise RuntimeError("picky controller refuses this prompt")
        return super().decide(f, state)


class Knobs(Controller):
    """Top-k controller with η, k and a lookahead depth (for validation and scorer-fault tests)."""

    params = {
        "eta": Param(float, low=0.0, high=1.0, doc="η"),
        "k": Param(int, low=1, doc="tokens per step"),
        "depth": Param(int, low=0, doc="lookahead depth"),
    }

    def __init__(self, eta: float = 0.5, k: int = 2, depth: int = 0) -> None:
        self.eta = eta
        self.k = k
        self.depth = depth

    def decide(self, f, state):
        depth = torch.full((f.batch_size,), self.depth, dtype=torch.long) if self.depth else None
        return Decision(commit=select_topk(f.confidence, f.eligible, self.k), depth=depth)


class FailingLookahead:
    """A lookahead whose scorer raises for samples with a seed in ``bad`` (else a no-op)."""

    def __init__(self, bad: set) -> None:
        self.bad = bad
        self.calls = 0

    def budget_left(self, state, spent):
        return 64 - spent

    def refine(self, model, x, attn, feats, decision, commit, tokens, state, budget_left, controller=None):
        self.calls += 1
        if any(int(s) in self.bad for s in state.seeds.tolist()):
            raise ValueError("scorer exploded")
        b = x.shape[0]
        return LookaheadResult(tokens=tokens, commit=commit, extra_nfe=torch.zeros(b, dtype=torch.long),
                               fallback=torch.zeros(b, dtype=torch.bool), forward_seconds=0.0)


PROMPTS = ["abc", "j", "hhhh", "abc", "bad", "ji", "ceed", "a", "ggg", "fj", "e", "dcba"]
G = 8


def items_of(prompts=PROMPTS, ids=True):
    return [PromptItem(prompt=p, id=f"q{i}" if ids else None, line=i + 1) for i, p in enumerate(prompts)]


def model(denoiser=None) -> LoadedModel:
    return LoadedModel(denoiser if denoiser is not None else PromptEcho(), CharTokenizer(), "echo")


def job(out, denoiser=None, items=None, controller=None, config=None, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("progress", False)
    kw.setdefault("log", lambda msg: None)
    lookahead, task = kw.pop("lookahead", None), kw.pop("task", None)  # the rest are JobOptions, given flat
    return run_generation_job(model(denoiser), items if items is not None else items_of(),
                              controller if controller is not None else FastDLLM(threshold=0.5),
                              config if config is not None else DecodeConfig(gen_length=G), out,
                              JobOptions.from_flat(kw), lookahead=lookahead, task=task)


def by_id(path) -> dict:
    rows = read_results(path)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate rows"
    for r in rows:
        validate_row(r)
    return {r["id"]: r for r in rows}


def results(rows: dict) -> dict:
    return {i: {k: r[k] for k in RESULT_FIELDS} for i, r in rows.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "ref.jsonl"
    summary = job(out)
    assert summary.status == "completed" and summary.done == len(PROMPTS) and summary.failed == 0
    return by_id(out)


# ---------------------------------------------------------------------------------- clean run
def test_clean_run_writes_one_valid_row_per_prompt_with_the_designed_answers(reference):
    assert set(reference) == {f"q{i}" for i in range(len(PROMPTS))}
    for i, p in enumerate(PROMPTS):
        row = reference[f"q{i}"]
        assert row["status"] == "ok" and row["text"] == expected_text(p, G)
        assert row["prompt_ids"] == CharTokenizer().encode(p)
        assert row["seed"] == stable_seed(0, f"q{i}")
        assert 1 <= row["nfe"] < G  # the threshold commits several tokens per step
        assert row["fallback"] is False and row["retries"] == 0 and row["line"] == i + 1


def test_summary_counts_tokens_and_latency_percentiles(tmp_path):
    s = job(tmp_path / "o.jsonl", batch_size=3)
    assert (s.done, s.failed, s.pending, s.tokens) == (12, 0, 0, 12 * G)
    lat = sorted(r["latency_s"] for r in by_id(tmp_path / "o.jsonl").values())
    assert s.latency(50) == lat[5] and s.latency(95) == lat[11] and s.latency(99) == lat[11]
    assert s.tokens_per_second > 0
    text = s.format()
    assert "done 12, failed 0" in text and "P50" in text and "P99" in text and "tokens/s" in text


# ---------------------------------------------------------------------------------- OOM
@pytest.mark.parametrize("exc", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:116] DefaultCPUAllocator: can't allocate memory: "
                 "you tried to allocate 123456789 bytes."),
], ids=["cuda", "cpu"])
def test_oom_halves_the_batch_and_every_prompt_completes(tmp_path, reference, exc):
    den = OOMAbove(PromptEcho(), limit=3, exc=exc)
    s = job(tmp_path / "o.jsonl", den, batch_size=8)
    rows = by_id(tmp_path / "o.jsonl")
    assert results(rows) == results(reference)  # nothing dropped, nothing changed
    assert s.oom_events == 2 and s.batch_size_min == 2  # 8 -> 4 -> 2
    # 4 clean batches of 2, then it grows back, but stays below the size that failed (4)
    assert Counter(r["batch_size"] for r in rows.values()) == {2: 8, 3: 3, 1: 1}
    assert s.batch_size_final == 3 and max(den.sizes) == 8
    assert s.failed == 0 and s.done == 12


def test_oom_at_batch_size_one_becomes_an_error_row_after_a_retry(tmp_path):
    den = OOMAbove(PromptEcho(), limit=0, exc=torch.cuda.OutOfMemoryError("CUDA out of memory."))
    s = job(tmp_path / "o.jsonl", den, items=items_of(PROMPTS[:2]), batch_size=2)
    rows = by_id(tmp_path / "o.jsonl")
    assert set(rows) == {"q0", "q1"} and s.failed == 2 and s.retried == 2
    for r in rows.values():
        assert r["status"] == "error" and r["error_type"] == "oom" and r["retries"] == 1
        assert r["error"].startswith("out of memory at batch size 1 (OutOfMemoryError: CUDA out of memory.")


def test_batch_sizer_grows_back_carefully():
    sz = BatchSizer(16, grow_after=2)
    sz.on_oom(16)
    assert (sz.size, sz.ceiling) == (8, 16)
    sz.on_success(8)
    sz.on_success(8)
    assert sz.size == 12  # the midpoint between what works and what failed
    sz.on_oom(12)
    assert (sz.size, sz.ceiling) == (8, 12)  # back to the largest size that worked, not 6
    for _ in range(4):
        sz.on_success(sz.size)
    assert sz.size == 11  # 8 -> 10 -> 11: just below the ceiling, one OOM per halving of the gap
    for _ in range(7):
        sz.on_success(11)
    assert sz.ceiling == 12
    sz.on_success(11)  # probe_after (4 x grow_after) clean batches at the cap: try larger sizes again
    assert sz.ceiling is None
    sz.on_success(3)  # a short tail batch does not count
    sz.on_success(11)
    sz.on_success(11)
    assert sz.size == 16
    sz.on_oom(16)  # the probe failed: back to what worked, and the next probe waits twice as long
    assert (sz.size, sz.ceiling, sz.probe_after, sz.oom_events) == (11, 16, 16, 3)


# ---------------------------------------------------------------------------------- kill + resume
def test_ctrl_c_then_torn_line_then_resume_equals_an_uninterrupted_run(tmp_path, reference):
    out = tmp_path / "o.jsonl"
    s1 = job(out, InterruptAt(PromptEcho(), at=9), batch_size=2)
    assert s1.status == "interrupted" and 0 < s1.done < 12 and s1.pending == 12 - s1.done
    assert "run the same command again to resume" in s1.format()
    first = by_id(out)
    assert len(first) == s1.done
    data = out.read_bytes()
    out.write_bytes(data[: len(data) - 25])  # a kill in the middle of writing the last row
    s2 = job(out, batch_size=3)
    assert s2.status == "completed" and s2.already_done == s1.done - 1 and s2.done == 12 - s1.done + 1
    assert any("removed a torn last line" in n for n in s2.notes)
    rows = by_id(out)
    assert results(rows) == results(reference)
    s3 = job(out)  # a third run has nothing left to do
    assert (s3.done, s3.already_done, s3.pending) == (0, 12, 0)
    assert len(out.read_text().splitlines()) == 12


CHILD = """
import sys
sys.path.insert(0, {tests!r})
import signal
from test_generate import InterruptAt, PromptEcho, job
job({out!r}, InterruptAt(PromptEcho(), at={at}, sig=signal.SIGKILL), batch_size=2)
print("not killed")
"""


def test_sigkill_mid_job_then_resume_loses_nothing(tmp_path, reference):
    out = tmp_path / "o.jsonl"
    code = CHILD.format(tests=str(Path(__file__).parent), out=str(out), at=11)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    killed = by_id(out)
    assert 0 < len(killed) < 12
    s = job(out, batch_size=5)
    assert s.already_done == len(killed) and s.done == 12 - len(killed)
    assert results(by_id(out)) == results(reference)


TERM_CHILD = """
import signal, sys
sys.path.insert(0, {tests!r})
import test_generate as T
from adaptive_decoding.framework import cli
from adaptive_decoding.framework.cli import generate
generate.load_model_for = lambda name, device, **options: T.model(T.InterruptAt(T.PromptEcho(), at={at}, sig=signal.SIGTERM))
sys.exit(cli.main(["generate", "--input", {inp!r}, "--output", {out!r}, "--model", "echo", "--set", "gen_length=8",
                   "--set", "threshold=0.5", "--batch-size", "2", "--no-progress"]))
"""


@pytest.mark.slow  # a fresh interpreter imports every command (Lightning included): ~5-15 s
def test_sigterm_stops_adec_generate_like_ctrl_c_and_the_rerun_completes(tmp_path, reference, monkeypatch, capsys):
    from adaptive_decoding.framework import cli
    from adaptive_decoding.framework.cli import generate

    inp = write_prompts(tmp_path / "p.jsonl", [{"prompt": p, "id": f"q{i}"} for i, p in enumerate(PROMPTS)])
    out = tmp_path / "o.jsonl"
    code = TERM_CHILD.format(tests=str(Path(__file__).parent), inp=str(inp), out=str(out), at=9)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 130, proc.stderr
    assert "generate: interrupted" in proc.stderr and "run the same command again to resume" in proc.stderr
    first = by_id(out)
    assert 0 < len(first) < 12
    monkeypatch.setattr(generate, "load_model_for", lambda name, device, **options: model())
    assert cli.main(["generate", "--input", str(inp), "--output", str(out), "--model", "echo", "--set",
                     "gen_length=8", "--set", "threshold=0.5", "--no-progress"]) == 0
    assert f"already in output {len(first)}" in capsys.readouterr().err
    assert results(by_id(out)) == results(reference)


def test_output_with_other_settings_or_a_corrupt_row_is_refused(tmp_path, reference):
    out = tmp_path / "o.jsonl"
    job(out, items=items_of(PROMPTS[:3]))
    with pytest.raises(OutputFileError, match=r"o.jsonl holds 3 rows written with other settings .*--overwrite"):
        job(out, controller=FastDLLM(threshold=0.7))
    lines = out.read_text().splitlines()
    out.write_text(lines[0] + "\n" + '{"id": "x"}\n' + lines[1] + "\n")
    with pytest.raises(OutputFileError, match=r"o.jsonl:2: row does not follow the adec-generate/2 schema: "
                                              r"missing field 'schema'"):
        job(out)
    s = job(out, overwrite=True)
    assert s.done == 12 and results(by_id(out)) == results(reference)


def test_retry_errors_reruns_only_the_error_rows_and_a_locked_output_is_refused(tmp_path):
    from adaptive_decoding.framework.jobs.output import ResultFile

    out = tmp_path / "o.jsonl"
    Picky.BAD = {stable_seed(0, "q1")}
    job(out, items=items_of(PROMPTS[:3]), controller=Picky(threshold=0.5), fallback_controller=None)
    assert by_id(out)["q1"]["status"] == "error"
    Picky.BAD = set()  # the cause is fixed
    s = job(out, items=items_of(PROMPTS[:3]), controller=Picky(threshold=0.5), fallback_controller=None,
            retry_errors=True)
    rows = by_id(out)
    assert (s.already_done, s.done) == (2, 1) and all(r["status"] == "ok" for r in rows.values()) and len(rows) == 3
    holder = ResultFile(str(out))
    holder.open()
    try:
        with pytest.raises(OutputFileError, match="o.jsonl is being written by another job"):
            job(out, items=items_of(PROMPTS[:3]), controller=Picky(threshold=0.5), fallback_controller=None)
    finally:
        holder.close()


# ---------------------------------------------------------------------------------- failures
def test_controller_that_raises_on_one_item_falls_back_and_is_marked(tmp_path, reference):
    Picky.BAD = {stable_seed(0, "q5")}
    s = job(tmp_path / "o.jsonl", controller=Picky(threshold=0.5), batch_size=8)
    rows = by_id(tmp_path / "o.jsonl")
    assert set(rows) == set(reference) and s.done == 12 and s.failed == 0
    bad = rows["q5"]
    assert bad["status"] == "ok" and bad["fallback"] is True and bad["controller"] == "sequential"
    assert bad["fallback_reason"] == ("controller 'picky' raised: RuntimeError: picky controller refuses this "
                                      "prompt (failed 2 times); decoded with 'sequential' without lookahead")
    assert bad["text"] == reference["q5"]["text"] and bad["nfe"] == G and bad["retries"] == 1
    others = {i: r for i, r in results(rows).items() if i != "q5"}
    assert others == {i: {**r, "controller": "picky"} for i, r in results(reference).items() if i != "q5"}
    assert (s.fallbacks, s.retried) == (1, 1) and s.bisections == 3  # 8 -> 4 -> 2 -> 1


def test_without_a_fallback_a_failing_controller_gives_an_error_row(tmp_path):
    Picky.BAD = {stable_seed(0, "q1")}
    s = job(tmp_path / "o.jsonl", items=items_of(PROMPTS[:3]), controller=Picky(threshold=0.5),
            fallback_controller=None)
    rows = by_id(tmp_path / "o.jsonl")
    assert [rows[i]["status"] for i in ("q0", "q1", "q2")] == ["ok", "error", "ok"]
    assert rows["q1"]["error_type"] == "controller" and "picky controller refuses" in rows["q1"]["error"]
    assert s.failed == 1 and s.done == 2


def test_scorer_failure_decodes_that_item_without_lookahead(tmp_path):
    la = FailingLookahead({stable_seed(0, "q2")})
    s = job(tmp_path / "o.jsonl", items=items_of(PROMPTS[:4]), controller=Knobs(k=2, depth=1), lookahead=la,
            lookahead_spec="boom:1")
    rows = by_id(tmp_path / "o.jsonl")
    assert s.done == 4 and s.fallbacks == 1 and la.calls > 0
    assert rows["q2"]["fallback"] and rows["q2"]["controller"] == "Knobs"
    assert rows["q2"]["fallback_reason"] == ("lookahead/scorer raised: ValueError: scorer exploded (failed 2 "
                                            "times); decoded without lookahead")
    assert not any(rows[i]["fallback"] for i in ("q0", "q1", "q3"))
    assert all(r["text"] == expected_text(PROMPTS[int(i[1:])], G) for i, r in rows.items())


class BranchingKnobs(Knobs):
    """Knobs that also keeps 2 candidates at every eligible position (so the lookahead branches)."""

    registry_name = "branching_knobs"

    def decide(self, f, state):
        d = super().decide(f, state)
        d.k = torch.where(f.eligible, torch.full_like(f.position, 2), torch.ones_like(f.position))
        return d


def test_real_lookahead_with_a_failing_scorer_falls_back_per_step_and_loses_nothing(tmp_path):
    from adaptive_decoding.framework.engine.lookahead import Lookahead
    from adaptive_decoding.framework.engine.scorer import Scorer

    class Broken(Scorer):
        registry_name = "broken"
        params: dict = {}

        def _score(self, candidates, context):
            raise RuntimeError("broken scorer")

    items = items_of(PROMPTS[:4])
    earlier = dict(width=2, rollout="threshold", max_depth=8, rescore="pll", advance=1, lazy=False,
                   budget=64)  # the lookahead's defaults when this test was written
    ok = job(tmp_path / "ok.jsonl", items=items, controller=BranchingKnobs(k=1, depth=2),
             lookahead=Lookahead.build(scorer="logprob", **earlier), lookahead_spec="logprob")
    s = job(tmp_path / "o.jsonl", items=items, controller=BranchingKnobs(k=1, depth=2),
            lookahead=Lookahead.build(scorer=Broken(), **earlier), lookahead_spec="broken")
    good, rows = by_id(tmp_path / "ok.jsonl"), by_id(tmp_path / "o.jsonl")
    assert ok.done == s.done == 4 and s.failed == 0
    for i, p in enumerate(PROMPTS[:4]):
        assert good[f"q{i}"]["lookahead_nfe"] > 0 and good[f"q{i}"]["lookahead_fallbacks"] == 0
        assert rows[f"q{i}"]["text"] == expected_text(p, G) and rows[f"q{i}"]["lookahead_fallbacks"] > 0
    assert s.step_fallbacks == sum(r["lookahead_fallbacks"] for r in rows.values())


def test_too_long_empty_and_unencodable_prompts_are_error_rows_and_the_job_goes_on(tmp_path):
    items = [PromptItem("abc", "ok"), PromptItem("a" * 17, "long"), PromptItem("", "empty"),
             PromptItem("  ", "blank"), PromptItem("xyz", "alien")]
    s = job(tmp_path / "o.jsonl", items=items)
    rows = by_id(tmp_path / "o.jsonl")
    assert rows["ok"]["status"] == "ok" and s.done == 1 and s.failed == 4
    assert rows["long"]["error"] == ("prompt of 17 tokens + gen_length 8 = 25 positions exceeds the model's "
                                     "context of 24 positions")
    assert rows["long"]["error_type"] == "too_long"
    assert rows["empty"]["error"] == rows["blank"]["error"] == "prompt is empty"
    assert rows["alien"]["error"] == ("the tokenizer cannot encode the prompt: ValueError: unknown character 'x'")


def test_model_failure_on_one_item_is_isolated_retried_then_an_error_row(tmp_path, reference):
    hidden = Wrap(PromptEcho(max_len=24))
    hidden.__dict__["max_len"] = None  # the model does not declare its context; its forward raises
    long_items = items_of(PROMPTS[:5]) + [PromptItem("a" * 17, "long")]
    s = job(tmp_path / "o.jsonl", hidden, items=long_items, batch_size=6)
    rows = by_id(tmp_path / "o.jsonl")
    assert rows["long"]["status"] == "error" and rows["long"]["error_type"] == "model"
    assert rows["long"]["error"] == "ValueError: sequence of 25 positions is longer than max_len=24"
    assert rows["long"]["retries"] == 1 and s.retried == 1
    assert {i: r for i, r in results(rows).items() if i != "long"} == {f"q{i}": results(reference)[f"q{i}"]
                                                                       for i in range(5)}


# ---------------------------------------------------------------------------------- timeouts
def test_item_timeout_stops_the_slow_item_and_keeps_the_others(tmp_path, reference):
    den = SlowWhen(PromptEcho(), delay=0.12, first=9)  # prompts starting with "j" are slow
    items = items_of(PROMPTS[:6])  # q1 = "j" and q5 = "ji" are slow
    s = job(tmp_path / "o.jsonl", den, items=items, item_timeout_s=0.3, batch_size=3)
    rows = by_id(tmp_path / "o.jsonl")
    assert set(rows) == {f"q{i}" for i in range(6)}
    for i in (1, 5):
        r = rows[f"q{i}"]
        assert r["status"] == "error" and r["error_type"] == "timeout" and r["retries"] == 1
        assert re.fullmatch(r"timed out: ran past item_timeout_s=0.3 \(stopped after (\d+\.\d\d) s, at a "
                            r"forward-pass boundary\)", r["error"])
        assert 0.3 <= float(re.search(r"after (\S+) s", r["error"]).group(1)) < 0.3 + 0.12 + 0.5
    for i in (0, 2, 3, 4):
        assert results(rows)[f"q{i}"] == results(reference)[f"q{i}"]
    assert s.failed == 2 and s.done == 4


def test_job_timeout_stops_and_a_resume_finishes_identically(tmp_path, reference):
    out = tmp_path / "o.jsonl"
    s1 = job(out, SlowWhen(PromptEcho(), delay=0.04), job_timeout_s=0.35, batch_size=2)
    assert s1.status == "job_timeout" and s1.pending > 0 and s1.done + s1.pending == 12
    assert len(by_id(out)) == s1.done
    s2 = job(out)
    assert s2.status == "completed" and s2.done == s1.pending
    assert results(by_id(out)) == results(reference)


# ---------------------------------------------------------------------------------- determinism
def test_same_seed_same_output_whatever_the_batch_size_and_resume(tmp_path):
    cfg = DecodeConfig(gen_length=G, temperature=1.0, seed=7)
    dup = ["abc", "abc", "abc", "abc", "j", "hhhh", "dcba", "ee"]
    items = items_of(dup, ids=False)  # auto ids: identical prompts still get distinct ids
    runs = []
    for bs in (1, 3, 8):
        job(tmp_path / f"b{bs}.jsonl", items=items, config=cfg, batch_size=bs)
        runs.append(results(by_id(tmp_path / f"b{bs}.jsonl")))
    out = tmp_path / "resumed.jsonl"
    job(out, InterruptAt(PromptEcho(), at=4), items=items, config=cfg, batch_size=2)
    job(out, items=items, config=cfg, batch_size=5)
    runs.append(results(by_id(out)))
    assert runs[0] == runs[1] == runs[2] == runs[3]
    assert len(runs[0]) == 8 and all(i.startswith("h") for i in runs[0])
    abc = [runs[0][i]["text"] for i in runs[0] if runs[0][i]["prompt"] == "abc"]
    assert len(abc) == 4 and len(set(abc)) > 1  # per-item seeds: sampling differs between items
    own = [PromptItem("abc", "s1", {"seed": 8}), PromptItem("abc", "s2")]  # a per-item seed
    job(tmp_path / "own.jsonl", items=own, config=cfg)
    own_rows = by_id(tmp_path / "own.jsonl")
    assert own_rows["s1"]["seed"] == stable_seed(8, "s1") and own_rows["s2"]["seed"] == stable_seed(7, "s2")
    assert own_rows["s1"]["batch_size"] == 2  # a different seed alone does not split the batch
    other = tmp_path / "seed8.jsonl"
    job(other, items=items, config=DecodeConfig(gen_length=G, temperature=1.0, seed=8))
    assert {r["text"] for r in by_id(other).values()} != {r["text"] for r in runs[0].values()}


# ---------------------------------------------------------------------------------- validation
def test_out_of_range_parameters_are_refused_before_any_work(tmp_path):
    den = PromptEcho()
    out = tmp_path / "o.jsonl"
    cases = [
        (dict(controller=lambda **o: Knobs.build(eta=1.5)), "Knobs.eta=1.5 is out of range; allowed: number in [0, 1]"),
        (dict(controller=lambda **o: Knobs.build(k=0)), "Knobs.k=0 is out of range; allowed: integer in [1, inf)"),
        (dict(controller=lambda **o: Knobs.build(depth=-1)),
         "Knobs.depth=-1 is out of range; allowed: integer in [0, inf)"),
        (dict(config=DecodeConfig(gen_length=8, block_length=3)),
         "block_length=3 does not divide gen_length=8; allowed: a divisor of 8 (1, 2, 4, 8); on a block-causal "
         "model (LLaDA2.x, SDAR, Fast-dLLM v2) leave block_length unset: its trained block size is used"),
        (dict(batch_size=0), "batch_size=0 is out of range; allowed: integer in [1, inf)"),
        (dict(item_timeout_s=-1.0), "item_timeout_s=-1.0 is out of range; allowed: number in (0, inf) or null"),
    ]
    for kw, message in cases:
        with pytest.raises(ParameterError) as err:
            job(out, den, **kw)
        assert str(err.value) == message
    assert den.calls == 0 and not out.exists()


def test_invalid_per_item_params_refuse_listing_all_or_skip(tmp_path):
    items = [PromptItem("abc", "a", line=1), PromptItem("j", "b", {"eta": 1.5}, line=2),
             PromptItem("hh", "c", {"k": 0}, line=3), PromptItem("ji", "d", {"block_length": 3}, line=4),
             PromptItem("e", "e", {"etaa": 0.2}, line=5), PromptItem("dd", "f", {"k": 3, "gen_length": 4}, line=6)]
    den = PromptEcho()
    out = tmp_path / "o.jsonl"
    with pytest.raises(JobInputError) as err:
        job(out, den, items=items, controller=Knobs())
    assert str(err.value) == (
        "4 items with invalid params; the job did not start (use --on-bad-line skip to run the others):\n"
        "  line 2: params: Knobs.eta=1.5 is out of range; allowed: number in [0, 1]\n"
        "  line 3: params: Knobs.k=0 is out of range; allowed: integer in [1, inf)\n"
        "  line 4: params: block_length=3 does not divide gen_length=8; allowed: a divisor of 8 (1, 2, 4, 8); on a "
        "block-causal model (LLaDA2.x, SDAR, Fast-dLLM v2) leave block_length unset: its trained block size is used\n"
        "  line 5: params: unknown key 'etaa'; decoding options: block_add_threshold, block_length, cache, "
        "cache_refresh, eos_fill, eos_fill_threshold, eos_stop, gen_length, remask_budget, remask_per_position, "
        "seed, sub_block_cache, temperature, verification; Knobs parameters: depth, eta, k"
    )
    assert den.calls == 0 and not out.exists()
    s = job(out, den, items=items, controller=Knobs(), on_error="skip")
    rows = by_id(out)
    assert set(rows) == {"a", "f"} and [p.line for p in s.skipped] == [2, 3, 4, 5]
    assert rows["f"]["text"] == expected_text("dd", 4) and rows["f"]["params"] == {"k": 3, "gen_length": 4}
    assert rows["f"]["steps"] == 2  # k = 3 per step over 4 positions


def test_validate_row_names_every_problem(reference):
    row = dict(reference["q0"])
    validate_row(row)
    bad = {**row, "nfe": "3", "extra": 1, "fallback": True}
    del bad["seed"]
    with pytest.raises(RowSchemaError) as err:
        validate_row(bad)
    assert str(err.value) == ("row 'q0': unknown field 'extra'; missing field 'seed'; "
                              "'nfe' must be an integer or null, got str")
    with pytest.raises(RowSchemaError, match="'fallback_reason' must be a string exactly when 'fallback' is true"):
        validate_row({**row, "fallback": True})
    with pytest.raises(RowSchemaError, match="status 'ok' must have null 'error' and 'error_type'"):
        validate_row({**row, "error": "x", "error_type": "model"})
    with pytest.raises(RowSchemaError, match="status 'error' must have null 'text'"):
        validate_row({**row, "status": "error", "error": "x", "error_type": "model"})


def test_rows_count_remasks_and_files_of_the_earlier_schema_still_resume(tmp_path, reference):
    row = dict(reference["q0"])
    assert row["schema"] == "adec-generate/2" and row["remasks"] == 0  # FastDLLM never re-masks
    with pytest.raises(RowSchemaError, match="status 'ok' needs 'remasks'"):
        validate_row({**row, "remasks": None})
    with pytest.raises(RowSchemaError, match="missing field 'remasks'"):
        validate_row({k: v for k, v in row.items() if k != "remasks"})
    old = {k: v for k, v in row.items() if k != "remasks"} | {"schema": "adec-generate/1"}
    validate_row(old)  # a row written before the field existed
    with pytest.raises(RowSchemaError, match="unknown field 'remasks'"):
        validate_row({**old, "remasks": 0})
    with pytest.raises(RowSchemaError, match="'schema' is 'adec-generate/9'; allowed: 'adec-generate/1' or"):
        validate_row({**row, "schema": "adec-generate/9"})
    # a file written by the version before `remasks` (this job's first 3 items, interrupted): the resume
    # takes its settings as this job's, keeps those rows and writes the rest as /2
    out = tmp_path / "o.jsonl"
    out.write_bytes((Path(__file__).parents[1] / "fixtures" / "generate_v1_rows.jsonl").read_bytes())
    s = job(out)
    rows = by_id(out)
    assert s.done == len(PROMPTS) - 3 and len(rows) == len(PROMPTS)
    assert sorted(r["schema"][-1] for r in rows.values()) == ["1"] * 3 + ["2"] * (len(PROMPTS) - 3)


def test_item_deadline_is_checked_before_a_windowed_models_forwards_too():
    # the engine calls window_logits / shadow_window_logits of a windowed model, not its __call__
    from adaptive_decoding.framework.jobs.errors import DeadlineExceeded
    from adaptive_decoding.framework.jobs.guards import DeadlineModel
    from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser

    tiny = TinyDenoiser(TinyConfig(vocab_size=12, mask_token_id=11, pad_token_id=0, eos_token_id=1, max_len=16,
                                   d_model=16, n_layers=1, n_heads=2, d_ff=32)).eval()
    late = DeadlineModel(tiny, started=time.monotonic() - 10, item_limit=1.0, job_deadline=None, job_limit=None,
                          job_started=time.monotonic())
    x = torch.randint(2, 10, (1, 8))
    for call in (lambda: late.window_logits(x, None, torch.arange(4, 8)[None]),
                 lambda: late.shadow_window_logits(x, None, torch.arange(4, 8)[None]), lambda: late(x)):
        with pytest.raises(DeadlineExceeded):
            call()
    assert late.mask_token_id == 11 and late.supports_kv_cache  # everything else passes through


# ---------------------------------------------------------------------------------- CLI
def write_prompts(path: Path, lines: list) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_cli_generate_runs_resumes_and_reports(tmp_path, monkeypatch, capsys):
    from adaptive_decoding.framework import cli
    from adaptive_decoding.framework.cli import generate

    loads = []
    monkeypatch.setattr(generate, "load_model_for", lambda name, device, **options: loads.append(name) or model())
    inp = write_prompts(tmp_path / "p.jsonl", [{"prompt": p, "id": f"q{i}"} for i, p in enumerate(PROMPTS[:5])]
                        + ['{"prompt": 3}'])
    out = tmp_path / "r.jsonl"
    argv = ["generate", "--input", str(inp), "--output", str(out), "--model", "echo", "--set", "gen_length=8",
            "--set", "threshold=0.5", "--batch-size", "2", "--no-progress", "--on-bad-line", "skip",
            "--summary-json", str(tmp_path / "s.json")]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert 'skipping ' + str(inp) + ':6: "prompt" must be a string, got integer (3)' in err
    assert "done 5, failed 0" in err
    rows = by_id(out)
    assert {i: r["text"] for i, r in rows.items()} == {f"q{i}": expected_text(p, 8) for i, p in enumerate(PROMPTS[:5])}
    assert json.loads((tmp_path / "s.json").read_text())["done"] == 5
    assert cli.main(argv) == 0
    assert "done 0, failed 0, already in output 5" in capsys.readouterr().err
    # bad parameters: refused before the model is loaded
    assert cli.main(argv + ["--set", "block_length=3"]) == 2
    assert ("adec generate: error: block_length=3 does not divide gen_length=8; allowed: a divisor of 8 "
            "(1, 2, 4, 8)") in capsys.readouterr().err
    assert cli.main(argv + ["--batch-size", "0"]) == 2
    assert ("adec generate: error: --batch-size=0 is out of range; allowed: integer in [1, inf)"
            in capsys.readouterr().err)
    assert loads == ["echo", "echo"]


def _adec(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "adaptive_decoding.framework.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_cli_refuses_bad_lines_and_a_corrupt_checkpoint_naming_the_file(tmp_path, tiny_folder, capsys):
    from adaptive_decoding.framework import cli

    inp = write_prompts(tmp_path / "p.jsonl", [{"prompt": "12+34="}, "{oops", {"prompt": "1+2=", "idd": "x"}])
    out = tmp_path / "r.jsonl"
    assert cli.main(["generate", "--input", str(inp), "--output", str(out), "--model", "nowhere/model"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"adec generate: error: {inp}: 2 bad lines; the job did not start (use --on-bad-line skip to run the "
        "other lines):",
        "  line 2: not valid JSON: Expecting property name enclosed in double quotes (column 2)",
        '  line 3: unknown field "idd"; did you mean "id"? allowed fields: id, prompt, params, meta',
    ]
    assert not out.exists()
    write_prompts(inp, [{"prompt": "12+34="}])
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "model.pt"):
        (broken / name).write_bytes((tiny_folder / name).read_bytes())
    (broken / "model.pt").write_bytes(b"not a checkpoint")
    assert cli.main(["generate", "--input", str(inp), "--output", str(out), "--model", str(broken),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"adec generate: error: {broken / 'model.pt'}: cannot be read as a torch state dict" in err
    assert not out.exists()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A saved (untrained) tiny denoiser in the project's format: loads through load_model."""
    from adaptive_decoding.framework.models.saved import save_pretrained
    from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.tasks.vocab import get_tokenizer

    tok = get_tokenizer()
    cfg = TinyConfig(vocab_size=tok.vocab_size, mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                     eos_token_id=tok.eos_token_id, max_len=16, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    torch.manual_seed(0)
    return save_pretrained(tmp_path_factory.mktemp("model") / "m", TinyDenoiser(cfg), task=get_task("addition"),
                           recipe={}, metrics={})


@pytest.mark.slow  # a fresh interpreter imports every command (Lightning included): ~5-15 s
def test_adec_generate_subprocess_with_a_real_checkpoint(tmp_path, tiny_folder):
    inp = write_prompts(tmp_path / "p.jsonl", [{"prompt": "12+34=", "id": "a"}, {"prompt": "5+6=", "id": "b"},
                                               {"prompt": "123+456=" * 2, "id": "long"}])
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "adaptive_decoding.framework.cli", "generate", "--input", str(inp), "--output",
                           str(out), "--model", str(tiny_folder), "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr  # finished, with one error row
    assert "done 2, failed 1" in proc.stderr
    rows = by_id(out)
    assert rows["a"]["status"] == rows["b"]["status"] == "ok"
    assert len(rows["a"]["generated_ids"]) == 5  # the addition task's gen_length, read from the folder
    assert rows["long"]["error"] == ("prompt of 16 tokens + gen_length 5 = 21 positions exceeds the model's "
                                     "context of 16 positions")
