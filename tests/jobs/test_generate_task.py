"""``adec generate --task``: a task's split (the ``data`` task over a researcher's own JSONL file) as
the input of a batch generation job, scored by the task after the job.

The model is a tiny LLaDA checkpoint in the real on-disk format with BERT's WordPiece tokenizer
(random weights). The data file is made to be partly right: its answers are what one-token-per-step
decoding of that checkpoint writes, except every fourth row's, so ``--controller llada`` must score
exactly 3/4.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from adaptive_decoding.framework.cli.main import main
from adaptive_decoding.framework.jobs.output import read_results

ROOT = Path(__file__).resolve().parents[2]
GEN = dict(gen_length=16, block_length=8)
QUESTIONS = ["how many apples are left", "what is the colour of the sky", "who wrote the letter",
             "where does the train stop"]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _answered(loaded, questions: list[str]) -> list[dict]:
    """Rows whose answer is the sequential (one token per step) decode of the question, every fourth
    one wrong (the data task's prompt column is ``question``, so the prompt is the question)."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import decode_texts

    texts, _, _ = decode_texts(loaded, questions, build_controller("llada"), DecodeConfig(**GEN))
    return [{"question": q, "answer": t if i % 4 != 3 else "no such answer"}
            for i, (q, t) in enumerate(zip(questions, texts))]


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A real-format LLaDA folder, its loaded model, a test JSONL file answered by :func:`_answered`
    and the ``--task`` flags that read it."""
    from adaptive_decoding.framework.models.zoo import load_model

    tmp = tmp_path_factory.mktemp("generate-task")
    fx = _module(ROOT / "tests" / "fixtures" / "real_format" / "tokenizers.py", "_adec_tok_generate_task")
    folder = fx.llada_with_tokenizer(tmp / "llada", "wordpiece", d_model=32, n_layers=1, mlp_hidden_size=64)
    loaded = load_model(str(folder), device="cpu")
    data = tmp / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _answered(loaded, QUESTIONS)))
    params = {"test": str(data), "prompt": "question", "metric": "exact", **GEN}
    flags = ["--task", "data", *[f"--task-param={k}={v}" for k, v in params.items()]]
    return {"folder": str(folder), "loaded": loaded, "params": params, "flags": flags}


def _examples(own, n: int = len(QUESTIONS)):
    from adaptive_decoding.framework.tasks.base import get_task

    return get_task("data", **own["params"]).examples("test", n)


def _argv(own, out: Path, *extra: str) -> list[str]:
    return ["generate", *own["flags"], "--model", own["folder"], "--device", "cpu", "--controller", "llada",
            "--output", str(out), "--no-progress", *extra]


def test_task_split_is_decoded_scored_and_resumed(own, tmp_path, capsys):
    out, summary = tmp_path / "results.jsonl", tmp_path / "summary.json"
    assert main(_argv(own, out, "--summary-json", str(summary))) == 0
    err = capsys.readouterr().err
    assert "done 4, failed 0" in err and "score: 0.750 (exact) over 4 of 4 rows" in err
    rows = {r["id"]: r for r in read_results(out)}
    examples = _examples(own)
    assert set(rows) == {ex.id for ex in examples}  # the task's example ids, one row each
    for ex in examples:
        row = rows[ex.id]
        assert row["status"] == "ok" and row["prompt"] == ex.prompt and row["meta"]["answer"] == ex.answer
        assert len(row["generated_ids"]) == 16 and row["nfe"] == 16  # task's gen_length, 1 token per step
    report = json.loads(summary.read_text())
    assert report["task_score"] == {"metric": "exact", "mean": 0.75, "rows": 4} and report["done"] == 4
    # the same command again: nothing new is decoded, the rows already written are scored again
    assert main(_argv(own, out, "--summary-json", str(summary))) == 0
    err = capsys.readouterr().err
    assert "done 0, failed 0, already in output 4" in err and "score: 0.750 (exact) over 4 of 4 rows" in err
    assert json.loads(summary.read_text())["task_score"]["mean"] == 0.75
    assert {r["id"]: r["text"] for r in read_results(out)} == {i: r["text"] for i, r in rows.items()}


def test_the_model_seam_gets_the_task_and_n_and_set_apply(own, tmp_path, monkeypatch, capsys):
    from adaptive_decoding.framework.cli import generate

    calls = []
    monkeypatch.setattr(generate, "load_model_for",
                        lambda name, device, **options: calls.append((name, options)) or own["loaded"])
    out = tmp_path / "r.jsonl"
    assert main(_argv(own, out, "--n", "2", "--set", "gen_length=8")) == 0
    (name, options), = calls
    assert name == own["folder"] and options["task"].name.startswith("data")
    rows = read_results(out)
    assert {r["id"] for r in rows} == {ex.id for ex in _examples(own, 2)}
    assert all(len(r["generated_ids"]) == 8 for r in rows)  # --set wins over the task's gen_length
    assert "over 2 of 2 rows" in capsys.readouterr().err


def test_input_and_task_together_or_neither_fail_naming_both(own, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    out = tmp_path / "r.jsonl"
    assert main(_argv(own, out, "--input", str(prompts))) == 2
    err = capsys.readouterr().err
    assert "--input" in err and "--task" in err and "both were given" in err
    assert main(["generate", "--output", str(out), "--model", own["folder"]]) == 2
    err = capsys.readouterr().err
    assert "--input" in err and "--task" in err and "neither was given" in err
    assert main(["generate", "--input", str(prompts), "--output", str(out), "--n", "2"]) == 2
    assert "--n has no effect without --task" in capsys.readouterr().err
    assert not out.exists()


def test_more_rows_than_the_split_has_fail_before_the_model_loads(own, tmp_path, monkeypatch, capsys):
    from adaptive_decoding.framework.cli import generate

    monkeypatch.setattr(generate, "load_model_for", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "r.jsonl"
    assert main(_argv(own, out, "--n", "9")) == 2
    assert "4 test rows, fewer than n=9" in capsys.readouterr().err
    assert not out.exists()


def test_error_rows_are_not_scored_and_the_line_says_how_many_were(own, tmp_path, capsys):
    rows = [json.loads(line) for line in Path(own["params"]["test"]).read_text().splitlines()[:3]]
    long = {"question": "word " * 4100, "answer": "x"}  # + gen_length 16 > the checkpoint's 4096 positions
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [*rows, long]))
    out, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    flags = ["--task", "data", f"--task-param=test={data}", "--task-param=prompt=question",
             "--task-param=gen_length=16", "--task-param=block_length=8"]
    assert main(["generate", *flags, "--model", own["folder"], "--device", "cpu", "--controller", "llada",
                 "--output", str(out), "--no-progress", "--summary-json", str(summary)]) == 1  # an error row
    err = capsys.readouterr().err
    assert "done 3, failed 1" in err and "score: 1.000 (exact) over 3 of 4 rows" in err
    assert json.loads(summary.read_text())["task_score"] == {"metric": "exact", "mean": 1.0, "rows": 3}
    assert sorted(r["status"] for r in read_results(out)) == ["error", "ok", "ok", "ok"]
