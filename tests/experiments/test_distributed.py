"""Scaling out: 2-process (gloo) evaluation equals one process; the multi-GPU experiment's code path on
a LLaDA-style checkpoint built from a config; a Lightning ``strategy="ddp"`` training smoke on 2 CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_decoding.experiments.distributed import merge_results, shard_indices, spawn
from adaptive_decoding.experiments.options import ExperimentOptions
from adaptive_decoding.experiments.workers import evaluate_jobs, run_experiment_worker

ROOT = Path(__file__).resolve().parents[2]
RANDOM_TINY = {"factory": "adaptive_decoding.experiments.cells:tiny_model", "kwargs": {"task": "addition", "train_steps": 0}}
TOY = {"factory": "adaptive_decoding.experiments.cells:toy_model", "kwargs": {"task": "addition"}}


def test_shards_cover_every_item_once():
    shards = [shard_indices(11, r, 3) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(11))
    assert [len(s) for s in shards] == [4, 4, 3]


def llada_like(tmp_path: Path) -> Path:
    import sys

    models_tests = str(Path(__file__).resolve().parents[1] / "models")
    if models_tests not in sys.path:  # also when this file runs without tests/models collected
        sys.path.insert(0, models_tests)
    from test_hub import (  # the hub tests' designed remote-code checkpoint
        VOCAB,
        llada_folder,
    )

    return llada_folder(tmp_path, vocab_size=len(VOCAB), mask_token_id=3)


def same(a, b) -> None:
    assert a.n == b.n
    assert [s.id for s in a.samples] == [s.id for s in b.samples]
    assert [s.output for s in a.samples] == [s.output for s in b.samples]
    assert [s.nfe for s in a.samples] == [s.nfe for s in b.samples]
    assert [s.correct for s in a.samples] == [s.correct for s in b.samples]
    assert (a.accuracy, a.nfe, a.tpf) == (b.accuracy, b.nfe, b.tpf)
    assert a.lookahead_nfe == pytest.approx(b.lookahead_nfe) and a.forced_steps == pytest.approx(b.forced_steps)


@pytest.mark.ddp
def test_two_process_evaluation_equals_one_process(tmp_path):
    hub = {"name": str(llada_like(tmp_path)), "kind": "llada"}
    jobs = [
        dict(model=TOY, task="addition", controller="fast_dllm", params={"threshold": 0.7}, n=11,
             batch_size=4),
        dict(model=RANDOM_TINY, task="addition", controller="margin_topk", params={"eta": 0.5, "k": 3}, n=9,
             batch_size=3, lookahead={"scorer": "logprob", "width": 3}),
        dict(model=hub, task="addition", controller="llada", params={"steps": 4}, decode={"gen_length": 8,
             "block_length": 4}, n=7, batch_size=2),
    ]
    single = evaluate_jobs(None, jobs)
    double = spawn(evaluate_jobs, 2, jobs)
    for a, b in zip(single, double):
        same(a, b)
        assert b.extra["world_size"] == 2
    assert single[1].lookahead_nfe > 0  # the lookahead really ran, on both sides
    assert len({s.nfe for s in single[0].samples}) > 1  # ragged NFE across samples


def test_merge_puts_samples_back_in_order_and_takes_the_slowest_rank():
    from adaptive_decoding.framework.engine.evaluate import EvalResult, SampleResult

    def part(ids, nfes, ms):
        s = [SampleResult(id=str(i), prompt="", answer="", output="", correct=float(i % 2), nfe=n, steps=n,
                          answer_tokens=i + 1) for i, n in zip(ids, nfes)]
        return EvalResult(task="t", strategy="x", n=len(s), accuracy=0, nfe=0, tpf=0, ms_per_token=ms,
                          peak_mem_mb=float(len(s)), samples=s, extra={"loop_overhead_ratio": 1.0 * len(s)})

    merged = merge_results([([0, 2], part([0, 2], [4, 2], 1.0)), ([1], part([1], [1], 5.0))], 3, gen_length=4)
    assert [s.id for s in merged.samples] == ["0", "1", "2"]
    assert merged.accuracy == pytest.approx(1 / 3) and merged.nfe == pytest.approx(7 / 3)
    # answers of 1, 2, 3 tokens in 4 + 1 + 2 forwards, pooled; the per-sample mean beside it
    assert merged.tpf == pytest.approx((1 + 2 + 3) / (4 + 1 + 2))
    assert merged.tpf_mean == pytest.approx((1 / 4 + 2 / 1 + 3 / 2) / 3)
    # rank 0 took 2 x 4 x 1 ms, rank 1 took 1 x 4 x 5 ms: wall = 20 ms over 12 positions
    assert merged.ms_per_token == pytest.approx(20 / 12) and merged.peak_mem_mb == 2.0
    assert merged.extra["loop_overhead_ratio"] == pytest.approx((2 * 2 + 1 * 1) / 3)


@pytest.mark.ddp
def test_multigpu_experiment_on_a_small_llada_checkpoint_two_processes(tmp_path):
    """experiments/configs/llada_multigpu.yaml with the checkpoint swapped for a LLaDA-style one built from a
    config: ``adec run --procs 2`` gives the same cells as one process."""
    overrides = {"model": {"name": str(llada_like(tmp_path)), "kind": "llada"}, "device": "cpu", "n": 6,
                 "batch_size": 2, "tasks": ["addition", {"name": "text", "metrics": ["repetition", "bleu"]}],
                 "decode": {"gen_length": 8, "block_length": 4}}
    path = str(ROOT / "experiments" / "configs" / "llada_multigpu.yaml")
    options = ExperimentOptions.from_flat({"wandb_mode": "disabled", "progress": False, "command": "test"})
    two = spawn(run_experiment_worker, 2, path, str(tmp_path / "two"), options, overrides)
    from adaptive_decoding.experiments.parse import load_experiment
    from adaptive_decoding.experiments.runner import run_experiment

    one = run_experiment(load_experiment(path, overrides=overrides), tmp_path / "one", options)
    assert len(one.rows) == len(two.rows) == 2 * 8
    for a, b in zip(one.rows, two.rows):
        assert (a["cell"], a["accuracy"], a["nfe"], a["tpf"], a["metrics"]) == \
               (b["cell"], b["accuracy"], b["nfe"], b["tpf"], b["metrics"])
        assert (a["world_size"], b["world_size"]) == (1, 2)
        sa = (tmp_path / "one" / "llada_multigpu" / "cells" / a["cell"] / "samples.jsonl").read_text()
        sb = (tmp_path / "two" / "llada_multigpu" / "cells" / b["cell"] / "samples.jsonl").read_text()
        assert [json.loads(x)["output"] for x in sa.splitlines()] == [json.loads(x)["output"]
                                                                      for x in sb.splitlines()]
    assert {r["kind"] for r in two.rows} >= {"reference", "baseline", "heuristic", "oracle"}


SPAWN_SCRIPT = """
import sys
from adaptive_decoding.experiments.distributed import spawn

def hello(ctx, word):
    out = ctx.gather(ctx.rank)
    print(f"rank {ctx.rank} of {ctx.world_size} says {word} to {out}")  # not flushed: a pipe buffers it
    return sum(out)

if __name__ == "__main__":
    print("result", spawn(hello, 2, "hi"))
"""


@pytest.mark.ddp
def test_spawned_ranks_leave_cleanly_and_keep_what_they_printed(tmp_path):
    """A spawned rank skips the interpreter's shutdown (gloo's threads aborted it there now and then), so it
    must flush its own output first: both ranks' unflushed lines reach a piped stdout and spawn returns."""
    script = tmp_path / "hello.py"
    script.write_text(SPAWN_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONUNBUFFERED"}  # block-buffered, as usual on a pipe
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "rank 0 of 2 says hi to [0, 1]" in lines and "rank 1 of 2 says hi to [0, 1]" in lines
    assert lines[-1] == "result 1"


@pytest.mark.ddp
def test_lightning_ddp_training_smoke_on_two_cpu_processes(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "adaptive_decoding.experiments.workers", "train-smoke", "--out", str(tmp_path),
                           "--steps", "3", "--batch-size", "16"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2 and {r0["rank"], r1["rank"]} == {0, 1}
    assert r0["strategy"] == "DDPStrategy" and r0["global_step"] == r1["global_step"] == 3
    assert r0["checksum"] == r1["checksum"] and r0["abs_checksum"] == r1["abs_checksum"]  # gradients all-reduced
