"""The jobs' guard wraps the decode call: the loop gets the controller and lookahead themselves, and a
failure is named by the part that raised it (controller, nested controller, lookahead) or left alone."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.jobs.errors import ControllerFailure, DeadlineExceeded, ScorerFailure
from adaptive_decoding.framework.jobs.guards import guarded_decode
from adaptive_decoding.framework.testing.toys import ToyDenoiser

CONFIG = DecodeConfig(gen_length=4)
PROMPTS = [[1, 2], [3, 4]]


def toy() -> ToyDenoiser:
    return ToyDenoiser([3, 4, 5, 6], [0.9, 0.5, 0.4, 0.3], vocab_size=16, prompt_length=2)


class Explodes(Controller):
    """One token a step until step ``at``, then raises (in ``decide``, or in ``reset`` with at = -1)."""

    params = {"at": Param(int, low=-1)}

    def __init__(self, at: int = 1) -> None:
        self.at = at

    def reset(self, state):
        super().reset(state)
        if self.at < 0:
            raise ValueError("no reset today")

    def decide(self, f, state):
        if int(f.step.max()) >= self.at:
            raise RuntimeError("boom")
        return Decision(commit=select_topk(f.confidence, f.eligible, 1))


class SeesItself(Explodes):
    """Records the object the loop calls (the controller itself, not a proxy)."""

    seen: list = []

    def decide(self, f, state):
        SeesItself.seen.append(self)
        return Decision(commit=select_topk(f.confidence, f.eligible, 1))


def test_the_loop_gets_the_controller_itself_and_results_equal_a_plain_decode():
    from adaptive_decoding.framework.engine.loop import decode

    ctrl = SeesItself()
    res = guarded_decode(toy(), PROMPTS, ctrl, CONFIG, name="sees", seeds=[0, 1])
    assert SeesItself.seen and all(c is ctrl for c in SeesItself.seen)
    plain = decode(toy(), PROMPTS, SeesItself(), CONFIG, seeds=[0, 1])
    assert torch.equal(res.generated, plain.generated) and torch.equal(res.nfe, plain.nfe)


def test_a_controller_failure_names_the_controller_and_the_method():
    with pytest.raises(ControllerFailure, match=r"^controller 'ex' raised: RuntimeError: boom$") as err:
        guarded_decode(toy(), PROMPTS, Explodes(at=1), CONFIG, name="ex")
    assert isinstance(err.value.__cause__, RuntimeError)
    with pytest.raises(ControllerFailure, match=r"^controller 'ex' raised in reset: ValueError: no reset today$"):
        guarded_decode(toy(), PROMPTS, Explodes(at=-1), CONFIG, name="ex")


def test_a_nested_controller_failure_is_its_owners(monkeypatch):
    monkeypatch.setattr(CONTROLLERS, "_table", dict(CONTROLLERS._table))
    CONTROLLERS.add("explodes_for_guard_test", Explodes)
    sw = build_controller("switch", controllers=["sequential", {"name": "explodes_for_guard_test",
                                                               "params": {"at": 0}}], at=[2])
    with pytest.raises(ControllerFailure, match=r"^controller 'switch' raised: RuntimeError: boom$"):
        guarded_decode(toy(), PROMPTS, sw, CONFIG, name="switch")


class FailingModel(ToyDenoiser):
    def __init__(self, exc: Exception) -> None:
        super().__init__([3, 4, 5, 6], [0.9] * 4, vocab_size=16, prompt_length=2)
        self.exc = exc

    def forward(self, *args, **kwargs):
        raise self.exc


def test_failures_elsewhere_pass_unchanged():
    with pytest.raises(KeyError, match="not the controller's"):
        guarded_decode(FailingModel(KeyError("not the controller's")), PROMPTS, Explodes(at=9), CONFIG, name="ex")
    deadline = DeadlineExceeded("item", 1.0, 2.0)
    with pytest.raises(DeadlineExceeded) as err:
        guarded_decode(FailingModel(deadline), PROMPTS, Explodes(at=9), CONFIG, name="ex")
    assert err.value is deadline


class BrokenLookahead:
    """Refines by raising (what a broken scorer inside a lookahead looks like to the loop)."""

    def budget_left(self, state, spent):
        return 64 - spent

    def refine(self, *args, **kwargs):
        raise ValueError("scorer exploded")


class Deep(Explodes):
    def decide(self, f, state):
        return Decision(commit=select_topk(f.confidence, f.eligible, 1), depth=torch.ones(f.batch_size, dtype=torch.long))


def test_a_lookahead_failure_is_a_scorer_failure():
    with pytest.raises(ScorerFailure, match=r"^lookahead/scorer raised: ValueError: scorer exploded$"):
        guarded_decode(toy(), PROMPTS, Deep(), CONFIG, name="deep", lookahead=BrokenLookahead())
