"""``adec decode`` / ``adec generate`` with real-checkpoint flags: ``--model org/name`` from the local
hub cache, ``--dtype``, ``--device``, ``--trust-remote-code`` and the chat template. Nothing is
downloaded: the checkpoints are tiny, built from configs into tmp_path, and the hub cache is a
folder laid out as ``models--ORG--NAME/snapshots/<commit>/`` under a temporary ``HF_HUB_CACHE``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from adaptive_decoding.framework.cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_hub import VOCAB, llada_folder  # noqa: E402
from test_model_loading import bert_checkpoint, fake_hub_cache, real_format  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant{% endif %}")
IDS = {w: i for i, w in enumerate(VOCAB)}
FAST = ["--controller", "fast_dllm", "--set", "gen_length=4", "--set", "threshold=0.0", "--device", "cpu"]


def decode_json(capsys, *argv: str) -> list[dict]:
    assert main(["decode", *argv, "--json"]) == 0, capsys.readouterr().err
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.fixture
def hub(monkeypatch, tmp_path) -> Path:
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_hub_name_is_resolved_from_the_local_cache(hub, capsys):
    fake_hub_cache(hub, "tiny-org/tiny-bert", bert_checkpoint)
    rows = decode_json(capsys, "--model", "tiny-org/tiny-bert", "--prompt", "hello world", *FAST)
    assert len(rows) == 1 and len(rows[0]["generated_ids"]) == 4
    assert rows[0]["prompt_ids"] == [IDS["hello"], IDS["world"]] and rows[0]["chat_template"] is False


def test_missing_hub_name_prints_the_download_command(hub, capsys):
    assert main(["decode", "--model", "GSAI-ML/LLaDA-8B-Instruct", "--prompt", "x", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adec decode: error: hub model 'GSAI-ML/LLaDA-8B-Instruct' is not in the local")
    assert "huggingface-cli download GSAI-ML/LLaDA-8B-Instruct" in err and str(hub) in err


def test_a_path_that_is_nothing_lists_what_was_tried(tmp_path, capsys):
    assert main(["decode", "--model", str(tmp_path / "no" / "such" / "model"), "--prompt", "x", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "no such model folder. Tried: a folder" in err and "built-in model name (known: tiny-addition" in err
    assert "not of the form org/name" in err


@pytest.mark.parametrize("command", ["decode", "generate"])
@pytest.mark.parametrize("flag, value, allowed", [
    ("--dtype", "int3", ["'auto'", "'float32'", "'bfloat16'", "'float16'"]),
    ("--device", "tpu", ["auto, cpu, cuda, cuda:N"]),
])
def test_bad_dtype_or_device_fails_before_any_work(command, flag, value, allowed, tmp_path, capsys, monkeypatch):
    def no_work(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("adaptive_decoding.framework.training.zoo.load_model", no_work)
    extra = ["--prompt", "x"] if command == "decode" else ["--input", str(tmp_path / "missing.jsonl"),
                                                             "--output", str(tmp_path / "out.jsonl")]
    with pytest.raises(SystemExit) as exit_:
        main([command, flag, value, *extra])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and repr(value) in err and all(a in err for a in allowed)


def test_bench_takes_the_same_model_flags(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--dtype", "int3"])
    assert "argument --dtype: invalid choice: 'int3'" in capsys.readouterr().err


def test_remote_code_checkpoint_is_refused_without_the_flag(tmp_path, capsys):
    folder = llada_folder(tmp_path, vocab_size=len(VOCAB), mask_token_id=3)
    assert main(["decode", "--model", str(folder), "--prompt", "w1 hello", *FAST]) == 2
    err = capsys.readouterr().err
    assert "--trust-remote-code" in err and "auto_map" in err and "Traceback" not in err
    rows = decode_json(capsys, "--model", str(folder), "--trust-remote-code", "--prompt", "w1 hello", *FAST)
    a, n = IDS["w1"], 2  # the designed LLaDA answer: position i of a row starting with a -> w[(a + i) % 8]
    assert rows[0]["generated_ids"] == [4 + (a + n + j) % 8 for j in range(4)]


def test_remote_code_checkpoint_from_the_hub_cache_too(hub, tmp_path, capsys):
    fake_hub_cache(hub, "GSAI-ML/tiny-llada", lambda snap: llada_folder(snap.parent, vocab_size=len(VOCAB),
                                                                        mask_token_id=3).rename(snap))
    assert main(["decode", "--model", "GSAI-ML/tiny-llada", "--prompt", "w2", *FAST]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    assert decode_json(capsys, "--model", "GSAI-ML/tiny-llada", "--trust-remote-code", "--prompt", "w2", *FAST)


def test_llada_in_its_real_format_needs_no_remote_code(hub, capsys):
    """The framework's own LLaDA implementation covers the checkpoint: no --trust-remote-code."""
    fake_hub_cache(hub, "GSAI-ML/LLaDA-8B-Instruct", lambda snap: real_format("llada", snap))
    rows = decode_json(capsys, "--model", "GSAI-ML/LLaDA-8B-Instruct", "--dtype", "float32", "--prompt", "w2", *FAST)
    assert len(rows[0]["generated_ids"]) == 4


def test_chat_template_is_applied_by_default_and_skipped_on_request(tmp_path, capsys):
    folder = bert_checkpoint(tmp_path / "chat-bert", chat_template=TEMPLATE)
    rows = decode_json(capsys, "--model", str(folder), "--prompt", "hello w1", *FAST)
    assert rows[0]["prompt_ids"] == [IDS[w] for w in ("user", "hello", "w1", "assistant")]
    assert rows[0]["chat_template"] is True
    rows = decode_json(capsys, "--model", str(folder), "--no-chat-template", "--prompt", "hello w1", *FAST)
    assert rows[0]["prompt_ids"] == [IDS["hello"], IDS["w1"]] and rows[0]["chat_template"] is False
    plain = bert_checkpoint(tmp_path / "plain-bert")  # no template: nothing to apply, no error
    rows = decode_json(capsys, "--model", str(plain), "--prompt", "hello w1", *FAST)
    assert rows[0]["prompt_ids"] == [IDS["hello"], IDS["w1"]]


def test_generate_plumbs_the_chat_template_and_options(tmp_path, capsys, monkeypatch):
    from adaptive_decoding.framework.cli import generate

    seen = []
    real = generate.load_model_for
    monkeypatch.setattr(generate, "load_model_for",
                        lambda name, device, **options: seen.append((device, options)) or real(name, device, **options))
    folder = bert_checkpoint(tmp_path / "chat-bert", chat_template=TEMPLATE)
    inp, out = tmp_path / "p.jsonl", tmp_path / "r.jsonl"
    inp.write_text(json.dumps({"prompt": "hello w1", "id": "a"}) + "\n")
    argv = ["generate", "--input", str(inp), "--output", str(out), "--model", str(folder), "--no-progress",
            "--set", "gen_length=4", "--device", "cpu", "--dtype", "float32"]
    assert main(argv) == 0, capsys.readouterr().err
    assert seen == [("cpu", {"dtype": "float32", "trust_remote_code": False, "chat": None, "query_chunk": None})]
    first = json.loads(out.read_text().splitlines()[0])
    assert first["status"] == "ok" and len(first["generated_ids"]) == 4
    # the results file remembers the prompt encoding: without the template it is another job
    assert main(argv + ["--no-chat-template"]) == 2
    assert "settings" in capsys.readouterr().err
    assert main(argv + ["--no-chat-template", "--overwrite"]) == 0
    assert seen[-1][1]["chat"] is False
    assert json.loads(out.read_text().splitlines()[0])["settings"] != first["settings"]
