"""The peer features: dependence read from a task's declared structure (a Sudoku cell's row, column
and box), on designed grids, under every cache mode, and through a policy file to the controller."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.learning.features import FEATURE_NAMES, PEER_FEATURES, peer_columns
from adaptive_decoding.framework.learning.nets import PolicyNet
from adaptive_decoding.framework.learning.policy import load_policy, save_policy
from adaptive_decoding.framework.learning.rollouts import StepRecorder
from adaptive_decoding.framework.models.structure import (
    generation_peers,
    generation_structure,
    task_generation_structure,
)
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.testing.toys import CachedToy, ContextToyDenoiser

GRID4 = {"kind": "sudoku", "size": 4, "offset": 0}  # a 4×4 Sudoku at generation positions 0 … 15


def test_the_generation_structure_of_a_task_and_its_peers():
    assert task_generation_structure(get_task("sudoku9")) == {"kind": "sudoku", "size": 9, "offset": 0}
    assert task_generation_structure(get_task("phrases")) is None
    assert generation_structure({"kind": "sudoku", "size": 4, "offsets": [0, 20]}, 17) == \
        {"kind": "sudoku", "size": 4, "offset": 3}  # the answer's grid starts 3 positions into the generation
    assert generation_structure({"kind": "sudoku", "size": 4, "offsets": [0]}, 17) is None  # in the prompt only
    peers = generation_peers({"kind": "sudoku", "size": 4, "offset": 2}, 20)
    assert peers.shape == (20, 20) and not peers.diagonal().any() and torch.equal(peers, peers.T)
    assert not peers[:2].any() and not peers[18:].any()  # off the grid: no peers
    assert peers[2].nonzero().squeeze(1).tolist() == [3, 4, 5, 6, 7, 10, 14]  # cell 0: row, box, column
    assert generation_peers(None, 20) is None
    with pytest.raises(ValueError, match="offset=10 puts 16 cells beyond the generation of 20"):
        generation_peers({"kind": "sudoku", "size": 4, "offset": 10}, 20)
    with pytest.raises(ValueError, match="kind='graph' is unknown; allowed: sudoku"):
        generation_peers({"kind": "graph"}, 20)


def test_peer_columns_on_a_designed_4x4_grid():
    """Cell 0's peers are 1, 2, 3 (row), 4, 8, 12 (column) and 5 (box); uncertain = below 0.9."""
    conf = torch.tensor([[0.6, 0.7, 0.95, 0.99, 0.99, 0.8, 0.99, 0.99,
                          0.99, 0.99, 0.5, 0.99, 0.99, 0.99, 0.99, 0.99]])
    x0 = (torch.arange(16) + 10)[None].clone()  # every cell its own guess ...
    x0[0, [0, 2, 10, 12]] = 3  # ... but for these four
    eligible = torch.ones(1, 16, dtype=torch.bool)
    eligible[0, 12] = False  # decided: not a rival, not a same guess
    f = SimpleNamespace(eligible=eligible, confidence=conf, position=torch.arange(16)[None], x0=x0)
    cols = dict(zip(PEER_FEATURES, peer_columns(f, generation_peers(GRID4, 16))))
    at = lambda name, i: round(float(cols[name][0, i]), 6)  # noqa: E731
    # cell 0: uncertain peers 1 (0.7) and 5 (0.8) of 7; behind 5; cell 2 guesses 3 too (12 is decided)
    assert [at(n, 0) for n in PEER_FEATURES] == [round(2 / 7, 6), 0.8, 0.0, 0.95]
    # cell 5: uncertain peers 0 (0.6) and 1 (0.7); it leads them; no peer shares its guess
    assert [at(n, 5) for n in PEER_FEATURES] == [round(2 / 7, 6), 0.7, 1.0, 0.0]
    # cell 10: no uncertain peer (2 is certain at 0.95), but 2 guesses 3 as well
    assert [at(n, 10) for n in PEER_FEATURES] == [0.0, 0.0, 1.0, 0.95]
    none = peer_columns(f, None)  # no declared structure: no peers
    assert [float(c[0, 0]) for c in none] == [0.0, 0.0, 1.0, 0.0]


class _FeatureRecorder(StepRecorder):
    def record(self, f, state, rows, decision):
        b, i = f.eligible.nonzero(as_tuple=True)
        return (f.position[b, i], rows[b], self.features(f)[b, i])


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_peer_features_equal_their_no_cache_values_under_every_cache_mode(cache):
    """Blocks of 8 over a 4×4 grid (so a cell's peers lie in both blocks): every step's features."""
    toy = CachedToy(ContextToyDenoiser(vocab_size=8))
    runs = {}
    for mode in ("none", cache):
        rec = _FeatureRecorder(build_controller("fast_dllm", threshold=0.9), 16, GRID4)
        decode(toy, [[1, 2], [3]], rec, DecodeConfig(gen_length=16, block_length=8, cache=mode),
               seeds=torch.arange(2))
        runs[mode] = [torch.cat([r[k] for r in rec.records]) for k in range(3)]
    for a, b in zip(runs["none"], runs[cache]):
        assert torch.equal(a, b)
    peer = [FEATURE_NAMES.index(n) for n in PEER_FEATURES]
    assert runs["none"][2][:, peer[0]].sum() > 0 and (runs["none"][2][:, peer[2]] < 1).any()


def _leads_policy(path, structure):
    """A logistic policy that reads one column, peer_leads: p(safe) = σ(10·leads − 5)."""
    net = PolicyNet(len(FEATURE_NAMES), ())
    with torch.no_grad():
        net.net[0].weight.zero_()
        net.net[0].weight[0, FEATURE_NAMES.index("peer_leads")] = 10.0
        net.net[0].bias.fill_(-5.0)
    return save_policy(net, path, kind="logreg", threshold=0.9, meta={"structure": structure})


def test_a_policy_reads_the_structure_it_was_trained_with(tmp_path):
    """Through its file, a policy that trusts only peer leaders decides exactly as peer_nms (τ 0.9, no
    floor) at every step; the same weights without a structure see no peers and commit everything."""
    toy, cfg = ContextToyDenoiser(vocab_size=8), DecodeConfig(gen_length=16, block_length=16)
    prompts = [[1], [2, 3], [4], [5]]
    with_peers = _leads_policy(tmp_path / "peers.pt", GRID4)
    assert load_policy(with_peers).structure == GRID4
    learned = decode(toy, prompts, build_controller("logreg", policy=str(with_peers), threshold=0.9), cfg)
    rule = decode(toy, prompts, build_controller("peer_nms", threshold=0.9, floor=0.0, grid=4), cfg)
    assert torch.equal(learned.generated, rule.generated) and learned.nfe.tolist() == rule.nfe.tolist()
    assert min(learned.nfe.tolist()) > 1
    blind = _leads_policy(tmp_path / "blind.pt", None)
    assert load_policy(blind).structure is None
    once = decode(toy, prompts, build_controller("logreg", policy=str(blind), threshold=0.9), cfg)
    assert once.nfe.tolist() == [1] * len(prompts)


def test_the_features_of_a_structured_step_read_the_peers():
    """A recorder given the structure changes only the last four columns (the peer ones)."""
    toy = ContextToyDenoiser(vocab_size=8)
    rec = _FeatureRecorder(build_controller("sequential"), 16, GRID4)
    decode(toy, [[1]], rec, DecodeConfig(gen_length=16, block_length=16))
    plain = _FeatureRecorder(build_controller("sequential"), 16, None)
    decode(toy, [[1]], plain, DecodeConfig(gen_length=16, block_length=16))
    a, b = rec.records[0][2], plain.records[0][2]
    n = len(PEER_FEATURES)
    assert torch.equal(a[:, :-n], b[:, :-n])  # the structure changes the peer columns only
    assert torch.equal(b[:, -n:], torch.tensor([0.0, 0.0, 1.0, 0.0]).expand(len(b), n))
    assert not torch.equal(a[:, -n:], b[:, -n:])
