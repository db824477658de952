"""adaptive_decoding.framework.models resolves every model name by itself: saved folders keep their own vocabulary,
built-in names come from the tasks, and training a missing model is a hook the training layer adds."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adaptive_decoding.framework.models import zoo
from adaptive_decoding.framework.models.saved import CheckpointError, save_pretrained
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.tasks.vocab import (
    LEGACY_VOCAB,
    VOCAB,
    TaskTokenizer,
    make_vocabulary,
    tokenizer_for,
)

ROOT = Path(__file__).resolve().parents[2]


def tiny_model(vocab_size: int) -> TinyDenoiser:
    torch.manual_seed(0)
    return TinyDenoiser(TinyConfig(vocab_size=vocab_size, mask_token_id=1, pad_token_id=0, eos_token_id=2,
                                   max_len=16, d_model=16, n_layers=1, n_heads=2, d_ff=32))


def test_packaged_sudoku9_decodes_as_before(tmp_path, monkeypatch):
    """The shipped model's ids and decisions are those recorded before vocabularies became per task."""
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.loop import decode

    monkeypatch.setenv("ADEC_CACHE", str(tmp_path))
    loaded = zoo.load_model("tiny-sudoku9", train_if_missing=False)
    assert loaded.tokenizer.vocab == VOCAB
    exs = get_task("sudoku9").examples("test", 3, seed=0)
    res = decode(loaded.denoiser, [loaded.tokenizer.encode(e.prompt) for e in exs], build_controller("sequential"),
                 DecodeConfig(gen_length=81))
    assert hashlib.sha256(str(res.generated.tolist()).encode()).hexdigest()[:16] == "61d4a2c71a20c5e3"
    assert res.nfe.tolist() == [81, 81, 81]


def test_a_folder_loads_with_its_own_vocabulary(tmp_path):
    task = get_task("addition")
    save_pretrained(tmp_path / "m", tiny_model(len(VOCAB)), task=task, recipe={}, metrics={})
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    own = make_vocabulary(words=("rev", "sum"))  # another vocabulary, as a new task would declare
    cfg["vocab"] = list(own)
    cfg["model"]["vocab_size"] = len(own)
    (tmp_path / "n").mkdir()
    torch.save(tiny_model(len(own)).state_dict(), tmp_path / "n" / "model.pt")
    (tmp_path / "n" / "config.json").write_text(json.dumps(cfg))
    loaded = zoo.load_model(str(tmp_path / "n"))
    assert loaded.tokenizer.vocab == own and loaded.tokenizer.encode("rev:1=") == [own.index("rev"), own.index(":"), 4, 14]
    assert zoo.load_model(str(tmp_path / "m")).tokenizer is tokenizer_for(VOCAB)  # the task's own instance


def test_a_folder_without_vocab_falls_back_to_the_legacy_vocabulary(tmp_path):
    save_pretrained(tmp_path, tiny_model(len(VOCAB)), task=get_task("sorting"), recipe={}, metrics={})
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["vocab"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert zoo.load_model(str(tmp_path)).tokenizer.vocab == LEGACY_VOCAB


def test_a_vocabulary_that_does_not_fit_the_weights_is_named(tmp_path):
    save_pretrained(tmp_path, tiny_model(len(VOCAB)), task=get_task("sorting"), recipe={}, metrics={})
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["vocab"] = cfg["vocab"][:-1]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config.json: its vocabulary has 60 tokens but its model 61"):
        zoo.load_model(str(tmp_path))
    cfg["vocab"] = ["[PAD]", "[MASK]", "[EOS]", "a b"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"bad 'vocab'.*'a b'"):
        zoo.load_model(str(tmp_path))


def test_vocabulary_checks_and_its_own_words():
    with pytest.raises(ValueError, match="appears twice"):
        make_vocabulary(words=("sort", "sort"))
    with pytest.raises(ValueError, match="must start with"):
        TaskTokenizer(("a", "b", "c"))
    tok = TaskTokenizer(make_vocabulary(words=("cat",)))
    with pytest.raises(ValueError, match=r"unknown word 'dog' at position 0 .*known words: cat"):
        tok.encode("dog")


def test_builtin_names_come_from_the_tasks():
    assert zoo.MODELS.get("tiny-sudoku9").task == "sudoku9"
    assert zoo.MODELS.get("tiny-phrases").task == "phrases"  # a subclass declares its own model
    assert zoo.MODELS.get("tiny-addition").recipe()["max_steps"] == 2500


def test_missing_builtin_without_a_builder_says_how_to_train(tmp_path, monkeypatch):
    monkeypatch.setenv("ADEC_CACHE", str(tmp_path))
    monkeypatch.setattr(zoo, "MISSING_BUILDERS", {})
    with pytest.raises(CheckpointError, match=r"adec train-denoiser --task addition.*import adaptive_decoding.framework.training"):
        zoo.load_model("tiny-addition")
    with pytest.raises(CheckpointError, match="train_if_missing=True"):
        zoo.load_model("tiny-addition", train_if_missing=False)
    calls = []
    monkeypatch.setitem(zoo.MISSING_BUILDERS, "denoiser", lambda name, folder, progress: calls.append(name))
    with pytest.raises(CheckpointError, match="config.json: file not found"):  # the builder wrote nothing
        zoo.load_model("tiny-addition")
    assert calls == ["tiny-addition"]
    with pytest.raises(ValueError, match="allowed: denoiser, text"):
        zoo.register_missing_builder("tokenizer", lambda *a: None)


def test_loading_a_checkpoint_never_imports_training(tmp_path):
    code = ("import sys; from adaptive_decoding.framework.models.zoo import load_model; "
            "m = load_model('tiny-sudoku9', train_if_missing=False); "
            "print(sorted(k for k in sys.modules if k.startswith('adaptive_decoding.framework.training') or k == 'pytorch_lightning'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "ADEC_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_importing_training_registers_the_builders():
    import adaptive_decoding.framework.training  # noqa: F401
    from adaptive_decoding.framework.training.text_model import train_missing_text_model
    from adaptive_decoding.framework.training.zoo import load_model, train_missing_builtin

    assert zoo.MISSING_BUILDERS["denoiser"] is train_missing_builtin
    assert zoo.MISSING_BUILDERS["text"] is train_missing_text_model
    assert load_model is zoo.load_model


def test_the_public_load_model_still_resolves():
    import adaptive_decoding.framework as framework

    assert framework.load_model is zoo.load_model


def test_a_subclass_task_does_not_inherit_the_built_in_model():
    from adaptive_decoding.framework.tasks.arithmetic import AdditionTask
    from adaptive_decoding.framework.tasks.base import TASKS
    from adaptive_decoding.framework.training.masked_diffusion import RECIPES, recipe_for

    class WideAddition(AdditionTask):
        """Addition registered again under another name."""

    TASKS.add("wide_addition", WideAddition)
    try:
        assert [m for m in zoo.MODELS.names() if zoo.MODELS.get(m).task == "wide_addition"] == []
        assert recipe_for("wide_addition") == recipe_for("addition")  # the recipe is inherited
        assert RECIPES["sudoku9"].size == "medium" and "text" not in RECIPES
    finally:
        TASKS._table.pop("wide_addition", None)
