"""Every workflow on a block-causal checkpoint: ``adec decode``, ``bench``, ``run`` (+ ``report``),
``tune``, ``train-controller``, ``generate`` and ``adec lm-eval`` on a tiny LLaDA2-MoE checkpoint in
the real on-disk format (sharded safetensors with an index, ``model_type`` ``llada2_moe``, blocks of
4) with a byte-level BPE and its chat template next to it, loaded by ``--model DIR``
(issue 38, item 5; the same workflows on LLaDA- and Dream-format checkpoints are in
tests/cli/test_own_model_workflows.py).

The checkpoint's weights are random; its LM head is multiplied by 40 on disk (as
tests/engine/test_block_causal.py does in memory), so that its predictions are confident enough
for threshold rules to commit several tokens in one forward. The data files are made to be partly
right: their answers are what one-token-per-step decoding of the checkpoint writes, except every
fourth row's, so ``sequential`` scores exactly 3/4 with exactly G forwards in every workflow.

The refusals are checked before any forward (the LLaDA2 forward is patched to fail the test if it runs).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import yaml

from adaptive_decoding.framework.cli.main import main

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read when datasets is imported: the jsonl files are local

ROOT = Path(__file__).resolve().parents[2]
BS = 4  # the checkpoint's block size (config.json ``block_size``)
HEAD_SCALE = 40.0
GEN = dict(gen_length=8, block_length=BS)
QUESTIONS = ["Ann has 5 apples.", "Ben sold 12 clips.", "What is 12 times 7?", "She sold half as many.",
             "Weng earns $12 an hour.", "add(2, 3) == 5", "The answer is 0.5.", "How many clips?"]
#: prompts for decode / generate: their chat-templated lengths fall at different offsets in a block
PROMPTS = ["hi", "What is 12 times 7?", "Natalia sold clips to 48 of her friends in April."]
LM_TASKS = ROOT / "tests" / "fixtures" / "lm_eval"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sharpen(folder: Path, scale: float = HEAD_SCALE) -> None:
    """Multiply ``lm_head.weight`` by ``scale`` in the shard that holds it (the index names it)."""
    from safetensors.torch import load_file, save_file

    shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
    tensors = load_file(shard)
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * scale
    save_file(tensors, shard, metadata={"format": "pt"})


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _answered(loaded, questions: list[str]) -> list[dict]:
    """Rows whose answer is the one-token-per-step decode of the question, every fourth one wrong."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import decode_texts

    texts, _, _ = decode_texts(loaded, questions, build_controller("sequential"), DecodeConfig(**GEN))
    return [{"question": q, "answer": t if i % 4 != 3 else "no such answer"}
            for i, (q, t) in enumerate(zip(questions, texts))]


@pytest.fixture(scope="module")
def l2(tmp_path_factory):
    """The LLaDA2-format folder, its loaded model, train (8) / validation (4) / test (4) JSONL files
    answered by :func:`_answered`, the data task's parameters and their ``--task-param`` flags."""
    from adaptive_decoding.framework.models.zoo import load_model

    tmp = tmp_path_factory.mktemp("llada2-workflows")
    fx = _module(ROOT / "tests" / "fixtures" / "real_format" / "tokenizers.py", "_adec_tok_llada2_workflows")
    folder = fx.llada2_with_tokenizer(tmp / "llada2", "bpe", seed=3, block_size=BS)
    _sharpen(folder)
    loaded = load_model(str(folder), device="cpu", dtype="float32")
    assert loaded.info["kind"] == "llada2" and loaded.denoiser.block_size == BS
    rows = _answered(loaded, QUESTIONS)
    files = {"train": _write(tmp / "train.jsonl", rows), "validation": _write(tmp / "validation.jsonl", rows[:4]),
             "test": _write(tmp / "test.jsonl", rows[4:])}
    params = dict(**{split: str(path) for split, path in files.items()}, template="{question}", answer="answer",
                  metric="exact", **GEN)
    return {"folder": str(folder), "loaded": loaded, "params": params, "tmp": tmp,
            "args": [f"--task-param={k}={v}" for k, v in params.items()]}


def _task(l2, **over):
    from adaptive_decoding.framework.tasks.base import get_task

    return get_task("data", **{**l2["params"], **over})


def _evaluate(l2, controller: str, n: int = 4, **cfg):
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import evaluate

    name, _, rest = controller.partition(":")
    params = dict(kv.split("=") for kv in rest.split(",") if kv)
    ctrl = build_controller(name, **{k: float(v) for k, v in params.items()})
    return evaluate(l2["loaded"], _task(l2), ctrl, DecodeConfig(**{**GEN, **cfg}), n=n)


@pytest.fixture
def no_forward(monkeypatch):
    """Any forward of the LLaDA2-MoE network fails the test: what must fail before any work does."""
    from adaptive_decoding.framework.models.arch import LLaDA2MoeModel

    def boom(self, *a, **k):
        raise AssertionError("the model ran a forward")

    monkeypatch.setattr(LLaDA2MoeModel, "forward", boom)


def decode_json(capsys, *argv: str) -> list[dict]:
    rc = main(["decode", *argv, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


# ----------------------------------------------------------------------------------------- adec decode
def test_decode_llada2_cache_block_equals_none_and_the_engine(l2, capsys):
    """``--controller llada2 --set cache=block``: the same tokens and forwards as ``cache=none``, at
    batch 3 and batch 1, for prompts ending at different offsets in a block and a G that is no
    multiple of the block size; G tokens per row, no mask left; several tokens per forward (the
    threshold rule acts); and what ``decode()`` writes for the same ids from Python."""
    import torch

    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.loop import decode

    base = ["--model", l2["folder"], "--device", "cpu", "--dtype", "float32", "--controller", "llada2",
            "--set", "threshold=0.5", "--set", "gen_length=10", *[a for p in PROMPTS for a in ("--prompt", p)]]
    none = decode_json(capsys, *base)
    block = decode_json(capsys, *base, "--set", "cache=block")
    single = decode_json(capsys, *base, "--set", "cache=block", "--batch-size", "1")
    assert len(none) == len(block) == len(single) == len(PROMPTS)
    assert len({len(r["prompt_ids"]) % BS for r in none}) > 1  # the rows' blocks are aligned differently
    mask = l2["loaded"].denoiser.mask_token_id
    for a, b, c in zip(none, block, single):
        assert a["controller"] == "llada2" and a["chat_template"] is True
        assert len(a["generated_ids"]) == 10 and mask not in a["generated_ids"]
        assert a["generated_ids"] == b["generated_ids"] == c["generated_ids"]
        assert a["nfe"] == b["nfe"] == c["nfe"] and 1 <= a["answer_tokens"] <= 10
    assert max(r["tokens_per_forward"] for r in none) > 1.0
    res = decode(l2["loaded"].denoiser, [r["prompt_ids"] for r in none], build_controller("llada2", threshold=0.5),
                 DecodeConfig(gen_length=10))
    assert res.generated.tolist() == [r["generated_ids"] for r in none]
    assert res.nfe.tolist() == [r["nfe"] for r in none]
    assert torch.equal(res.answer_tokens, torch.tensor([r["answer_tokens"] for r in none]))


@pytest.mark.parametrize("sets, named, allowed", [
    (["block_length=8", "gen_length=16"], "block_length=8 is not the block size this block-causal model was "
                                          "trained with", "allowed: 4 (or null for it)"),
    (["block_length=2", "gen_length=8"], "block_length=2 is not the block size", "allowed: 4 (or null for it)"),
    (["cache=dual"], "cache='dual' does not apply to a block-causal model", "allowed: none, block"),
    (["cache=prefix"], "cache='prefix' does not apply to a block-causal model", "allowed: none, block"),
])
def test_decode_refuses_what_the_model_has_no_meaning_for_before_any_forward(l2, no_forward, capsys, sets,
                                                                              named, allowed):
    argv = ["decode", "--model", l2["folder"], "--device", "cpu", "--controller", "llada2", "--prompt", "hi",
            *[a for s in sets for a in ("--set", s)], "--json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    # (another test's logging handler may print before it: the error is its own line)
    assert out == "" and any(line.startswith("adec decode: error: ") for line in err.splitlines())
    assert named in err and allowed in err


def test_a_block_length_that_does_not_divide_g_says_to_leave_it_unset(l2, capsys):
    """A configuration is validated before the model is loaded, as a full-attention model's is, so a
    block length that does not divide G is refused then; the message says what a block-causal model
    needs (no block_length: its own is used, and then G need not be a multiple of it)."""
    argv = ["decode", "--model", l2["folder"], "--device", "cpu", "--controller", "llada2", "--prompt", "hi",
            "--set", "block_length=8", "--set", "gen_length=12"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "block_length=8 does not divide gen_length=12" in err and "leave block_length unset" in err
    base = ["--model", l2["folder"], "--device", "cpu", "--controller", "llada2", "--prompt", "hi",
            "--set", "gen_length=10"]
    assert len(decode_json(capsys, *base)[0]["generated_ids"]) == 10  # G = 10 with blocks of 4: fine unset


# ------------------------------------------------------------------------------------------ adec bench
def test_bench_on_the_data_task_scores_and_caches_exactly(l2, tmp_path):
    """Three controllers over the data task: the one-token-per-step row scores exactly 3/4 in G
    forwards, the threshold rules fewer; each row's figures are the engine's, and ``cache=block``
    changes no accuracy and no forward count."""
    rows = {}
    for cache in ("none", "block"):
        out = tmp_path / f"bench-{cache}.json"
        assert main(["bench", "--task", "data", "--model", l2["folder"], "--device", "cpu", *l2["args"],
                     "--controller", "sequential", "--controller", "llada2:threshold=0.5",
                     "--controller", "fast_dllm:threshold=0.5", "--n", "4", "--set", f"cache={cache}",
                     "--json", str(out), "--no-plot"]) == 0
        rows[cache] = {r["strategy"]: r for r in json.loads(out.read_text())}
    none, block = rows["none"], rows["block"]
    assert list(none) == ["sequential", "llada2:threshold=0.5", "fast_dllm:threshold=0.5"]
    assert all(r["n"] == 4 for r in none.values())
    assert none["sequential"]["accuracy"] == 0.75 and none["sequential"]["nfe"] == 8.0
    for label in none:
        assert (block[label]["accuracy"], block[label]["nfe"]) == (none[label]["accuracy"], none[label]["nfe"])
    assert none["llada2:threshold=0.5"]["nfe"] < 8.0 and none["llada2:threshold=0.5"]["tpf"] > 1.0
    want = _evaluate(l2, "llada2:threshold=0.5")
    assert (none["llada2:threshold=0.5"]["accuracy"], none["llada2:threshold=0.5"]["nfe"]) == (want.accuracy, want.nfe)


def test_bench_refuses_a_task_block_length_the_model_was_not_trained_with(l2, no_forward, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--task", "data", "--model", l2["folder"], "--device", "cpu", *l2["args"],
                 "--task-param=block_length=8", "--controller", "llada2", "--n", "2", "--json", str(out),
                 "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "adec bench: error: block_length=8 is not the block size" in err and "allowed: 4" in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["run", "tune", "train-controller"])
def test_run_tune_and_train_controller_refuse_a_block_length_before_any_forward(l2, no_forward, tmp_path, capsys,
                                                                                command):
    """A task block length the model was not trained with fails each task workflow with the message that
    names it and the model's block size, before the model runs once."""
    params = {**l2["params"], "block_length": 8}
    if command == "run":
        exp = tmp_path / "bad.yaml"
        exp.write_text(yaml.safe_dump({"name": "bad", "model": l2["folder"], "device": "cpu", "n": 2, "seeds": [0],
                                       "tasks": [{"name": "data", "params": params}],
                                       "strategies": [{"controller": "llada2"}]}))
        argv = ["run", str(exp), "--out", str(tmp_path / "runs"), "--wandb", "disabled", "--no-progress"]
    else:
        argv = [command, "--task", "data", "--model", l2["folder"], "--device", "cpu",
                *[f"--task-param={k}={v}" for k, v in params.items()], "--out", str(tmp_path / "out")]
        argv += (["--controller", "llada2", "--n-trials", "2", "--n-val", "2", "--n-test", "2", "--no-plot"]
                 if command == "tune" else
                 ["--policy", "logreg", "--n-train", "4", "--n-val", "2", "--n-test", "2", "--wandb", "disabled"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"adec {command}: error: block_length=8 is not the block size" in err and "allowed: 4 (or null" in err


# -------------------------------------------------------------------------------- adec run, adec report
def test_run_sweeps_llada2_and_reports_its_aup(l2, tmp_path):
    """``adec run``: the one-token-per-step strategy, LLaDA2.0's rule swept over its threshold, and
    the same rule with the exact block cache; then ``adec report``: a curve and an AUP per strategy."""
    exp = tmp_path / "llada2.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "llada2", "model": {"name": l2["folder"], "dtype": "float32"}, "device": "cpu", "n": 4,
        "batch_size": 4, "seeds": [0], "tasks": [{"name": "data", "label": "mydata", "params": l2["params"]}],
        "strategies": [{"label": "sequential", "controller": "sequential"},
                       {"label": "llada2", "controller": "llada2", "sweep": {"threshold": [0.9, 0.5]}},
                       {"label": "llada2 cached", "controller": "llada2", "params": {"threshold": 0.5},
                        "decode": {"cache": "block"}}],
    }))
    runs = tmp_path / "runs"
    assert main(["run", str(exp), "--out", str(runs), "--wandb", "disabled", "--no-progress"]) == 0
    rows = {r["strategy"]: r for r in json.loads((runs / "llada2" / "summary.json").read_text())}
    assert set(rows) == {"sequential", "llada2 (threshold=0.9)", "llada2 (threshold=0.5)", "llada2 cached"}
    assert all(r["n"] == 4 and r["task"] == "mydata" for r in rows.values())
    assert rows["sequential"]["accuracy"] == 0.75 and rows["sequential"]["nfe"] == 8.0
    fast, cached = rows["llada2 (threshold=0.5)"], rows["llada2 cached"]
    assert (cached["accuracy"], cached["nfe"]) == (fast["accuracy"], fast["nfe"]) and fast["nfe"] < 8.0
    assert cached["decode"] == {"cache": "block"}
    assert rows["llada2 (threshold=0.9)"]["nfe"] >= fast["nfe"]
    want = _evaluate(l2, "llada2:threshold=0.5")
    assert (fast["accuracy"], fast["nfe"]) == (want.accuracy, want.nfe)
    assert main(["report", "--runs", str(runs / "llada2"), "--out", str(tmp_path / "docs")]) == 0
    report = json.loads((tmp_path / "docs" / "benchmark.json").read_text())["tasks"]["mydata"]
    assert set(report["aup"]) == {"sequential", "llada2", "llada2 cached"}
    assert all(v >= 0 for v in report["aup"].values())
    assert report["curves"]["llada2"] == ["llada2 (threshold=0.9)", "llada2 (threshold=0.5)"]
    assert report["aup"]["sequential"] == pytest.approx(75.0)  # one point: accuracy % · 1 token per forward


# ------------------------------------------------------------------------------------------- adec tune
def test_tune_llada2_exports_a_point_inside_the_range_that_decodes(l2, tmp_path):
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import evaluate

    out = tmp_path / "tune"
    assert main(["tune", "--controller", "llada2", "--task", "data", "--model", l2["folder"], "--device", "cpu",
                 *l2["args"], "--n-trials", "3", "--range", "threshold=0.5:0.9", "--n-val", "4", "--n-test", "4",
                 "--out", str(out), "--no-plot", "--no-prune"]) == 0
    exported = list(out.glob("*.yaml"))
    assert len(exported) == 1
    point = yaml.safe_load(exported[0].read_text())
    assert point["controller"] == "llada2" and 0.5 <= point["params"]["threshold"] <= 0.9
    ctrl = build_controller(f"tuned:{exported[0]}")
    assert ctrl.get_params()["threshold"] == point["params"]["threshold"]
    res = evaluate(l2["loaded"], _task(l2), ctrl, DecodeConfig(**GEN, cache="block"), n=4)
    assert res.n == 4 and 2.0 <= res.nfe <= 8.0


# ------------------------------------------------------------------------------ adec train-controller
def test_train_controller_trains_a_policy_that_decodes_llada2(l2, tmp_path):
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import evaluate

    out = tmp_path / "policy"
    assert main(["train-controller", "--task", "data", "--model", l2["folder"], "--device", "cpu", *l2["args"],
                 "--policy", "logreg", "--n-train", "4", "--n-val", "2", "--n-test", "2", "--out", str(out),
                 "--wandb", "disabled", "--decode-batch-size", "4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"]["train_rows"] > 0 and (out / "logreg.pt").exists()
    ctrl = build_controller("logreg", policy=str(out / "logreg.pt"))
    none = evaluate(l2["loaded"], _task(l2), ctrl, DecodeConfig(**GEN), n=4)
    block = evaluate(l2["loaded"], _task(l2), ctrl, DecodeConfig(**GEN, cache="block"), n=4)
    assert none.n == 4 and 2.0 <= none.nfe <= 8.0
    assert (block.accuracy, block.nfe) == (none.accuracy, none.nfe)


# --------------------------------------------------------------------------------------- adec generate
def test_generate_a_prompts_file_writes_what_decode_writes(l2, tmp_path, capsys):
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    _write(inp, [{"prompt": p, "id": f"p{i}"} for i, p in enumerate(PROMPTS)])
    assert main(["generate", "--input", str(inp), "--output", str(out), "--model", l2["folder"], "--device", "cpu",
                 "--controller", "llada2", "--set", "threshold=0.5", "--set", "gen_length=10",
                 "--set", "cache=block", "--no-progress"]) == 0, capsys.readouterr().err
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == ["p0", "p1", "p2"] and all(r["status"] == "ok" for r in rows.values())
    want = decode_json(capsys, "--model", l2["folder"], "--device", "cpu", "--controller", "llada2",
                       "--set", "threshold=0.5", "--set", "gen_length=10", *[a for p in PROMPTS for a in ("--prompt", p)])
    for i, w in enumerate(want):
        got = rows[f"p{i}"]
        assert got["prompt_ids"] == w["prompt_ids"] and len(got["generated_ids"]) == 10
        assert (got["generated_ids"], got["nfe"]) == (w["generated_ids"], w["nfe"])


def test_generate_the_data_task_scores_the_sequential_rows_exactly(l2, tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    assert main(["generate", "--task", "data", *l2["args"], "--model", l2["folder"], "--device", "cpu",
                 "--controller", "sequential", "--set", "cache=block", "--output", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "done 4, failed 0" in err and "score: 0.750 (exact) over 4 of 4 rows" in err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["nfe"] == 8 and len(r["generated_ids"]) == 8 for r in rows)


@pytest.mark.parametrize("sets, named", [(["block_length=8", "gen_length=16"], "allowed: 4"),
                                         (["cache=dual"], "allowed: none, block")])
def test_generate_refuses_a_setting_the_model_refuses_before_any_item(l2, tmp_path, capsys, sets, named):
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    _write(inp, [{"prompt": "hi", "id": "p0"}])
    assert main(["generate", "--input", str(inp), "--output", str(out), "--model", l2["folder"], "--device", "cpu",
                 "--controller", "llada2", *[a for s in sets for a in ("--set", s)], "--no-progress",
                 "--max-retries", "0"]) == 2
    assert named in capsys.readouterr().err and not out.exists()


# ---------------------------------------------------------------------------------------- adec lm-eval
@pytest.fixture
def lm_eval_env(monkeypatch, tmp_path):
    """lm-eval offline over the fixture tasks (their data_files are relative to the repository root)."""
    pytest.importorskip("lm_eval")
    import datasets

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets", raising=False)
    return tmp_path


def test_lm_eval_generate_until_on_llada2_equals_decode_with_either_cache(l2, lm_eval_env, monkeypatch, capsys):
    """lm-eval's generate_until through the ``adec`` model on the LLaDA2 folder (``model=DIR``):
    each answer is ``decode()``'s text cut at the task's ``until``, with and without the block cache;
    then ``adec lm-eval run`` prints the task's exact_match."""
    import lm_eval
    import lm_eval.tasks

    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import decode_texts
    from adaptive_decoding.framework.integrations import lm_eval_model  # noqa: F401  (registers lm-eval's "adec" model)

    prompts = [json.loads(line)["prompt"] for line in (LM_TASKS / "copy_gen.jsonl").read_text().splitlines()]
    texts, results, _ = decode_texts(l2["loaded"], prompts, build_controller("llada2", threshold=0.5),
                                     DecodeConfig(gen_length=8))
    want = [t.split("+")[0] for t in texts]
    nfe = sum(float(r.nfe.float().sum()) for r in results) / len(prompts)
    tm = lm_eval.tasks.TaskManager(include_path=str(LM_TASKS), include_defaults=False)
    for cache in ("none", "block"):
        res = lm_eval.simple_evaluate(
            model="adec", tasks=["adec_copy_gen"], task_manager=tm, log_samples=True, bootstrap_iters=0,
            model_args=f"model={l2['folder']},controller=llada2,threshold=0.5,gen_length=8,cache={cache}",
            device="cpu", batch_size=2)
        got = [s["resps"][0][0] for s in sorted(res["samples"]["adec_copy_gen"], key=lambda s: s["doc_id"])]
        assert got == want
        assert res["config"]["adec_controller"] == "llada2" and res["config"]["adec_decode"]["cache"] == cache
        assert res["config"]["adec_mean_nfe"] == pytest.approx(nfe)

    class LocalTasks(lm_eval.tasks.TaskManager):  # only the fixture tasks: indexing lm-eval's own takes long
        def __init__(self, *a, **kw):
            super().__init__(*a, include_defaults=False, **kw)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTasks)
    capsys.readouterr()
    assert main(["lm-eval", "run", "--model_args", f"model={l2['folder']},controller=llada2,gen_length=8,cache=block",
                 "--tasks", "adec_copy_gen", "--include_path", str(LM_TASKS), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "adec_copy_gen" in out and "exact_match" in out


@pytest.mark.parametrize("args, named", [({"cache": "dual"}, "allowed: none, block"),
                                         ({"block_length": 8, "gen_length": 16}, "allowed: 4")])
def test_lm_eval_model_refuses_what_the_block_causal_model_refuses_when_built(l2, args, named):
    pytest.importorskip("lm_eval")
    from adaptive_decoding.framework.core.params import ParameterError
    from adaptive_decoding.framework.integrations.lm_eval_model import AdecLM

    with pytest.raises(ParameterError, match=named):
        AdecLM.create_from_arg_obj({"model": l2["loaded"], "controller": "llada2", **args})

