"""Block-diffusion tiny denoisers: the two-copy training objective, block-causal decoding with and
without the cache, the CLI's --block-size and the built-in tiny-phrases-bd32 variant."""

from __future__ import annotations

import json

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.models.saved import load_pretrained
from adaptive_decoding.framework.models.tiny import MODEL_SIZES, TinyConfig, TinyDenoiser
from adaptive_decoding.framework.models.zoo import MODELS
from adaptive_decoding.framework.training import block_diffusion as bd

MASK = 1


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ADEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")


def _net(block_size, seed=0, max_len=24) -> TinyDenoiser:
    torch.manual_seed(seed)
    cfg = TinyConfig(vocab_size=13, mask_token_id=MASK, pad_token_id=0, eos_token_id=2, max_len=max_len,
                     d_model=16, n_layers=2, n_heads=2, d_ff=32, block_size=block_size)
    net = TinyDenoiser(cfg).eval()
    with torch.no_grad():
        net.norm.weight.mul_(30.0)  # random weights made confident enough for thresholds to decide
    return net


def test_the_block_forward_process_gives_each_block_one_rate_and_masks_only_the_answer():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(3, 13, (64, 10), generator=g)
    answer = torch.zeros_like(x0, dtype=torch.bool)
    answer[:, 3:] = True
    x_t, masked, p = bd.block_forward_process(x0, answer, MASK, 4, generator=g)
    assert p.shape == x0.shape
    for blk in range(3):
        cols = p[:, 4 * blk: 4 * blk + 4]
        assert torch.equal(cols, cols[:, :1].expand_as(cols))  # one t per block
    assert not torch.equal(p[:, 0], p[:, 4])  # and each block its own
    assert not masked[:, :3].any() and torch.equal(x_t == MASK, masked)
    assert torch.equal(x_t[~masked], x0[~masked])


def test_the_two_copy_mask_is_what_decoding_a_block_sees():
    m = bd.two_copy_key_mask(6, 2)
    noisy_noisy, noisy_clean, clean_noisy, clean_clean = m[:6, :6], m[:6, 6:], m[6:, :6], m[6:, 6:]
    assert noisy_noisy[2].tolist() == [False, False, True, True, False, False]
    assert noisy_clean[2].tolist() == [True, True, False, False, False, False]
    assert noisy_clean[:2].sum() == 0 and clean_noisy.sum() == 0
    assert clean_clean[3].tolist() == [True, True, True, True, False, False]


@pytest.mark.parametrize("padding", [False, True])
def test_noisy_copy_logits_equal_the_block_causal_forward_of_each_decoding_state(padding):
    """Block k's logits in the two-copy forward = the model's own block-causal forward of the canvas
    the loop holds when it decodes block k: clean blocks < k, the noisy block k, masks after it."""
    net = _net(4)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randint(3, 13, (3, 14), generator=g)
    answer = torch.zeros_like(x0, dtype=torch.bool)
    answer[:, 5:] = True
    attn = torch.ones_like(x0)
    if padding:
        attn[0, :2] = 0  # a left-padded row: its padding keys are hidden in both copies
    x_t, _, _ = bd.block_forward_process(x0, answer, MASK, 4, generator=g)
    logits = bd.noisy_copy_logits(net, x_t, x0, attn if padding else None)
    for k in range(4):
        canvas = torch.cat([x0[:, :4 * k], x_t[:, 4 * k: 4 * k + 4], torch.full_like(x0[:, 4 * k + 4:], MASK)], 1)
        want = net.full_logits(canvas, attn if padding else None)[:, 4 * k: 4 * k + 4]
        assert torch.allclose(logits[:, 4 * k: 4 * k + 4], want, atol=1e-5), k


def test_a_block_causal_model_never_reads_a_later_block():
    net = _net(4)
    x = torch.randint(3, 13, (2, 12))
    y = x.clone()
    y[:, 8:] = torch.randint(3, 13, (2, 4))
    assert torch.allclose(net.full_logits(x)[:, :8], net.full_logits(y)[:, :8], atol=1e-6)
    assert not torch.allclose(_net(None).full_logits(x)[:, :8], _net(None).full_logits(y)[:, :8], atol=1e-6)


@pytest.mark.parametrize("controller", ["sequential", "fast_dllm", "llada2", "hierarchy", "credit"])
def test_decoding_a_tiny_block_diffusion_model_is_the_same_with_the_block_cache(controller):
    """The prefix of a block-causal canvas never changes once decoded, so the block cache is exact."""
    net = _net(4)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [3]]
    ctrl = build_controller(controller)
    plain = decode(net, prompts, ctrl, DecodeConfig(gen_length=13, cache="none"))
    cached = decode(net, prompts, build_controller(controller), DecodeConfig(gen_length=13, cache="block"))
    assert torch.equal(plain.generated, cached.generated)
    assert plain.nfe.tolist() == cached.nfe.tolist()
    explicit = decode(net, prompts, build_controller(controller), DecodeConfig(gen_length=13, block_length=4))
    assert torch.equal(plain.generated, explicit.generated)  # no block length given: the model's


def test_a_block_length_the_model_was_not_trained_with_is_refused():
    from adaptive_decoding.framework.core.params import ParameterError

    with pytest.raises(ParameterError, match="block_length=8.*allowed: 4"):
        decode(_net(4), [[5, 6]], build_controller("sequential"), DecodeConfig(gen_length=8, block_length=8))


def test_cli_adapts_a_bidirectional_model_to_blocks_and_the_saved_model_decodes_block_by_block(tmp_path, capsys):
    from adaptive_decoding.framework.cli.main import main

    common = ["--task", "phrases", "--task-param", "min_groups=3", "--task-param", "max_groups=4",
              "--task-param", "length=11", "--size", "tiny", "--wandb", "disabled", "--no-progress",
              "--n-test", "4", "--threads", "1"]
    base, blocks = tmp_path / "base", tmp_path / "blocks"
    assert main(["train-denoiser", *common, "--max-steps", "2", "--out", str(base)]) == 0
    assert main(["train-denoiser", *common, "--max-steps", "2", "--block-size", "4", "--init-from", str(base),
                 "--out", str(blocks)]) == 0
    capsys.readouterr()
    config = json.loads((blocks / "config.json").read_text())
    assert config["model"]["block_size"] == 4 and config["recipe"]["size"]["block_size"] == 4
    loaded = load_pretrained(blocks).denoiser
    assert loaded.block_causal and loaded.block_size == 4
    assert load_pretrained(base).denoiser.block_size is None
    assert json.loads((blocks / "metrics.json").read_text())["init_from"] == f"{base} (+0 positions)"


def test_cli_refuses_a_block_size_that_is_not_positive(capsys):
    from adaptive_decoding.framework.cli.main import main

    with pytest.raises(SystemExit):
        main(["train-denoiser", "--task", "phrases", "--block-size", "0"])
    assert "'0' is not a block size; allowed: a positive integer" in capsys.readouterr().err


def test_the_builtin_block_diffusion_phrases_model_is_tiny_phrases_adapted_to_blocks_of_32():
    spec = MODELS.get("tiny-phrases-bd32")
    assert spec.task == "phrases" and spec.init_from == "tiny-phrases" and spec.block_size == 32
    overrides = spec.training_overrides()
    assert overrides["model_size"] == dict(MODEL_SIZES["small"], block_size=32)
    assert overrides["init_from"] == "tiny-phrases" and overrides["max_steps"] == 400
    assert MODELS.get("tiny-phrases").training_overrides()["model_size"] == "small"
