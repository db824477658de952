"""End-of-text prediction (``DecodeConfig.eos_fill``): after a confident EOS commit, the rest of the
generation is filled with EOS and never decoded; combinable with every baseline controller."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.testing.toys import ToyDenoiser

G, P = 16, 2
EOS = 14  # ToyDenoiser(vocab_size=16): eos = V - 2
PROMPTS = [[0, 1], [2, 3]]
# a short answer, then EOS: the first EOS is confident, the padding after it is not
ANSWER = [3, 4, 5] + [EOS] * 13
CONF = [0.6, 0.7, 0.8, 0.99] + [0.5] * 12


def toy(answer=ANSWER, conf=CONF):
    return ToyDenoiser(answer=answer, conf=conf, vocab_size=16, prompt_length=P)


def run(name, eos_fill, model=None, block_length=None, threshold=0.9, prompts=PROMPTS, seed=0, **params):
    ctrl = name if isinstance(name, Controller) else build_controller(name, **params)
    cfg = DecodeConfig(gen_length=G, block_length=block_length, eos_fill=eos_fill, eos_fill_threshold=threshold,
                       seed=seed)
    return decode(model or toy(), prompts, ctrl, cfg, trace=True)


def steps(r, row=0):
    """Generation positions committed by the controller at each step of ``row``."""
    out = []
    for t in r.trace:
        rows = t["rows"].tolist()
        if row in rows:
            out.append(t["commit"][rows.index(row), P:P + G].nonzero().squeeze(1).tolist())
    return out


def check_canvas(r, mask_id=15):
    assert r.tokens[:, :P].tolist() == PROMPTS  # prompt untouched
    assert not (r.generated == mask_id).any()  # nothing left masked


@pytest.mark.parametrize("name", ["sequential", "fast_dllm"])
def test_confident_eos_stops_decoding(name):
    full = run(name, eos_fill=False)
    fill = run(name, eos_fill=True)
    # without the fill, the 12 unsure EOS positions take one step each after the answer
    assert full.nfe.tolist() == [16, 16]
    # with it: the EOS at position 3 (p = 0.99) first, then the three answer tokens
    assert steps(fill) == [[3], [2], [1], [0]]
    assert fill.nfe.tolist() == [4, 4]
    assert fill.generated.tolist() == full.generated.tolist() == [ANSWER, ANSWER]
    check_canvas(fill)


def test_fill_writes_eos_and_never_overwrites_a_committed_token():
    # position 3 (token 7, p = 0.999) is committed before the EOS at 2 (p = 0.99); position 5 would
    # decode to 9 (p = 0.4) but lies after the EOS, so it is filled and never decoded.
    answer = [3, 4, EOS, 7, EOS, 9] + [EOS] * 10
    conf = [0.6, 0.7, 0.99, 0.999, 0.5, 0.4] + [0.5] * 10
    fill = run("sequential", eos_fill=True, model=toy(answer, conf))
    assert steps(fill) == [[3], [2], [1], [0]]
    assert fill.generated[0].tolist() == [3, 4, EOS, 7] + [EOS] * 12
    full = run("sequential", eos_fill=False, model=toy(answer, conf))
    assert full.generated[0].tolist() == answer and full.nfe.tolist() == [16, 16]
    check_canvas(fill)


def test_low_confidence_eos_does_not_fill():
    # the same EOS, p = 0.99, below a stricter fill threshold: the run equals the unfilled one
    strict = run("sequential", eos_fill=True, threshold=0.995)
    full = run("sequential", eos_fill=False)
    assert steps(strict) == steps(full) and strict.nfe.tolist() == [16, 16]
    # an EOS committed first but with p = 0.85 < 0.9 does not trigger either
    answer, conf = [3] + [EOS] * 15, [0.6, 0.85] + [0.5] * 14
    r = run("sequential", eos_fill=True, model=toy(answer, conf))
    assert steps(r)[0] == [1] and r.nfe.tolist() == [16, 16]
    assert r.generated[0].tolist() == answer


class WriteEOS(Controller):
    """Commits the most confident position but writes EOS there (as a lookahead could)."""

    kind = "heuristic"
    params: dict = {}

    def __init__(self) -> None:
        pass

    def decide(self, f, state):
        return Decision(commit=select_topk(f.confidence, f.eligible, 1), tokens=torch.full_like(f.x0, EOS))


def test_fill_needs_the_confidence_of_the_eos_itself():
    """p(x0) = 0.99 belongs to token 3, not to the EOS written there: no fill."""
    model = toy([3] * G, [0.99] * G)
    r = run(WriteEOS(), eos_fill=True, model=model)
    assert r.nfe.tolist() == [16, 16] and r.generated[0].tolist() == [EOS] * G
    # positive control: when the prediction itself is a confident EOS, the first commit fills all
    r = run(WriteEOS(), eos_fill=True, model=toy([EOS] * G, [0.99] * G))
    assert r.nfe.tolist() == [1, 1] and r.generated[0].tolist() == [EOS] * G


BASELINES = [n for n in CONTROLLERS.names() if CONTROLLERS.get(n).kind in ("reference", "baseline")]


@pytest.mark.parametrize("block_length", [None, 4])
@pytest.mark.parametrize("name", BASELINES)
def test_eos_fill_works_with_every_baseline(name, block_length):
    # the toy is context-free and its tail is EOS: same text, never more forward passes, and fewer
    # unless the run already ends within 4 steps; a random-order baseline saves nothing in a run
    # whose order reaches position 3 (the confident EOS) last, so it gets three seeds
    saved = []
    for seed in (0, 1, 2) if CONTROLLERS.get(name).stochastic else (0,):
        full = run(name, eos_fill=False, block_length=block_length, seed=seed)
        fill = run(name, eos_fill=True, block_length=block_length, seed=seed)
        check_canvas(fill)
        assert fill.generated.tolist() == full.generated.tolist() == [ANSWER, ANSWER]
        assert (fill.nfe <= full.nfe).all()
        saved.append(bool(((fill.nfe < full.nfe) | (full.nfe <= 4)).all()))
        if CONTROLLERS.get(name).verifies:  # on a plain toy each verification probe is a forward too
            assert all(int(fill.nfe[b]) >= len(steps(fill, b)) for b in (0, 1))
        else:
            assert fill.nfe.tolist() == [len(steps(fill, b)) for b in (0, 1)]
    assert any(saved)
    for b in (0, 1):  # once position 3's EOS is in, nothing after it is ever decoded
        s = steps(fill, b)
        at = next(i for i, pos in enumerate(s) if 3 in pos)
        assert all(p < 3 for later in s[at + 1:] for p in later)
        assert sum(len(x) for x in s) <= G
