"""The conformance suite: run on every registered controller, and shown to catch broken ones."""

from __future__ import annotations

import importlib.metadata
import textwrap

import pytest
import torch

from adaptive_decoding.framework.core.params import ControllerSpec, Param, ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.selection import select_topk
from adaptive_decoding.framework.testing.conformance import (
    check_controller,
    controller_checks,
    expected_failures,
)
from adaptive_decoding.framework.testing.controller_harness import PROMPTS, ConformanceError
from adaptive_decoding.framework.testing.toys import ContextToyDenoiser


def _cases():
    for name in CONTROLLERS.names():  # collection time: entry-point plugins appear here too
        xfail = expected_failures(name)
        for check_name, check in controller_checks():
            marks = [pytest.mark.xfail(reason=xfail[check_name], strict=True)] if check_name in xfail else []
            yield pytest.param(name, check, id=f"{name}-{check_name}", marks=marks)


@pytest.mark.parametrize("name, check", list(_cases()))
def test_registered_controller_conforms(name, check):
    check(name)


def test_the_context_toy_makes_prompts_matter():
    model = ContextToyDenoiser()
    res = decode(model, [list(p) for p in PROMPTS], build_controller("sequential"), DecodeConfig(gen_length=8))
    assert len({tuple(r) for r in res.generated.tolist()}) == len(PROMPTS)
    x = torch.tensor([[1, 2] + [15] * 4, [3, 4] + [15] * 4])
    top1 = model(x).softmax(-1).amax(-1)[:, 2:]
    assert not torch.allclose(top1[0], top1[1]) and top1.min() >= 0.3 - 1e-6 and top1.max() <= 0.99 + 1e-6


# ---------------------------------------------------------------------- broken controllers
class _Base(Controller):
    """A threshold rule used to build broken variants."""

    params = {"threshold": Param(float, low=0.0, high=1.0, tune=(0.5, 0.95))}

    def __init__(self, threshold: float = 0.7) -> None:
        self.threshold = threshold

    def decide(self, f, state):
        return Decision(commit=(f.eligible & (f.confidence > self.threshold)) | select_topk(f.confidence, f.eligible, 1))


class BatchLeak(_Base):
    """Threshold = the batch's mean confidence: rows influence each other."""

    def decide(self, f, state):
        t = f.confidence[f.eligible].mean()
        return Decision(commit=(f.eligible & (f.confidence > t)) | select_topk(f.confidence, f.eligible, 1))


class Staller(_Base):
    """Commits nothing when unsure."""

    def decide(self, f, state):
        return Decision(commit=f.eligible & (f.confidence > self.threshold))


class Trespasser(_Base):
    """Commits every position of the window from its second step on, decided or not."""

    def decide(self, f, state):
        if int(f.block_step.max()) == 0:
            return Decision(commit=select_topk(f.confidence, f.eligible, 1))
        return Decision(commit=torch.ones_like(f.eligible))


class BlockBlind(_Base):
    """Uses `masked` instead of `eligible`: wrong inside blocks when features covered the whole
    canvas; harmless under the window contract, where the window is the block."""

    def decide(self, f, state):
        return Decision(commit=(f.masked & (f.confidence > self.threshold)) | select_topk(f.confidence, f.eligible, 1))


class NoValidation(_Base):
    """Skips validation."""

    def validate(self):
        pass


class ValidatesInInit(_Base):
    """Raises in __init__."""

    def __init__(self, threshold: float = 0.7) -> None:
        if threshold < 0:
            raise ValueError("negative")
        self.threshold = threshold


class Undeclared(_Base):
    """A keyword without a Param."""

    def __init__(self, threshold: float = 0.7, speed: int = 2) -> None:
        self.threshold = threshold
        self.speed = speed


class Unseeded(_Base):
    """Draws from torch's global generator."""

    def decide(self, f, state):
        return Decision(commit=select_topk(torch.rand(f.confidence.shape), f.eligible, 2))


class FalselyStochastic(_Base):
    """Claims randomness it does not use."""

    stochastic = True


class BadFields(_Base):
    """k of zeros and a memory tensor that is not per sample."""

    def decide(self, f, state):
        state.memory["bad"] = torch.zeros(7)
        d = super().decide(f, state)
        return Decision(commit=d.commit, k=torch.zeros_like(f.x0))


class WideTune(_Base):
    """A tuning range outside the parameter's bounds."""

    params = {"threshold": Param(float, low=0.0, high=1.0, tune=(0.5, 1.5))}


class Mutates(_Base):
    """Keeps run state in a parameter."""

    def decide(self, f, state):
        self.threshold = float(self.threshold) * 0.99
        return super().decide(f, state)


class NestsByHand(_Base):
    """Holds a controller spec but builds and calls it itself (a second way to nest)."""

    params = {**_Base.params, "inner": ControllerSpec(doc="the wrapped controller")}

    def __init__(self, threshold: float = 0.7, inner: str = "sequential") -> None:
        self.threshold = threshold
        self.inner = inner


class RefersToNothing(_Base):
    """Declares a reference decode through a parameter it does not have."""

    reference_param = "reference"


class Undecided(Controller):
    """Never says what it commits."""

    params: dict = {}

    def __init__(self) -> None:
        pass


BROKEN = [
    (Undecided, "implements", "does not implement decide"),
    (NestsByHand, "implements", "not a Composite (adaptive_decoding.framework.engine.nesting)"),
    (RefersToNothing, "implements", "reference_param='reference' names no parameter"),
    (BatchLeak, "batch_invariance", "decoded alone gives"),
    (Staller, "progress", "committed none"),
    (Trespasser, "decided_positions", "not eligible"),
    (NoValidation, "param_validation", "threshold=-1.0 is outside the declared range"),
    (ValidatesInInit, "param_validation", "validation belongs in validate()"),
    (Undeclared, "params_declared", "['speed', 'threshold'] differ"),
    (Unseeded, "determinism", "decided differently"),
    (FalselyStochastic, "determinism", "declares stochastic=True"),
    (BadFields, "decision_fields", "k must be ≥ 1"),
    (WideTune, "search_space", "tune value 1.5"),
    (Mutates, "get_params_round_trip", "decoding changed the parameters"),
    (_Base, "save_load_round_trip", "register it"),
]


@pytest.mark.parametrize("cls, check_name, fragment", BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_the_suite_catches_broken_controllers(cls, check_name, fragment):
    check = dict(controller_checks())[check_name]
    with pytest.raises(ConformanceError) as err:
        check(cls)
    assert fragment in str(err.value), str(err.value)


def test_block_blind_passes_without_blocks():
    checks = dict(controller_checks())
    checks["decided_positions"](BlockBlind)
    checks["progress"](BlockBlind)


def test_check_controller_lists_every_failure_and_honours_expected_ones():
    with pytest.raises(ConformanceError) as err:
        check_controller(Staller, checks=["progress", "semi_ar_blocks", "params_declared"])
    msg = str(err.value)
    assert "'Staller'" in msg and "failed 2 of 3" in msg and "- progress:" in msg and "- semi_ar_blocks:" in msg
    with pytest.warns(UserWarning, match="expected failure of progress"):
        check_controller(Staller, checks=["progress"], expected_failed_checks={"progress": "known"})
    with pytest.warns(UserWarning, match="but passes"):
        check_controller("sequential", checks=["progress"], expected_failed_checks={"progress": "stale"})
    with pytest.raises(ValueError, match="unknown conformance check 'speed'"):
        check_controller("sequential", checks=["speed"])


# ---------------------------------------------------------------------- third-party plugins
PLUGIN = '''
import torch
from adaptive_decoding.framework import Controller, Decision, Param, select_topk


class AcmeQuantile(Controller):
    """Acme: commit positions at or above the row's q-quantile of confidence (at least one)."""

    params = {"q": Param(float, low=0.0, high=1.0, doc="quantile", tune=(0.5, 0.95))}

    def __init__(self, q: float = 0.75) -> None:
        self.q = q

    def decide(self, f, state):
        conf = torch.where(f.eligible, f.confidence, torch.full_like(f.confidence, float("nan")))
        cut = torch.nanquantile(conf, self.q, dim=1, keepdim=True)
        commit = (f.eligible & (f.confidence >= cut)) | select_topk(f.confidence, f.eligible, 1)
        return Decision(commit=commit)
'''


def test_an_entry_point_plugin_is_found_by_name_and_passes_the_suite(tmp_path, monkeypatch):
    (tmp_path / "acme_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="acme_quantile", value="acme_plugin:AcmeQuantile",
                                       group="adaptive_decoding.controllers")
    real = importlib.metadata.entry_points

    def fake_entry_points(**kw):
        return [ep] if kw.get("group") == "adaptive_decoding.controllers" else real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    monkeypatch.setattr(CONTROLLERS, "_table", dict(CONTROLLERS._table))
    monkeypatch.setattr(CONTROLLERS, "_loaded", False)
    assert "acme_quantile" in CONTROLLERS.names() and "margin_topk" in CONTROLLERS.names()
    ctrl = build_controller("acme_quantile", q=0.5)
    assert type(ctrl).__name__ == "AcmeQuantile" and ctrl.display_name() == "acme_quantile"
    check_controller("acme_quantile")
    with pytest.raises(ParameterError, match=r"acme_quantile.q=1.5 is out of range; allowed: number in \[0, 1\]"):
        build_controller("acme_quantile", q=1.5)
