"""tiny-sudoku9 ships with the package: it loads with an empty cache, never trains, and solves puzzles."""

from __future__ import annotations

import json

import pytest

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.evaluate import evaluate
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.training.zoo import load_model, packaged_dir


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADEC_CACHE", str(tmp_path))
    return tmp_path


def test_packaged_model_loads_without_training(empty_cache):
    folder = packaged_dir("tiny-sudoku9")
    assert (folder / "recipe.md").is_file() and sum(f.stat().st_size for f in folder.iterdir()) < 20e6
    loaded = load_model("tiny-sudoku9", train_if_missing=False)
    assert loaded.denoiser.config.structure["kind"] == "sudoku"
    assert not (empty_cache / "models").exists()  # nothing written to the cache


def test_packaged_model_solves_and_order_matters(empty_cache):
    """On 20 unique puzzles, one cell per step: the most confident cell first solves most of them
    (the packaged metrics say 73 % on 300), random order far fewer (the order is the point of the task)."""
    loaded = load_model("tiny-sudoku9", train_if_missing=False)
    task = get_task("sudoku9")
    config = DecodeConfig(gen_length=81)
    confident = evaluate(loaded, task, build_controller("sequential"), config, strategy="s", n=20, batch_size=20)
    rand = evaluate(loaded, task, build_controller("llada_random", steps=81), config, strategy="r", n=20, batch_size=20)
    shipped = json.loads((packaged_dir("tiny-sudoku9") / "metrics.json").read_text())["test_exact_match"]
    assert confident.accuracy >= 0.5 and shipped >= 0.7
    assert rand.accuracy <= confident.accuracy - 0.2
    assert confident.nfe == pytest.approx(81)
