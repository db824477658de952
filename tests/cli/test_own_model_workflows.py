"""Every workflow on a researcher's own checkpoint and data: ``adec bench``, ``adec tune``,
``adec train-controller`` and ``adec run`` + ``adec report`` over the ``data`` task and an lm-eval
task, on a tiny LLaDA-format checkpoint with BERT's WordPiece tokenizer and a tiny Dream-format one
with a byte-level BPE (the real on-disk formats, built from configs, loaded by the framework's own
architectures).

The checkpoints have random weights, so the data file is made to be partly right: its answers are
what one-token-per-step decoding of that checkpoint writes, except every fourth row's. A sequential
row must then score exactly 3/4 in every workflow, and the figures of a command equal those of the
same decode run from Python.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from adaptive_decoding.framework.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
GEN = dict(gen_length=16, block_length=8)


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _questions(path: Path, start: int, stop: int) -> list[str]:
    return [json.loads(line)["question"] for line in path.read_text().splitlines()[start:stop]]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _answered(loaded, questions: list[str]) -> list[dict]:
    """Rows whose answer is the sequential decode of the question (the data task's template is
    ``{question}``, so the prompt is the question), every fourth one wrong."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import decode_texts

    texts, _, _ = decode_texts(loaded, questions, build_controller("llada"), DecodeConfig(**GEN))
    return [{"question": q, "answer": t if i % 4 != 3 else "no such answer"}
            for i, (q, t) in enumerate(zip(questions, texts))]


@pytest.fixture(scope="module", params=["llada", "dream"])
def own(request, tmp_path_factory):
    """A real-format checkpoint folder, train (16), validation (8) and test (8) JSONL files answered by
    :func:`_answered`, the data task's parameters and their ``--task-param`` flags."""
    from adaptive_decoding.framework.models.zoo import load_model

    kind = request.param
    tmp = tmp_path_factory.mktemp(f"own-{kind}")
    fx = _module(ROOT / "tests" / "fixtures" / "real_format" / "tokenizers.py", f"_adec_tok_{kind}")
    folder = (fx.llada_with_tokenizer(tmp / "llada", "wordpiece") if kind == "llada"
              else fx.dream_with_tokenizer(tmp / "dream", "bpe"))
    data = _module(ROOT / "tests" / "fixtures" / "data" / "build.py", f"_adec_data_{kind}").build_all(tmp / "data")
    loaded = load_model(str(folder), device="cpu")
    rows = {"train": ("train", 0, 16), "validation": ("train", 16, 24), "test": ("test", 0, 8)}
    files = {split: _write(tmp / f"{split}.jsonl", _answered(loaded, _questions(data[f"gsm8k_{src}"], a, b)))
             for split, (src, a, b) in rows.items()}
    params = dict(**{split: str(path) for split, path in files.items()}, template="{question}",
                  answer="answer", metric="exact", **GEN)
    args = [f"--task-param={k}={v}" for k, v in params.items()]
    return {"kind": kind, "folder": str(folder), "params": params, "args": args, "tmp": tmp, "data": data,
            "loaded": loaded}


def _data_task(own):
    from adaptive_decoding.framework.tasks.base import get_task

    return get_task("data", **own["params"])


def test_bench_on_the_data_task_scores_the_sequential_row_exactly(own, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--task", "data", "--model", own["folder"], "--device", "cpu", *own["args"],
                 "--controller", "llada", "--controller", "fast_dllm:threshold=0.5", "--n", "8",
                 "--json", str(out)]) == 0
    rows = {r["strategy"]: r for r in json.loads(out.read_text())}
    assert rows["llada"]["accuracy"] == 0.75 and rows["llada"]["nfe"] == 16.0  # one token per step
    assert 2.0 <= rows["fast_dllm:threshold=0.5"]["nfe"] <= 16.0  # at least one forward per block


def test_bench_without_a_model_on_the_data_task_names_the_flag(own, capsys):
    assert main(["bench", "--task", "data", *own["args"], "--n", "2"]) == 2
    assert "task 'data' has no built-in model; name one with --model" in capsys.readouterr().err


def test_tune_on_the_data_task_with_a_range_exports_a_point_inside_it(own, tmp_path):
    out = tmp_path / "tune"
    assert main(["tune", "--controller", "fast_dllm", "--task", "data", "--model", own["folder"], "--device", "cpu",
                 *own["args"], "--n-trials", "3", "--range", "threshold=0.5:0.9", "--n-val", "4", "--n-test", "8",
                 "--out", str(out), "--no-plot", "--no-prune"]) == 0
    exported = [p for p in out.glob("*.yaml")]
    assert len(exported) == 1
    point = yaml.safe_load(exported[0].read_text())
    assert point["controller"] == "fast_dllm" and 0.5 <= point["params"]["threshold"] <= 0.9
    from adaptive_decoding.framework.engine.controller_io import build_controller

    assert build_controller(f"tuned:{exported[0]}").get_params()["threshold"] == point["params"]["threshold"]


def test_tune_range_outside_the_bounds_fails_before_any_work(own, tmp_path, capsys):
    assert main(["tune", "--controller", "margin_topk", "--task", "data", "--model", own["folder"],
                 *own["args"], "--range", "eta=2:3", "--out", str(tmp_path / "t")]) == 2
    assert "eta" in capsys.readouterr().err and not (tmp_path / "t").exists()


def test_train_controller_on_the_data_task_trains_a_policy_that_decodes(own, tmp_path):
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import evaluate

    out = tmp_path / "policy"
    assert main(["train-controller", "--task", "data", "--model", own["folder"], "--device", "cpu", *own["args"],
                 "--policy", "logreg", "--n-train", "8", "--n-val", "4", "--n-test", "8", "--out", str(out),
                 "--wandb", "disabled", "--decode-batch-size", "4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"]["train_rows"] > 0 and (out / "logreg.pt").exists()
    res = evaluate(own["loaded"], _data_task(own), build_controller("logreg", policy=str(out / "logreg.pt")),
                   DecodeConfig(**GEN), n=8)
    assert 2.0 <= res.nfe <= 16.0 and res.n == 8


def test_run_and_report_sweep_the_data_and_lm_eval_tasks_with_aup(own, tmp_path):
    """``adec run`` over the data task and a local lm-eval task (two strategies, one swept), then
    ``adec report``: every cell's figures, a curve per swept strategy and its AUP for both tasks."""
    exp = tmp_path / "own.yaml"
    lm_dir = own["data"]["lm_eval_yaml"].parent
    exp.write_text(yaml.safe_dump({
        "name": "own", "model": {"name": own["folder"], "dtype": "float32"}, "device": "cpu", "n": 8,
        "batch_size": 8, "seeds": [0],
        "tasks": [{"name": "data", "label": "mydata", "params": own["params"]},
                  {"name": "lm_eval", "params": {"task": "gsm8k_local", "include_path": str(lm_dir),
                                                 "include_defaults": False, "num_fewshot": 0, **GEN}}],
        "strategies": [{"label": "llada", "controller": "llada"},
                       {"label": "fast_dllm", "controller": "fast_dllm", "sweep": {"threshold": [0.9, 0.5]}}],
    }, allow_unicode=True))
    assert main(["run", str(exp), "--out", str(tmp_path / "runs"), "--wandb", "disabled", "--no-progress"]) == 0
    rows = json.loads((tmp_path / "runs" / "own" / "summary.json").read_text())
    lm_key = "lm_eval(block_length=8,gen_length=16,include_defaults=False,include_path=data,num_fewshot=0,task=gsm8k_local)"
    assert len(rows) == 6 and {r["task"] for r in rows} == {"mydata", lm_key}  # a path by its last part
    seq = {r["task"]: r for r in rows if r["strategy"] == "llada"}
    assert seq["mydata"]["accuracy"] == 0.75 and seq["mydata"]["nfe"] == 16.0 and seq[lm_key]["nfe"] == 16.0
    assert main(["report", "--runs", str(tmp_path / "runs" / "own"), "--out", str(tmp_path / "docs")]) == 0
    report = json.loads((tmp_path / "docs" / "benchmark.json").read_text())
    for task in ("mydata", lm_key):
        aup = report["tasks"][task]["aup"]
        assert set(aup) == {"llada", "fast_dllm"} and all(v >= 0 for v in aup.values())
        assert report["tasks"][task]["curves"]["fast_dllm"] == ["fast_dllm (threshold=0.9)",
                                                                "fast_dllm (threshold=0.5)"]
    assert report["tasks"]["mydata"]["aup"]["llada"] == pytest.approx(75.0)  # one point: y·tokens per forward


def test_run_tunes_a_strategy_with_a_space_per_task_and_reuses_the_point(own, tmp_path):
    """A ``tune:`` strategy: the controller is tuned on the data task's validation split inside the
    run (the range from ``space``), its cells use the exported point, and a rerun tunes nothing."""
    exp = tmp_path / "tuned.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "tuned", "model": own["folder"], "device": "cpu", "n": 8, "batch_size": 8, "seeds": [0, 1],
        "tasks": [{"name": "data", "label": "mydata", "params": own["params"]}],
        "strategies": [{"label": "fast_dllm (tuned)", "controller": "fast_dllm",
                        "tune": {"n_trials": 3, "n_val": 4, "space": {"threshold": [0.5, 0.9]}}}],
    }))
    runs = tmp_path / "runs"
    assert main(["run", str(exp), "--out", str(runs), "--wandb", "disabled", "--no-progress"]) == 0
    rows = json.loads((runs / "tuned" / "summary.json").read_text())
    points = {r["params"]["threshold"] for r in rows}
    assert len(rows) == 2 and len(points) == 1 and 0.5 <= points.pop() <= 0.9  # both seeds, one point
    assert {r["kind"] for r in rows} == {"tuned"}
    exported = list((runs / "tuned" / "tuned").glob("*.yaml"))
    assert len(exported) == 1
    stamp = exported[0].stat().st_mtime_ns
    assert main(["run", str(exp), "--out", str(runs), "--wandb", "disabled", "--no-progress", "--overwrite"]) == 0
    assert exported[0].stat().st_mtime_ns == stamp  # the point is reused, not tuned again


@pytest.mark.parametrize("tune, message", [
    ({"space": {"eta": "2:3"}}, r"strategies\[0\].tune.space: margin_topk.eta range 2:3 is outside"),
    ({"space": {"eta": "0.9"}}, r"strategies\[0\].tune.space: eta: '0.9' is not allowed"),
    ({"n_trials": 0}, r"strategies\[0\].tune.n_trials: 0 is not allowed"),
    ({"trials": 3}, r"strategies\[0\].tune.trials: unknown key"),
])
def test_a_bad_tune_mapping_fails_when_the_file_is_read(tmp_path, tune, message):
    from adaptive_decoding.experiments.parse import load_experiment
    from adaptive_decoding.experiments.spec import ExperimentError

    exp = tmp_path / "bad.yaml"
    exp.write_text(yaml.safe_dump({"name": "bad", "tasks": ["addition"],
                                   "strategies": [{"controller": "margin_topk", "tune": tune}]}))
    with pytest.raises(ExperimentError, match=message):
        load_experiment(str(exp))


def test_train_denoiser_refuses_the_tasks_that_run_on_your_own_model(capsys):
    assert main(["train-denoiser", "--task", "data"]) == 2
    err = capsys.readouterr().err
    assert "--task data: this task has no vocabulary of its own" in err and "allowed: addition, pairs" in err
