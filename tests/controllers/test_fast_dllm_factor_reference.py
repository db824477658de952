"""``fast_dllm_factor`` against a loop-based reference of NVlabs' factor rule.

The reference below was written from reading NVlabs/Fast-dLLM ``llada/generate.py``
(``get_transfer_index_dynamic``), one sample at a time, with Python floats:

* the masked confidences of the current block, sorted descending;
* a threshold per rank ``n = 1..m``: ``1 − f/(n + 1)``, except rank 1, whose threshold is −1;
* scan the ranks and stop at the first whose confidence is *strictly below* its threshold
  (so equality passes); the loop variable then holds the 0-based index of that rank, or ``m − 1``
  when nothing failed;
* if that index is 0 or ``m − 1``, add one; commit that many of the most confident.

So when the first failure is the last rank, every position is committed. Ties: ``torch.topk``
leaves their order unspecified; the framework breaks them towards the lower position, and the
reference does the same so that masks can be compared exactly.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import FeatureOptions, StepWindow, compute_features
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.testing.toys import ToyDenoiser

V = 8


def reference_count(sorted_conf: list[float], factor: float) -> int:
    """How many tokens NVlabs' factor rule commits, for confidences sorted descending."""
    m = len(sorted_conf)
    if m == 0:
        return 0
    bars = [1 - factor / (n + 1) for n in range(1, m + 1)]
    bars[0] = -1
    top_i = 0
    for top_i in range(m):
        if sorted_conf[top_i] < bars[top_i]:
            break
    if top_i == 0 or top_i == m - 1:
        top_i += 1
    return top_i


def reference_mask(conf: torch.Tensor, eligible: torch.Tensor, factor: float) -> torch.Tensor:
    """Commit mask ``[B, L]`` of the reference rule, row by row."""
    out = torch.zeros_like(eligible)
    for b in range(conf.shape[0]):
        idx = [i for i in range(conf.shape[1]) if eligible[b, i]]
        order = sorted(idx, key=lambda i: (-float(conf[b, i]), i))  # ties -> lower position
        k = reference_count([float(conf[b, i]) for i in order], factor)
        for i in order[:k]:
            out[b, i] = True
    return out


def features(conf: torch.Tensor, eligible: torch.Tensor):
    """StepFeatures whose ``confidence`` is exactly ``conf`` (float32) over ``eligible``."""
    b, l = conf.shape  # noqa: E741
    full = lambda v: torch.full((b,), v, dtype=torch.long)  # noqa: E731
    window = StepWindow(eligible=eligible, masked=eligible, rel=torch.arange(l)[None].expand(b, l),
                        block_start=full(0), block_end=full(l), block_index=full(0),
                        block_masked_at_start=eligible.sum(1), step=full(0), block_step=full(0))
    f = compute_features(torch.zeros(b, l, V), window, FeatureOptions(gen_length=l))
    return dataclasses.replace(f, confidence=conf.float())


def commit(conf, eligible, factor):
    ctrl = build_controller("fast_dllm_factor", factor=factor)
    st = DecodeState(config=DecodeConfig(gen_length=conf.shape[1]), seeds=torch.zeros(conf.shape[0], dtype=torch.long),
                     mask_token_id=V - 1)
    ctrl.reset(st)
    return ctrl.decide(features(conf, eligible), st)


# ------------------------------------------------------------------------- the reference itself
def test_reference_reads_the_code_as_documented():
    assert reference_count([], 1.0) == 0
    assert reference_count([0.01], 1.0) == 1  # m = 1: the loop ends at 0, then + 1
    assert reference_count([0.99, 0.01], 1.0) == 2  # m = 2: both, however unsure the second
    assert reference_count([0.9, 0.75, 0.75, 0.2, 0.1], 1.0) == 3  # 0.75 ≥ 1 − 1/4: equality passes
    assert reference_count([0.9, 0.75, 0.74, 0.2, 0.1], 1.0) == 2
    assert reference_count([0.99, 0.9, 0.8, 0.1], 1.0) == 4  # only the last fails: all
    assert reference_count([0.99, 0.9, 0.7, 0.1], 1.0) == 2


# ------------------------------------------------------------------------- controller == reference
@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("grid", [True, False], ids=["grid-ties-and-boundaries", "continuous"])
def test_commit_masks_equal_the_reference_on_random_profiles(factor, grid):
    g = torch.Generator().manual_seed(int(factor * 100) + grid)
    rows, width = 400, 16
    if grid:
        # multiples of 1/16 are exact in float32 and float64: many ties, and many confidences that
        # sit exactly on a threshold (1 − 1/4 = 0.75, 1 − 1/8 = 0.875, 1 − 2/8 = 0.75, 1 − 0.5/4 ...)
        conf = torch.randint(0, 17, (rows, width), generator=g).float() / 16
        conf = torch.where(torch.rand(rows, width, generator=g) < 0.6, conf.clamp(min=0.5), conf)
    else:
        conf = torch.rand(rows, width, generator=g) ** 0.25
    eligible = torch.rand(rows, width, generator=g) < torch.rand(rows, 1, generator=g)
    eligible[:8] = False  # rows with nothing eligible,
    eligible[8:16] = torch.arange(width)[None] == torch.randint(0, width, (8, 1), generator=g)  # one,
    eligible[16:24] = torch.arange(width)[None] < 2  # and two
    d = commit(conf, eligible, factor)
    want = reference_mask(conf, eligible, factor)
    assert torch.equal(d.commit, want)
    assert d.info["n_commit"].tolist() == want.sum(1).tolist()


def test_boundary_equality_passes():
    # sorted 0.9, 0.75, 0.75, 0.2, 0.1 with f = 1: rank 3's threshold is exactly 0.75 -> 3 commits
    # (a strict reading, (n + 1)(1 − c) < f, would stop at 2)
    conf = torch.tensor([[0.2, 0.75, 0.9, 0.1, 0.75]])
    d = commit(conf, torch.ones_like(conf, dtype=torch.bool), 1.0)
    assert d.commit[0].nonzero().squeeze(1).tolist() == [1, 2, 4]
    conf = torch.tensor([[0.2, 0.75, 0.9, 0.1, 0.74]])  # just below: 2 commits
    d = commit(conf, torch.ones_like(conf, dtype=torch.bool), 1.0)
    assert d.commit[0].nonzero().squeeze(1).tolist() == [1, 2]


# ------------------------------------------------------------------------- designed toy in the loop
def test_only_the_last_rank_failing_commits_everything_in_the_loop():
    """Four positions with p = 0.99, 0.95, 0.9, 0.3 and f = 1: ranks 2 and 3 pass (≥ 2/3, ≥ 3/4),
    rank 4 fails (0.3 < 0.8) and is the last, so NVlabs' code commits all four in one forward
    pass. Make the third position 0.7 (< 3/4) and the failure is no longer the last: 2, then the
    remaining two together (m = 2 always commits both) -> 2 NFE."""
    answer = [1, 2, 3, 4]
    prompts = [[0, 0]]
    cfg = DecodeConfig(gen_length=4)
    ctrl = build_controller("fast_dllm_factor", factor=1.0)
    second = [0.005, 0.02, 0.05, 0.1]  # the runner-up of each position (p = 0.3 is still the argmax)
    r = decode(ToyDenoiser(answer, [0.99, 0.95, 0.9, 0.3], vocab_size=16, second=second), prompts, ctrl, cfg,
               trace=True)
    assert r.nfe.tolist() == [1] and r.generated[0].tolist() == answer
    assert r.trace[0]["commit"][0, 2:].tolist() == [True] * 4
    r = decode(ToyDenoiser(answer, [0.99, 0.95, 0.7, 0.3], vocab_size=16, second=second), prompts, ctrl, cfg,
               trace=True)
    assert r.nfe.tolist() == [2] and r.generated[0].tolist() == answer
    assert [t["commit"][0, 2:].nonzero().squeeze(1).tolist() for t in r.trace] == [[0, 1], [2, 3]]
