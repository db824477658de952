"""NFE is counted in one place: each stage's reported cost is the forwards the denoiser received.

A proxy counts every batch row of every call the denoiser receives (one row, one forward of its
sample). For each cache mode, with a lookahead (whose handed-on forward serves the next step) and with
revocable decoding (the shadow block in the step's forward, or separate exact probes):

* the :func:`adaptive_decoding.framework.engine.step.forward` and :func:`~adaptive_decoding.framework.engine.step.refine` stages each
  report (``Cost``) exactly the forwards the denoiser received while they ran, and the cache
  refreshes among them;
* ``DecodeResult.nfe`` sums to what the denoiser received over the call (no stage counted twice,
  none dropped), ``lookahead_nfe`` to the refine stages' forwards, ``cache_refreshes`` to the full
  forwards that refreshed the cache;
* per sample: a batch's NFE equals each prompt's single run, whose NFE is what that run received.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

from adaptive_decoding.framework.engine import step
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.lookahead import Lookahead
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser

PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
#: the stages as the engine defines them (each decode below watches these, not a watched one)
FORWARD, REFINE = step.forward, step.refine


class CountingDenoiser:
    """A windowed denoiser's proxy that counts the forwards it receives: ``rows`` (every batch row of
    every call) and ``refresh_rows`` (those of full forwards that refresh a KV cache: a new cache, or
    every canvas column written into the existing one)."""

    def __init__(self, model: Any) -> None:
        self.model, self.rows, self.refresh_rows = model, 0, 0

    def __getattr__(self, name: str) -> Any:  # everything else is the model's
        return getattr(self.model, name)

    def _count(self, x: torch.Tensor, cache: Any, query_cols: Optional[torch.Tensor], use_cache: bool) -> None:
        self.rows += x.shape[0]
        if use_cache or (cache is not None and query_cols is not None and query_cols.shape[1] == x.shape[1]):
            self.refresh_rows += x.shape[0]

    def __call__(self, x: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
        self._count(x, None, None, False)
        return self.model(x, attention_mask=attention_mask)

    def window_logits(self, x, attention_mask, out_cols, *, cache=None, query_cols=None, query_valid=None,
                      use_cache=False):
        self._count(x, cache, query_cols, use_cache)
        return self.model.window_logits(x, attention_mask, out_cols, cache=cache, query_cols=query_cols,
                                        query_valid=query_valid, use_cache=use_cache)

    def shadow_window_logits(self, x, attention_mask, out_cols, *, cache=None, query_cols=None, query_valid=None,
                             use_cache=False):
        self._count(x, cache, query_cols, use_cache)
        return self.model.shadow_window_logits(x, attention_mask, out_cols, cache=cache, query_cols=query_cols,
                                               query_valid=query_valid, use_cache=use_cache)

    def shadow_logits(self, x, attention_mask, out_cols):
        self._count(x, None, None, False)
        return self.model.shadow_logits(x, attention_mask, out_cols)


class LookEveryStep(Controller):
    """Test controller: commit the most confident eligible position and ask the lookahead for two
    candidates at depth 2 at every row, branching at the least confident position."""

    params: dict = {}

    def __init__(self) -> None:
        pass

    def decide(self, f, state):
        commit = select_topk(f.confidence, f.eligible, 1)
        k = torch.where(f.eligible, 2, 1)
        depth = torch.full((commit.shape[0],), 2, dtype=torch.long, device=commit.device)
        return Decision(commit=commit, k=k, depth=depth)


def tiny(n_layers: int = 2) -> TinyDenoiser:
    torch.manual_seed(0)
    cfg = TinyConfig(vocab_size=20, mask_token_id=19, pad_token_id=0, eos_token_id=2, max_len=40, d_model=32,
                     n_layers=n_layers, n_heads=2, d_ff=64)
    return TinyDenoiser(cfg).eval()


def watch_stages(monkeypatch, model: CountingDenoiser) -> list[tuple[str, int, int, int, int, int]]:
    """Record, per forward and refine stage, (stage, forwards received, cost reported, refreshes
    received, refreshes reported, window rows)."""
    seen: list[tuple[str, int, int, int, int, int]] = []

    def watched(name: str, stage: Any, cost_of: Any) -> Any:
        def run(*args: Any) -> Any:
            rows, refreshes = model.rows, model.refresh_rows
            out = stage(*args)
            cost = cost_of(out)
            seen.append((name, model.rows - rows, int(cost.nfe.sum()), model.refresh_rows - refreshes,
                         int(cost.refreshes.sum()), cost.forward.numel()))
            return out
        return run

    monkeypatch.setattr(step, "forward", watched("forward", FORWARD, lambda f: f.cost))
    monkeypatch.setattr(step, "refine", watched("refine", REFINE, lambda r: r.cost))
    return seen


def counted_decode(monkeypatch, prompts: list, controller: Any, config: DecodeConfig, lookahead: Any) -> tuple:
    """Decode ``prompts`` under the counting proxy and check every figure against what it received:
    ``(result, stage records)``."""
    model = CountingDenoiser(tiny())
    seen = watch_stages(monkeypatch, model)
    res = decode(model, prompts, controller, config, lookahead=lookahead)
    assert (res.generated != model.mask_token_id).all()
    for name, received, reported, refreshed, reported_refreshes, _ in seen:
        assert received == reported, f"{name} ran {received} forwards but reported {reported}"
        assert refreshed == reported_refreshes, f"{name} refreshed {refreshed} rows but reported {reported_refreshes}"
    assert int(res.nfe.sum()) == model.rows == sum(s[2] for s in seen)
    assert int(res.lookahead_nfe.sum()) == sum(s[1] for s in seen if s[0] == "refine")
    assert int(res.cache_refreshes.sum()) == model.refresh_rows
    return res, seen


def check_counts(monkeypatch, controller: Any, config: DecodeConfig, lookahead: Any = None) -> list:
    """:func:`counted_decode` of ``PROMPTS``, then of each prompt alone (its NFE as in the batch).
    Returns the stage records of the batch run."""
    res, seen = counted_decode(monkeypatch, PROMPTS, controller, config, lookahead)
    for i, prompt in enumerate(PROMPTS):  # per sample: a single run's NFE is what it received, as in the batch
        single, _ = counted_decode(monkeypatch, [prompt], controller, config, lookahead)
        assert int(single.nfe[0]) == int(res.nfe[i]), (i, res.nfe.tolist())
    return seen


@pytest.mark.parametrize("cache,refresh", [("none", None), ("prefix", None), ("dual", None), ("dual", 2)])
def test_plain_decoding_counts_one_forward_per_row_and_step_and_each_refresh(monkeypatch, cache, refresh):
    cfg = DecodeConfig(gen_length=12, block_length=4, cache=cache, cache_refresh=refresh)
    check_counts(monkeypatch, build_controller("fast_dllm", threshold=0.5), cfg)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("la", [
    dict(width=2, rescore="none", advance=1, max_depth=2),  # the winner's first rollout forward is handed on
    dict(width=3, rescore="pll", advance=1, max_depth=2, lazy=False),  # re-scoring forwards, branch PLL
    dict(width=2),  # the defaults: advance, lazy
])
def test_lookahead_counts_its_rollouts_and_never_the_handed_on_forward_twice(monkeypatch, cache, la):
    cfg = DecodeConfig(gen_length=12, block_length=4, cache=cache)
    seen = check_counts(monkeypatch, LookEveryStep(), cfg, Lookahead.build(scorer="logprob", budget=64, **la))
    assert sum(s[1] for s in seen if s[0] == "refine") > 0  # the lookahead ran
    if la.get("advance") == 1:  # some step took a row's forward from the previous step's lookahead
        assert any(s[1] < s[5] for s in seen if s[0] == "forward")


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("verification", ["shadow", "probe"])
def test_revocable_decoding_counts_the_shadow_forward_or_each_probe(monkeypatch, cache, verification):
    cfg = DecodeConfig(gen_length=12, block_length=6, cache=cache, verification=verification)
    wino = build_controller("wino", draft_threshold=0.9, verify_threshold=0.99, progress_guard=False)
    seen = check_counts(monkeypatch, wino, cfg)
    steps = sum(1 for s in seen if s[0] == "forward")
    if verification == "probe":  # the probes are forwards beyond the step's own
        assert sum(s[2] for s in seen) > steps
