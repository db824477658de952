"""Multi-block decoding (``DecodeConfig.block_add_threshold``, d3LLM's): several blocks active in
the window at once, with any controller and every cache mode.

* with one active block at a time (``block_add_threshold=1.0``) the loop decodes exactly as without
  the option, token for token and forward for forward, for several controllers and cache modes;
* on a designed toy the window opens blocks exactly when the rule says (one a step, once the last
  active block is the fraction decided) and ``features.block_of`` names each slot's block;
* on a block-causal canvas the block cache stays exact when several blocks finish at once;
* bad values are refused with the name, the value and the range.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from adaptive_decoding.framework import DecodeConfig, ParameterError, build_controller, decode
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser
from adaptive_decoding.framework.testing.toys import BlockCausalToy, ContextToyDenoiser, ToyDenoiser

CONTROLLERS = [("fast_dllm", {"threshold": 0.7}), ("llada", {"steps": 6}), ("margin_topk", {}),
               ("cadllm", {"min_block": 2, "max_block": 6}), ("d3llm", {}), ("sequential", {})]
PROMPTS = [[1, 2, 3], [4], [5, 6]]


def tiny_transformer() -> TinyDenoiser:
    torch.manual_seed(0)
    cfg = TinyConfig(vocab_size=16, mask_token_id=15, pad_token_id=0, eos_token_id=14, max_len=32, d_model=16,
                     n_layers=2, n_heads=2, d_ff=32)
    model = TinyDenoiser(cfg).eval()
    with torch.no_grad():
        model.head.weight.mul_(20.0)
    return model


def run(model, name, params, **config):
    return decode(model, PROMPTS, build_controller(name, **params), DecodeConfig(**config), seeds=[0, 1, 2],
                  trace=True)


def same(a, b) -> bool:
    return torch.equal(a.generated, b.generated) and torch.equal(a.nfe, b.nfe) and torch.equal(a.steps, b.steps)


@pytest.mark.parametrize("name, params", CONTROLLERS)
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_one_active_block_decodes_as_today(name, params, cache):
    model = tiny_transformer()
    base = {"gen_length": 12, "block_length": 4, "cache": cache}
    for temperature in (0.0, 0.7):
        today = run(model, name, params, **base, temperature=temperature,
                    block_add_threshold=None if name != "d3llm" else 1.0)
        one = run(model, name, params, **base, temperature=temperature, block_add_threshold=1.0)
        assert same(today, one)
        assert all(int((t["active_end"] - t["block_end"]).abs().max()) == 0 for t in one.trace)


@pytest.mark.parametrize("name, params", CONTROLLERS)
def test_one_active_block_decodes_as_today_on_a_block_causal_canvas(name, params):
    model = BlockCausalToy(ContextToyDenoiser(), block_size=3)
    for cache in ("none", "block"):
        default = None if name != "d3llm" else 1.0
        today = run(model, name, params, gen_length=8, cache=cache, block_add_threshold=default)
        assert same(today, run(model, name, params, gen_length=8, cache=cache, block_add_threshold=1.0))


class WindowSpy(Controller):
    """The most confident eligible slot; records each step's window (block_of, positions)."""

    params: dict = {}

    def __init__(self) -> None:
        self.seen: list[tuple[list[int], list[int]]] = []

    def decide(self, f, state):
        self.seen.append((f.position[0].tolist(), f.block_of[0].tolist()))
        return Decision(commit=select_topk(f.confidence, f.eligible, 1))


def test_blocks_open_when_the_last_is_the_fraction_decided_and_block_of_names_them():
    # blocks of 4; p(answer) falls inside each block, but position 4 (block 1's first) is surest
    conf = [0.9, 0.8, 0.7, 0.6, 0.95, 0.5, 0.45, 0.4, 0.38, 0.37, 0.36, 0.35]
    model = ToyDenoiser(answer=list(range(1, 13)), conf=conf, prompt_length=2)
    spy = WindowSpy()
    config = DecodeConfig(gen_length=12, block_length=4, block_add_threshold=0.5)
    res = decode(model, [[1, 2]], spy, config, trace=True)
    windows = [(int(t["block_start"][0]), int(t["active_end"][0])) for t in res.trace]
    commits = [int(t["commit"][0].nonzero()[0]) - 2 for t in res.trace]
    # 2 of block 0 decided -> block 1 opens (its 0.95 goes first); block 1 half decided only after
    # block 0 ends, then block 2 opens beside it
    assert commits == [0, 1, 4, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert windows == [(0, 4), (0, 4), (0, 8), (0, 8), (0, 8), (4, 8), (4, 12), (4, 12), (8, 12), (8, 12),
                       (8, 12), (8, 12)]
    assert int(res.nfe[0]) == 12
    positions, block_of = spy.seen[2]
    assert positions == list(range(8)) and block_of == [0, 0, 0, 0, 1, 1, 1, 1]
    positions, block_of = spy.seen[6]
    assert positions == list(range(4, 12)) and block_of == [0, 0, 0, 0, 1, 1, 1, 1]


def test_at_most_one_block_opens_a_step_and_zero_opens_one_every_step():
    # as d3LLM: the first block is open before the first step, which opens the second (progress 0 ≥ 0)
    model = ToyDenoiser(answer=list(range(1, 13)), conf=[0.5] * 12, prompt_length=2)
    res = decode(model, [[1, 2]], build_controller("sequential"),
                 DecodeConfig(gen_length=12, block_length=2, block_add_threshold=0.0), trace=True)
    ends = [int(t["active_end"][0]) for t in res.trace]
    assert ends[:6] == [4, 6, 8, 10, 12, 12]


@pytest.mark.parametrize("name, params", [("fast_dllm", {"threshold": 0.3}), ("d3llm", {"threshold": 2.0}),
                                          ("sequential", {})])
def test_block_cache_stays_exact_when_several_blocks_finish_at_once(name, params):
    model = BlockCausalToy(ContextToyDenoiser(), block_size=2)
    for temperature in (0.0, 0.8):
        runs = [run(model, name, params, gen_length=8, cache=cache, block_add_threshold=0.0,
                    temperature=temperature) for cache in ("none", "block")]
        assert same(*runs)
    leaps = [t for t in runs[0].trace if int((t["block_start"] - t["active_end"]).abs().max()) > 2]
    assert leaps  # several blocks were active together


@pytest.mark.parametrize("bad", [-0.1, 1.5, "x"])
def test_a_bad_block_add_threshold_is_refused(bad):
    with pytest.raises(ParameterError, match=r"block_add_threshold.*allowed"):
        DecodeConfig.build(gen_length=8, block_length=2, block_add_threshold=bad)


def test_block_add_threshold_with_one_block_warns_it_has_no_effect():
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        DecodeConfig.build(gen_length=8, block_add_threshold=0.5)
    assert any("block_add_threshold=0.5 has no effect" in str(w.message) for w in got)


@pytest.mark.parametrize("name, threshold", [("d3llm", None), ("fast_dllm", 0.5)])
def test_the_sub_block_cache_and_several_open_blocks_are_refused_before_any_forward(name, threshold):
    """Fast-dLLM v2's sub-block cache freezes one block's keys; multi-block decoding (set, or d3llm's
    default of 0.1) keeps several blocks open: the pair is refused, naming both, before a forward."""
    model = BlockCausalToy(ContextToyDenoiser(), block_size=4)
    calls = []
    model.forward = lambda *a, **k: calls.append(1)  # type: ignore[method-assign]
    with pytest.raises(ParameterError, match=r"sub_block_cache=2 .*block_add_threshold=0\.[15].*allowed"):
        run(model, name, {}, gen_length=8, cache="block", sub_block_cache=2, block_add_threshold=threshold)
    assert calls == []
