"""Warm-starting a tiny denoiser from a trained one at a longer canvas (train-denoiser --init-from)."""

from __future__ import annotations

import json

import pytest
import torch

from adaptive_decoding.framework.models.saved import CheckpointError, load_pretrained, model_dir
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.training.warm_start import warm_start

TINY = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")


def _net(max_len: int, seed: int, **over) -> TinyDenoiser:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=20, mask_token_id=1, pad_token_id=0, eos_token_id=2, max_len=max_len, **TINY)
    cfg.update(over)
    return TinyDenoiser(TinyConfig(**cfg)).eval()


def test_warm_start_copies_every_weight_and_repeats_the_last_position_row():
    source, target = _net(12, seed=0), _net(20, seed=1)
    assert warm_start(target, source) == 8
    pos_src, pos_new = source.pos.weight, target.pos.weight
    assert torch.equal(pos_new[:12], pos_src)
    assert torch.equal(pos_new[12:], pos_src[-1:].expand(8, -1))
    for (name, a), (_, b) in zip(source.state_dict().items(), target.state_dict().items()):
        if name != "pos.weight":
            assert torch.equal(a, b), name
    ids = torch.randint(3, 20, (2, 12))
    with torch.no_grad():  # on the source's canvas the two models are the same function
        assert torch.allclose(source(ids), target(ids), atol=1e-6)


def test_warm_start_to_a_shorter_canvas_keeps_the_first_rows():
    source, target = _net(20, seed=0), _net(12, seed=1)
    assert warm_start(target, source) == 0
    assert torch.equal(target.pos.weight, source.pos.weight[:12])


def test_warm_start_names_every_architecture_difference():
    with pytest.raises(CheckpointError, match=r"vocab_size: 21 \(init\) vs 20 \(new\); d_model: 48 \(init\) vs 32 \(new\)"):
        warm_start(_net(12, seed=1), _net(12, seed=0, d_model=48, vocab_size=21), "runs/m")


def test_cli_trains_a_longer_phrases_model_from_a_shorter_one(tmp_path, capsys):
    from adaptive_decoding.framework.cli.main import main

    common = ["--task", "phrases", "--task-param", "min_groups=3", "--task-param", "max_groups=4",
              "--size", "tiny", "--wandb", "disabled", "--no-progress", "--n-test", "4", "--threads", "1"]
    short, long = tmp_path / "short", tmp_path / "long"
    assert main(["train-denoiser", *common, "--task-param", "length=11", "--max-steps", "2", "--out", str(short)]) == 0
    assert main(["train-denoiser", *common, "--task-param", "length=15", "--max-steps", "1", "--lr", "1e-12",
                 "--init-from", str(short), "--out", str(long)]) == 0
    capsys.readouterr()
    a, b = load_pretrained(short).denoiser, load_pretrained(long).denoiser
    assert b.config.max_len == a.config.max_len + 4
    assert torch.allclose(b.pos.weight[: a.config.max_len], a.pos.weight, atol=1e-6)  # lr 1e-12: as copied
    assert torch.allclose(b.pos.weight[a.config.max_len:], a.pos.weight[-1:].expand(4, -1), atol=1e-6)
    metrics = json.loads((long / "metrics.json").read_text())
    assert metrics["init_from"] == f"{short} (+4 positions)"
    assert json.loads((long / "config.json").read_text())["task_params"]["length"] == 15
    assert not model_dir("tiny-phrases").exists()  # a task at another size is not the built-in model


def test_cli_init_from_a_missing_folder_fails_before_training(tmp_path, capsys):
    from adaptive_decoding.framework.cli.main import main

    out = tmp_path / "never"
    rc = main(["train-denoiser", "--task", "pairs", "--size", "tiny", "--max-steps", "1", "--wandb", "disabled",
               "--no-progress", "--init-from", str(tmp_path / "missing"), "--out", str(out)])
    assert rc == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err
    assert not out.exists()


def test_cli_init_from_another_size_fails_naming_the_fields_before_any_file(tmp_path, capsys):
    from adaptive_decoding.framework.cli.main import main

    common = ["train-denoiser", "--task", "pairs", "--max-steps", "1", "--wandb", "disabled", "--no-progress",
              "--n-test", "4", "--threads", "1"]
    assert main([*common, "--size", "tiny", "--out", str(tmp_path / "tiny")]) == 0
    capsys.readouterr()
    out = tmp_path / "small"
    assert main([*common, "--size", "small", "--init-from", str(tmp_path / "tiny"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "its architecture differs in" in err and "d_model: " in err
    assert not out.exists()  # checked before the output folder is made
