"""Structured attention: the Sudoku peer mask, and a denoiser that honours it with and without the
KV cache."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.models.structure import structure_mask
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.tasks.base import get_task

SUDOKU = {"kind": "sudoku", "size": 9, "offsets": [0, 82]}


def test_peer_mask_rows_columns_boxes_and_copies():
    m = structure_mask(SUDOKU, 163)
    assert m.shape == (163, 163) and torch.equal(m, m.T)
    assert m[0, 8] and m[0, 72] and m[0, 10]  # same row, column, box
    assert not m[0, 40] and not m[0, 82 + 40]  # cell 40 shares nothing with cell 0
    assert m[5, 82 + 5] and m[82 + 5, 82 + 14]  # a prompt cell and its answer copy; same column
    assert m[81].all() and m[:, 81].all()  # the '=' separator attends and is attended everywhere
    assert int(m[0, :81].sum()) == 21  # itself and its 20 peers
    assert structure_mask(None, 10) is None


@pytest.mark.parametrize("bad, match", [
    ({"kind": "graph"}, "kind='graph' is unknown; allowed: sudoku"),
    ({"kind": "sudoku", "size": 6}, "size=6 is not a square number"),
    ({"kind": "sudoku", "size": 9, "offsets": [100]}, "offset 100 puts 81 cells beyond the context of 163"),
])
def test_bad_structures_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        structure_mask(bad, 163)


def _model(layers: int) -> TinyDenoiser:
    torch.manual_seed(0)
    task = get_task("sudoku9")
    tok = task.tokenizer
    cfg = TinyConfig(vocab_size=tok.vocab_size, mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                     eos_token_id=tok.eos_token_id, max_len=task.canvas_length, d_model=32, n_layers=layers,
                     n_heads=2, d_ff=64, structure=task.attention_structure)
    return TinyDenoiser(cfg).eval()


def test_one_layer_sees_only_peers():
    den = _model(1)
    task = get_task("sudoku9")
    x = torch.tensor([task.prompt_ids(task.examples("test", 1)[0]) + [task.tokenizer.mask_token_id] * 81])
    base = den(x)[0, 82]  # answer cell 0
    y = x.clone()
    y[0, 40] = task.tokenizer.encode("5")[0] if x[0, 40] != task.tokenizer.encode("5")[0] else task.tokenizer.encode("6")[0]
    assert torch.allclose(den(y)[0, 82], base)  # a non-peer changed: cell 0 cannot see it
    z = x.clone()
    z[0, 8] = task.tokenizer.encode("5")[0] if x[0, 8] != task.tokenizer.encode("5")[0] else task.tokenizer.encode("6")[0]
    assert not torch.allclose(den(z)[0, 82], base)  # a row peer changed


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_with_every_step_refreshed_equals_no_cache(cache):
    den = _model(2)
    task = get_task("sudoku9")
    prompts = [task.prompt_ids(e) for e in task.examples("test", 3)]
    ctrl = build_controller("fast_dllm", threshold=0.3)
    ref = decode(den, prompts, ctrl, DecodeConfig(gen_length=81, block_length=27))
    got = decode(den, prompts, ctrl, DecodeConfig(gen_length=81, block_length=27, cache=cache, cache_refresh=1))
    assert torch.equal(ref.generated, got.generated)
    blockwise = decode(den, prompts, ctrl, DecodeConfig(gen_length=81, block_length=27, cache=cache))
    assert blockwise.generated.shape == ref.generated.shape  # runs with stale keys, masked by structure
