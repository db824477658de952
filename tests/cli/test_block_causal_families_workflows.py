"""``adec decode``, ``generate`` and ``bench`` by ``--model DIR`` on tiny SDAR, Fast-dLLM v2 and
LLaDA-MoE checkpoints in their real on-disk formats (``tests/fixtures/real_format/families.py``), with a
word-level tokenizer beside them: each family's own rule decodes with ``cache='block'`` (the
block-causal two) exactly as without a cache, LLaDA-MoE's ``llada`` rule with Fast-dLLM's prefix
cache at the same forwards; ``generate`` writes what ``decode`` prints.
The LLaDA2 checkpoint's workflows, all of them, are in test_block_causal_workflows.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from framework.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
G = 8
FAMILIES = {  # name -> (config builder, overrides, the family's own rule, cache modes to compare)
    "sdar": ("sdar_config", {"block_size": 4, "mask_token_id": 310}, "sdar:threshold=0.5", ("none", "block")),
    "fast_dllm_v2": ("fast_dllm_v2_config", {"bd_size": 8, "mask_token_id": 310}, "fast_dllm_v2:threshold=0.5",
                     ("none", "block")),
    "lladamoe": ("llada_moe_config", {}, "llada", ("none", "prefix")),  # Fast-dLLM's cache: approximate
}


def _module(path: Path, name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, folder) of one family's checkpoint with a word tokenizer, its rule and cache modes."""
    fam = _module(ROOT / "tests" / "fixtures" / "real_format" / "families.py", "_adec_real_format_families")
    hub = _module(ROOT / "tests" / "models" / "test_hub.py", "_adec_test_hub_words")
    config_fn, overrides, rule, caches = FAMILIES[request.param]
    folder = fam.build(tmp_path_factory.mktemp(request.param) / "ckpt", getattr(fam, config_fn)(**overrides), seed=2)
    hub.word_tokenizer(folder)
    return request.param, str(folder), rule, caches


def _decode(capsys, folder: str, rule: str, cache: str, prompts: list[str]) -> list[dict]:
    name, _, params = rule.partition(":")
    argv = ["decode", "--model", folder, "--device", "cpu", "--controller", name, "--set", f"gen_length={G}",
            "--set", f"cache={cache}", "--json", *[a for p in prompts for a in ("--prompt", p)]]
    argv += [a for kv in params.split(",") if kv for a in ("--set", kv)]
    assert main(argv) == 0, capsys.readouterr().err
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_decode_by_folder_with_the_familys_rule_and_its_cache(family, capsys):
    kind, folder, rule, (plain, cached) = family
    prompts = ["hello", "hello world w1 w2 w3", "user w4 w5"]
    a, b = _decode(capsys, folder, rule, plain, prompts), _decode(capsys, folder, rule, cached, prompts)
    if cached == "block":  # the exact cache of completed blocks: the same tokens
        assert [r["generated_ids"] for r in a] == [r["generated_ids"] for r in b]
    assert [r["nfe"] for r in a] == [r["nfe"] for r in b]
    assert all(len(r["generated_ids"]) == G and 310 not in r["generated_ids"] for r in a)
    assert all(1 <= r["nfe"] <= G for r in a)


def test_generate_by_folder_writes_the_decoded_rows(family, capsys, tmp_path):
    kind, folder, rule, (_, cached) = family
    prompts = ["hello", "user w4 w5"]
    inp, out = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    inp.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    name, _, params = rule.partition(":")
    argv = ["generate", "--input", str(inp), "--output", str(out), "--model", folder, "--device", "cpu",
            "--controller", name, "--set", f"gen_length={G}", "--set", f"cache={cached}", "--no-progress"]
    argv += [a for kv in params.split(",") if kv for a in ("--set", kv)]
    assert main(argv) == 0, capsys.readouterr().err
    rows = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"])
    want = _decode(capsys, folder, rule, cached, prompts)
    assert [(r["id"], r["status"]) for r in rows] == [("p0", "ok"), ("p1", "ok")]
    assert [r["generated_ids"] for r in rows] == [w["generated_ids"] for w in want]
    assert [r["nfe"] for r in rows] == [w["nfe"] for w in want]
