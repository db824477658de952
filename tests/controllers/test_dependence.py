"""DUS decides as its published rule; neighbour suppression commits one per cluster of uncertain slots."""

from __future__ import annotations

import math

import pytest
import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.testing.toys import ToyDenoiser


def reference_dus_groups(block_length: int, alpha: float) -> list[list[int]]:
    """The published DUS schedule, written from the reference scheduler: R = ⌈log_a B⌉ steps,
    s_t = max(1, ⌊B / a^t⌋), P_t = {k ∉ U_{t-1} : (k − 1) mod s_t = 0} (1-based k), a last group
    smaller than the one before merged into it."""
    steps = math.ceil(math.log(block_length) / math.log(alpha))
    unmasked: set[int] = set()
    groups: list[list[int]] = []
    for t in range(1, steps + 1):
        s_t = max(1, int(block_length // (alpha ** t)))
        p_t = [k - 1 for k in range(1, block_length + 1) if k not in unmasked and (k - 1) % s_t == 0]
        if t == steps and groups and len(p_t) < len(groups[-1]):
            groups[-1].extend(p_t)
            continue
        groups.append(p_t)
        unmasked.update(k + 1 for k in p_t)
    return groups


def features(conf: list[list[float]], block_step: int = 0, block_length: int | None = None):
    """Designed features: a window of the given confidences, all eligible."""
    c = torch.tensor(conf, dtype=torch.float)
    b, w = c.shape
    n = block_length or w
    f = type("F", (), {})()
    f.confidence, f.eligible = c, torch.ones(b, w, dtype=torch.bool)
    f.block_start, f.block_end = torch.zeros(b, dtype=torch.long), torch.full((b,), n, dtype=torch.long)
    f.block_step = torch.full((b,), block_step, dtype=torch.long)
    return f


STATE = DecodeState(config=DecodeConfig(), seeds=torch.zeros(1, dtype=torch.long), mask_token_id=0)


@pytest.mark.parametrize("block_length,alpha", [(8, 2), (32, 2), (32, 4), (32, 3), (6, 2), (10, 3), (16, 16)])
def test_dus_commits_the_published_groups_step_by_step(block_length, alpha):
    ctrl = build_controller("dus", dilation=alpha)
    groups = reference_dus_groups(block_length, alpha)
    eligible = torch.ones(1, block_length, dtype=torch.bool)
    for t, group in enumerate(groups):
        f = features([[0.5] * block_length], block_step=t)
        f.eligible = eligible.clone()
        commit = ctrl.decide(f, STATE).commit[0]
        assert sorted(commit.nonzero().squeeze(1).tolist()) == sorted(group), f"step {t + 1}"
        eligible[0, commit] = False
    assert not eligible.any()


def test_dus_skip_threshold_defers_uncertain_positions_to_the_next_step():
    ctrl = build_controller("dus", dilation=2, threshold=0.5)
    conf = [[0.9, 0.9, 0.9, 0.9, 0.2, 0.9, 0.9, 0.9]]  # step 1 schedules {0, 4}; 4 is below 0.5
    commit = ctrl.decide(features(conf, 0), STATE).commit[0]
    assert commit.nonzero().squeeze(1).tolist() == [0]
    f = features([[0.9, 0.9, 0.9, 0.9, 0.8, 0.9, 0.9, 0.9]], 1)
    f.eligible[0, 0] = False
    assert f.eligible[0, 4] and ctrl.decide(f, STATE).commit[0].nonzero().squeeze(1).tolist() == [2, 4, 6]


def test_dus_decodes_a_block_in_log_steps():
    toy = ToyDenoiser(answer=[3] * 32, conf=[0.6] * 32)
    res = decode(toy, [[1, 2]], build_controller("dus", dilation=2), DecodeConfig(gen_length=32, block_length=8))
    assert res.generated.tolist() == [[3] * 32]
    assert res.nfe.tolist() == [4 * len(reference_dus_groups(8, 2))]  # 3 steps a block, 4 blocks
    assert res.forced.tolist() == [0]


@pytest.mark.parametrize("bad", [{"dilation": 0}, {"dilation": 1}, {"threshold": 1.5}])
def test_dus_bad_values_fail_naming_them(bad):
    (key, value), = bad.items()
    with pytest.raises(ParameterError, match=rf"dus\.{key}={value}"):
        build_controller("dus", **bad)


def test_neighbour_nms_commits_one_per_cluster_of_uncertain_positions():
    ctrl = build_controller("neighbour_nms", threshold=0.9, radius=1)
    conf = [[0.95, 0.40, 0.35, 0.92, 0.30, 0.33, 0.33, 0.20, 0.99]]
    commit = ctrl.decide(features(conf), STATE).commit[0].nonzero().squeeze(1).tolist()
    # certain: 0, 3, 8; uncertain runs [1, 2] -> 1, [4, 5, 6, 7] -> 5 (tie with 6 goes left) and 7 is
    # below 6's 0.33 so it is suppressed; 4 (0.30) is below 5
    assert commit == [0, 1, 3, 5, 8]


def test_neighbour_nms_radius_widens_the_suppression():
    conf = [[0.5, 0.1, 0.45, 0.1, 0.4]]
    near = build_controller("neighbour_nms", threshold=0.9, radius=1).decide(features(conf), STATE).commit[0]
    far = build_controller("neighbour_nms", threshold=0.9, radius=2).decide(features(conf), STATE).commit[0]
    assert near.nonzero().squeeze(1).tolist() == [0, 2, 4]
    assert far.nonzero().squeeze(1).tolist() == [0]


def peer_features(conf: list[float]):
    """A 4×4 Sudoku answer's window: cells 0..15 row-major, all eligible, at generation positions 0..15."""
    f = features([conf])
    f.position = torch.arange(len(conf))[None]
    return f


def test_peer_nms_commits_each_uncertain_cell_that_leads_its_uncertain_peers():
    """4×4 grid, boxes 2×2. Certain (≥ 0.99): 15. Uncertain: 0 (0.95) leads its peers (row 0: 1 0.93,
    column 0: 4, 8, 12, box: 1, 4, 5) and is committed; 1 (0.93) loses to 0; 10 (0.94) leads row 2
    (8 0.91, 11 0.92), column 2 (2 0.50, 6 0.92, 14 0.90) and box (11, 14) and is committed; 13 (0.97)
    shares no unit with 0 or 10 and leads its own (12, 14, 9, 5, 1) -> committed; cells below the
    floor 0.9 never are."""
    conf = [0.95, 0.93, 0.50, 0.60, 0.91, 0.92, 0.92, 0.40, 0.91, 0.80, 0.94, 0.92, 0.70, 0.97, 0.90, 0.995]
    ctrl = build_controller("peer_nms", threshold=0.99, floor=0.9, grid=4)
    commit = ctrl.decide(peer_features(conf), STATE).commit[0].nonzero().squeeze(1).tolist()
    assert commit == [0, 10, 13, 15]


def test_peer_nms_breaks_ties_by_the_lower_cell_and_bad_grids_fail():
    conf = [0.95] * 16
    commit = build_controller("peer_nms", threshold=0.99, floor=0.0, grid=4).decide(peer_features(conf), STATE).commit[0]
    # equal everywhere: a tie goes to the lower cell, so a cell is kept only when none of its peers is
    # lower; on a 4×4 grid every cell but 0 has a lower peer
    from adaptive_decoding.framework.models.structure import sudoku_peers

    peers = sudoku_peers(4) & ~torch.eye(16, dtype=torch.bool)
    expected = [i for i in range(16) if not peers[i, :i].any()]
    assert commit.nonzero().squeeze(1).tolist() == expected == [0]
    with pytest.raises(ParameterError, match=r"peer_nms\.grid=5 is not a square number"):
        build_controller("peer_nms", grid=5)
