"""The scorer conformance suite over every registered scorer (built-in and entry-point ones)."""

from __future__ import annotations

import pytest

from adaptive_decoding.framework.engine.scorer import SCORERS
from adaptive_decoding.framework.testing.scorer_conformance import (
    ScorerConformanceError,
    check_scorer,
    scorer_checks,
)
from adaptive_decoding.scorers.consistency import Consistency

CHECKS = list(scorer_checks())


class MiniLMConsistency(Consistency):
    """The consistency scorer with the real MiniLM (the registered one uses hashing in the suite)."""

    registry_name = "consistency"

    @classmethod
    def conformance_params(cls):
        return {"model": "minilm"}


@pytest.mark.parametrize("check_name, check", CHECKS, ids=[c[0] for c in CHECKS])
@pytest.mark.parametrize("name", SCORERS.names())
def test_registered_scorer_conforms(name, check_name, check):
    check(name)


@pytest.mark.parametrize("check_name, check", CHECKS, ids=[c[0] for c in CHECKS])
def test_consistency_with_real_minilm_conforms(check_name, check):
    check(MiniLMConsistency)


def test_suite_catches_a_batch_dependent_scorer():

    from adaptive_decoding.framework.engine.scorer import Scorer

    class GroupZ(Scorer):
        """z-scores within the batch (a score that depends on the other candidates)."""

        params: dict = {}

        def __init__(self) -> None:
            pass

        def bounds(self):
            return (-10.0, 10.0)

        def _score(self, c, ctx):
            v = c.decided.sum(1).float()
            return (v - v.mean()) / (v.std(unbiased=False) + 1.0)

    with pytest.raises(ScorerConformanceError, match="differ from single scores"):
        check_scorer(GroupZ)


def test_suite_catches_logic_in_init_and_unvalidated_params():
    from adaptive_decoding.framework.core.params import Param
    from adaptive_decoding.framework.engine.scorer import Scorer

    class Sloppy(Scorer):
        """stores a transformed value and never validates its range"""

        params = {"n": Param(int, doc="unchecked")}

        def __init__(self, n: int = 2) -> None:
            self.n = [n]

        def _score(self, c, ctx):
            return -c.decided.float().mean(1)

    with pytest.raises(ScorerConformanceError, match="does not store n as given"):
        check_scorer(Sloppy)


def test_suite_catches_a_scorer_without_score():
    from adaptive_decoding.framework.engine.scorer import Scorer

    class Blank(Scorer):
        """never scores"""

        params: dict = {}

        def __init__(self) -> None:
            pass

    with pytest.raises(ScorerConformanceError, match=r"^Blank: does not implement _score \(abstract in Scorer\)$"):
        check_scorer(Blank)
