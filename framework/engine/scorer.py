"""The scorer contract: rank lookahead rollouts; higher is better.

A scorer is a :class:`Configurable` (validated keyword parameters) with one method,
``score(candidates, context) -> Tensor[N]``. The lookahead (:mod:`adaptive_decoding.framework.engine.lookahead`) builds
:class:`Candidates` from its rollouts and commits the first step of the best one per sample.

Normalisation (so that weights in ``logprob:0.7,consistency:0.3,repetition:1`` mean something):
**every built-in scorer returns values in [−1, 0]**, where 0 is "no evidence of a problem" and −1
the worst the scorer can say:

* ``logprob``      ``p̄ − 1`` with p̄ = exp(mean log p) the geometric mean token probability,
* ``ar_logprob``   the same under the small causal LM,
* ``consistency``  ``(cos − 1) / 2`` with cos the cosine of MiniLM embeddings,
* ``repetition``   ``−`` the fraction of repeated n-grams,
* ``compliance``   ``−(1 − decay^v)`` for v violations (banned phrases, miscopied numbers).

A bounded scale (rather than z-scores within a candidate group) keeps a score a property of one
candidate: batch invariance holds by construction, a group of one is scored like any other, and
a weight w means "at most w units". A weighted sum Σ wᵢ sᵢ lies in [−Σ wᵢ, 0]. Candidates with
nothing decided (empty, or every position masked) score 0, the neutral value. The base class
enforces the contract: shape ``[N]``, non-finite values become the lower bound, values are
clamped to the bounds.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import Configurable, ParameterError
from adaptive_decoding.framework.core.registry import Registry
from adaptive_decoding.framework.engine.context import DecodeContext


@dataclass
class Candidates:
    """N candidate generations to rank (rows of the lookahead's rollouts).

    Attributes:
        tokens: long ``[N, G]``, the generation region of each rollout.
        source: long ``[N]``, the sample each candidate came from (an index into the context's
            per-sample fields ``prompt_text`` / ``meta``; the group it is ranked within).
        prompt_ids: long ``[N, P]``, each candidate's prompt, right-padded (``prompt_mask``).
        prompt_mask: bool ``[N, P]``, real prompt tokens.
        decided: bool ``[N, G]``, positions that hold a token (not the mask).
        logprobs: float ``[N, G]``, the denoiser's log-probability of the chosen token at the step
            it was chosen, where ``logprob_mask`` is true (positions decided by the rollout).
        logprob_mask: bool ``[N, G]``, where ``logprobs`` are available (default: nowhere).
    """

    tokens: torch.Tensor
    source: Optional[torch.Tensor] = None
    prompt_ids: Optional[torch.Tensor] = None
    prompt_mask: Optional[torch.Tensor] = None
    decided: Optional[torch.Tensor] = None
    logprobs: Optional[torch.Tensor] = None
    logprob_mask: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"Candidates.tokens must be [N, G], got shape {tuple(self.tokens.shape)}")
        n, g = self.tokens.shape
        dev = self.tokens.device
        if self.source is None:
            self.source = torch.arange(n, device=dev)
        if self.decided is None:
            self.decided = torch.ones(n, g, dtype=torch.bool, device=dev)
        if self.prompt_ids is None:
            self.prompt_ids = torch.zeros(n, 0, dtype=torch.long, device=dev)
        if self.prompt_mask is None:
            self.prompt_mask = torch.ones_like(self.prompt_ids, dtype=torch.bool)
        if self.logprobs is not None and self.logprob_mask is None:
            self.logprob_mask = self.decided.clone()
        for name in ("source", "decided", "logprobs", "logprob_mask"):
            t = getattr(self, name)
            if t is not None and t.shape[0] != n:
                raise ValueError(f"Candidates.{name} has {t.shape[0]} rows for {n} candidates")

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, index: torch.Tensor) -> "Candidates":
        """The candidates at ``index`` (a long tensor), every field indexed alike."""
        kw = {name: (getattr(self, name)[index] if getattr(self, name) is not None else None)
              for name in self.__dataclass_fields__}
        return Candidates(**kw)

    @staticmethod
    def cat(parts: Sequence["Candidates"]) -> "Candidates":
        """Concatenate candidate sets with the same G (prompts are re-padded)."""
        p = max(c.prompt_ids.shape[1] for c in parts)

        def pad(t: torch.Tensor, value: Any) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, p - t.shape[1]), value=value)

        has_lp = all(c.logprobs is not None for c in parts)
        return Candidates(
            tokens=torch.cat([c.tokens for c in parts]),
            source=torch.cat([c.source for c in parts]),
            prompt_ids=torch.cat([pad(c.prompt_ids, 0) for c in parts]),
            prompt_mask=torch.cat([pad(c.prompt_mask, False) for c in parts]),
            decided=torch.cat([c.decided for c in parts]),
            logprobs=torch.cat([c.logprobs for c in parts]) if has_lp else None,
            logprob_mask=torch.cat([c.logprob_mask for c in parts]) if has_lp else None,
        )


@dataclass
class ScoringContext:
    """What a scorer may know beyond the candidates; every field is optional.

    Attributes:
        tokenizer: follows :class:`adaptive_decoding.framework.models.protocol.Tokenizer` (text scorers need it; without
            one, token ids are rendered as space-separated numbers).
        denoiser: the model being decoded.
        prompt_text: per sample (indexed by ``Candidates.source``); default: the decoded prompt.
        meta: per-sample task meta dicts (``copy_numbers``: numbers the answer must copy,
            ``task``: the task name, ...), indexed by ``Candidates.source``; one dict = all samples.
        resources: shared objects a scorer may use instead of loading its own (``causal_lm``).
        special_ids: token ids that text and repetition scorers ignore (EOS, PAD, mask);
            default: those of the tokenizer / denoiser.
    """

    tokenizer: Any = None
    denoiser: Any = None
    prompt_text: Optional[Sequence[str]] = None
    meta: Any = None
    resources: dict[str, Any] = field(default_factory=dict)
    special_ids: Optional[Sequence[int]] = None

    @classmethod
    def of_decode(cls, context: DecodeContext, denoiser: Any = None) -> "ScoringContext":
        """The scorers' view of a decode call's :class:`~adaptive_decoding.framework.engine.context.DecodeContext`: its
        tokenizer, prompt texts and metas (indexed by the call's sample row, ``Candidates.source``) and the model."""
        return cls(tokenizer=context.tokenizer, denoiser=denoiser, prompt_text=context.prompt_text, meta=context.meta)

    def meta_for(self, source: int) -> dict[str, Any]:
        if self.meta is None:
            return {}
        if isinstance(self.meta, dict):
            return self.meta
        return self.meta[source] if 0 <= source < len(self.meta) and self.meta[source] else {}

    def specials(self) -> set[int]:
        if self.special_ids is not None:
            return {int(i) for i in self.special_ids}
        out: set[int] = set()
        for obj in (self.tokenizer, self.denoiser):
            for attr in ("eos_token_id", "pad_token_id", "mask_token_id"):
                v = getattr(obj, attr, None) if obj is not None else None
                if v is not None:
                    out.add(int(v))
        return out

    # ------------------------------------------------------------------ text helpers
    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (no specials); ids as numbers when there is no tokenizer."""
        ids = [int(i) for i in ids if int(i) not in self.specials()]
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        try:
            return self.tokenizer.decode(ids, stop_at_eos=False)
        except TypeError:
            return self.tokenizer.decode(ids)

    def candidate_texts(self, cands: Candidates) -> list[str]:
        """Each candidate's text; undecided positions split it (rendered as one space)."""
        toks = cands.tokens.tolist()
        dec = cands.decided.tolist()
        out = []
        for row, ok in zip(toks, dec):
            pieces, seg = [], []
            for t, d in zip(row, ok):
                if d:
                    seg.append(t)
                elif seg:
                    pieces.append(self.decode(seg))
                    seg = []
            if seg:
                pieces.append(self.decode(seg))
            out.append(" ".join(p for p in pieces if p))
        return out

    def prompt_texts(self, cands: Candidates) -> list[str]:
        """Each candidate's prompt text (``prompt_text`` by source, else decoded prompt ids)."""
        src = cands.source.tolist()
        if self.prompt_text is not None:
            return [self.prompt_text[s] if 0 <= s < len(self.prompt_text) else "" for s in src]
        ids = cands.prompt_ids.tolist()
        msk = cands.prompt_mask.tolist()
        return [self.decode([t for t, m in zip(r, mr) if m]) for r, mr in zip(ids, msk)]


class Scorer(Configurable, ABC):
    """Base of every scorer: implement :meth:`_score` (the one abstract method); call :meth:`score`.

    ``_score`` returns a float tensor ``[N]`` within :meth:`bounds` (see the module docstring);
    :meth:`score` handles ``N = 0``, checks the shape, maps non-finite values to the lower bound
    and clamps, so a faulty scorer can never produce NaN rankings.
    """

    #: a scorer that reads text (needs a tokenizer to be meaningful)
    needs_text: ClassVar[bool] = False
    #: may be a component of a ``--scorer`` spec (false for a scorer built from a spec itself, e.g. ``mixture``)
    nestable: ClassVar[bool] = True

    def bounds(self) -> tuple[float, float]:
        return (-1.0, 0.0)

    def score(self, candidates: Candidates, context: Optional[ScoringContext] = None) -> torch.Tensor:
        """Scores ``[N]`` (float32), higher is better, within :meth:`bounds`."""
        context = context or ScoringContext()
        n = candidates.n
        dev = candidates.tokens.device
        if n == 0:
            return torch.zeros(0, device=dev)
        out = self._score(candidates, context)
        out = torch.as_tensor(out, dtype=torch.float32, device=dev)
        if out.shape != (n,):
            raise RuntimeError(
                f"scorer {self.display_name()} returned shape {tuple(out.shape)} for {n} candidates; "
                f"expected ({n},)"
            )
        lo, hi = self.bounds()
        out = torch.where(torch.isfinite(out), out, torch.full_like(out, lo))
        return out.clamp(lo, hi)

    @abstractmethod
    def _score(self, candidates: Candidates, context: ScoringContext) -> torch.Tensor:
        """Raw scores ``[N]`` of the candidates, higher is better, within :meth:`bounds`."""

    def describe(self) -> str:
        return (self.__doc__ or "").strip().splitlines()[0] if self.__doc__ else ""


SCORERS: Registry[Scorer] = Registry(
    "scorer",
    base=Scorer,
    entry_point_group="adaptive_decoding.scorers",
    builtin_modules=("adaptive_decoding.scorers",),
)


def build_scorer(name: str, **params: Any) -> Scorer:
    """Build a registered scorer by name (unknown names list the known ones)."""
    return SCORERS.get(name).build(**params)  # type: ignore[return-value]


# ---------------------------------------------------------------------- spec strings
_COMPONENT = re.compile(r"^\s*(?P<name>[A-Za-z_][\w.-]*)\s*(?:\((?P<args>[^()]*)\))?\s*(?::\s*(?P<w>[^:]*))?$")


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_components(spec: str) -> list[tuple[str, float, dict[str, Any]]]:
    """``"logprob:0.7,repetition(n=3):1"`` -> ``[("logprob", 0.7, {}), ("repetition", 1.0, {"n": 3})]``.

    Each component is ``name[(key=value;key=value)][:weight]``; a missing weight is 1. Weights
    must be finite and ≥ 0; names must be registered scorers (the error lists the known ones).
    """
    from adaptive_decoding.framework.core.params import coerce_literal

    if not isinstance(spec, str) or not spec.strip():
        raise ParameterError(f"scorer spec {spec!r} is empty; expected e.g. 'logprob:0.7,repetition:0.3'")
    out = []
    for part in _split_top(spec.strip()):
        m = _COMPONENT.match(part)
        if not m:
            raise ParameterError(
                f"scorer spec component {part.strip()!r} is malformed; expected NAME, NAME:WEIGHT or "
                f"NAME(key=value;...):WEIGHT (in {spec!r})"
            )
        name, args, w = m.group("name"), m.group("args"), m.group("w")
        cls = SCORERS.get(name)  # unknown -> UnknownNameError listing the known scorers
        if not getattr(cls, "nestable", True):
            raise ParameterError(f"scorer spec {spec!r}: {name!r} cannot be nested inside a spec "
                                 f"(it is built from a spec itself); allowed: the scorers it would mix")
        weight = 1.0
        if w is not None:
            try:
                weight = float(w)
            except ValueError:
                raise ParameterError(
                    f"scorer spec {spec!r}: weight {w.strip()!r} of {name!r} is not a number; "
                    f"allowed: a finite number ≥ 0"
                ) from None
            if not math.isfinite(weight) or weight < 0:
                raise ParameterError(
                    f"scorer spec {spec!r}: weight {weight!r} of {name!r} is out of range; "
                    f"allowed: a finite number ≥ 0"
                )
        params: dict[str, Any] = {}
        if args and args.strip():
            for kv in args.split(";"):
                if "=" not in kv:
                    raise ParameterError(f"scorer spec {spec!r}: {kv.strip()!r} should be key=value")
                k, _, v = kv.partition("=")
                params[k.strip()] = coerce_literal(v.strip())
        out.append((name, weight, params))
    return out


def parse_scorer_spec(spec: str) -> Scorer:
    """Build a scorer from ``--scorer SPEC``.

    A bare registered name (``"logprob"``) builds that scorer; anything else
    (``"logprob:0.7,consistency:0.3,repetition:1"``) builds the weighted mixture ``mixture``.
    """
    comps = parse_components(spec)
    if len(comps) == 1 and ":" not in spec:
        name, _, params = comps[0]
        return build_scorer(name, **params)
    return build_scorer("mixture", spec=spec)
