"""``mixture``: the weighted mixture ``s = Σ wᵢ sᵢ`` of registered scorers.

Built from a spec string, the same one ``--scorer`` takes: ``"logprob:0.7,consistency:0.3,
repetition:1"`` (``name[(key=value;...)][:weight]``, weight 1 if omitted). Every component lies
in [−1, 0], so the mixture lies in [−Σ wᵢ, 0] and a weight says how many units a component may
cost at most. The default is the mixture of the technique's write-up: 0.7 · log-probability +
0.3 · consistency, minus the repetition penalty.
"""

from __future__ import annotations

from typing import Any

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.scorer import (
    SCORERS,
    Candidates,
    Scorer,
    ScoringContext,
    build_scorer,
    parse_components,
)

DEFAULT_SPEC = "logprob:0.7,consistency:0.3,repetition:1"


@SCORERS.register("mixture", aliases=("hybrid", "weighted"))  # ``hybrid``: its name in earlier specs
class Mixture(Scorer):
    """Weighted sum of scorers from a spec such as 'logprob:0.7,consistency:0.3,repetition:1'."""

    nestable = False  # built from a spec itself: never a component of one

    params = {
        "spec": Param(str, doc="components: name[(key=value;...)][:weight], comma-separated"),
    }

    def __init__(self, spec: str = DEFAULT_SPEC) -> None:
        self.spec = spec

    @classmethod
    def conformance_params(cls) -> dict[str, Any]:
        """Every built-in component, with the light embedding for consistency."""
        return {"spec": "logprob:0.7,consistency(model=hashing):0.3,repetition:1,compliance:0.5,ar_logprob:0.2"}

    def check_combination(self) -> None:
        self.components()

    def components(self) -> list[tuple[Scorer, float]]:
        """The built ``(scorer, weight)`` pairs (rebuilt when ``spec`` changes)."""
        if getattr(self, "_built_spec", None) != self.spec:
            self._components = [(build_scorer(name, **params), w) for name, w, params in parse_components(self.spec)]
            self._built_spec = self.spec
        return self._components

    @property
    def needs_text(self) -> bool:  # type: ignore[override]
        return any(s.needs_text for s, w in self.components() if w > 0)

    def bounds(self) -> tuple[float, float]:
        lo = sum(w * s.bounds()[0] for s, w in self.components())
        hi = sum(w * s.bounds()[1] for s, w in self.components())
        return (lo, hi)

    def parts(self, c: Candidates, context: ScoringContext) -> dict[str, torch.Tensor]:
        """Each component's (unweighted) scores, keyed by its registry name."""
        return {s.display_name(): s.score(c, context) for s, w in self.components() if w > 0}

    def _score(self, c: Candidates, context: ScoringContext) -> torch.Tensor:
        total = torch.zeros(c.n, device=c.tokens.device)
        for s, w in self.components():
            if w > 0:
                total = total + w * s.score(c, context)
        return total

    def get_components(self) -> list[dict[str, Any]]:
        return [{"name": s.display_name(), "weight": w, "params": s.get_params()} for s, w in self.components()]
