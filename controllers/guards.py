"""Guards: wrapper controllers that make a commit rule safe where parallel commits are known to fail.

* ``number_guard``: positions inside a number (or any span a rule marks) are committed one at a
  time per span: the classic parallel-decoding error writes "265GB" for "256GB" by committing two
  digits of a number together. The wrapped controller decides; of its commits inside one span,
  only one is kept (the span's leftmost still-masked position with ``order=left_to_right``, the
  write-up's "decode numeric fields autoregressively", or the wrapped controller's most confident
  one with ``order=confidence``). Spans are maximal runs of *number positions*:

  - ``rule=digits``: a generation position whose token (decided, from ``state.context.canvas``)
    or prediction x0 (masked) is a digit token; digit tokens are ``digit_ids``, else every id of
    ``state.context.tokenizer`` whose text matches ``token_regex``;
  - ``rule=meta``: the positions the task marks (``Task.span_mask``), ``state.context.span_mask`` bool ``[B, G]``;
  - ``rule=both``: either.

  A call whose context lacks what the rule reads (no tokenizer and no ``digit_ids``; no ``span_mask``)
  fails with :class:`~adaptive_decoding.framework.engine.context.MissingContextError`.

* ``compliance_entropy``: compliance penalties enter the entropy the wrapped controller sees,
  ``H'_i = H_i + λ·π_i``, π_i = 1 where position i lies inside a violation (a banned phrase or a
  miscopied number, :class:`adaptive_decoding.scorers.compliance.Compliance`) of the row's predicted text (decided
  tokens, x0 at masked positions). With ``entropy_topk`` inside, a position about to write "the
  cheapest" keeps more candidates and is not committed, so the lookahead can branch there. It needs
  the tokenizer in the decode context (and the metas with ``numbers='meta'``); without, it fails.

Both wrap a controller given as ``inner`` (a name, ``tuned:PATH`` or ``{name, params}``) and
``inner_params`` (more of its params; :class:`adaptive_decoding.framework.engine.nesting.Wrapper`) and pass through its
``k``, ``depth`` and ``next_block_length``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.nesting import Wrapper, wrapped_params


def _tokenizer_ids(tokenizer: Any, pattern: str) -> list[int]:
    """Ids of ``tokenizer`` whose one-token text matches ``pattern`` (``re.search``)."""
    reg = re.compile(pattern)
    out = []
    for i in range(int(tokenizer.vocab_size)):
        try:
            text = tokenizer.decode([i], stop_at_eos=False)
        except Exception:  # noqa: BLE001 - ids a tokenizer cannot decode are not digits
            continue
        if text and reg.search(text):
            out.append(i)
    return out


def segment_ids(marked: torch.Tensor) -> torch.Tensor:
    """Span number ``[B, L]`` of each marked position (maximal runs; unmarked = -1)."""
    start = marked & ~torch.nn.functional.pad(marked[:, :-1], (1, 0), value=False)
    ids = start.long().cumsum(1) - 1
    return torch.where(marked, ids, torch.full_like(ids, -1))


def one_per_span(commit: torch.Tensor, spans: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """Keep, per (row, span), only the committed position with the highest ``score``."""
    b, l = commit.shape  # noqa: E741
    inside = commit & (spans >= 0)
    key = torch.arange(b, device=commit.device)[:, None] * (l + 1) + spans.clamp(min=0)  # [B, L]
    s = torch.where(inside, score.float(), torch.full_like(score, float("-inf"), dtype=torch.float))
    best = torch.full((b * (l + 1),), float("-inf"), device=commit.device)
    best.scatter_reduce_(0, key.reshape(-1), s.reshape(-1), reduce="amax")
    top = inside & (s == best[key])
    # several positions with the same best score: keep the leftmost
    pos = torch.arange(l, device=commit.device).expand(b, l)
    first = torch.full((b * (l + 1),), l, dtype=torch.long, device=commit.device)
    first.scatter_reduce_(0, key.reshape(-1), torch.where(top, pos, torch.full_like(pos, l)).reshape(-1), reduce="amin")
    keep = top & (pos == first[key])
    return (commit & (spans < 0)) | keep


@CONTROLLERS.register("number_guard", aliases=("span_guard",))
class NumberGuard(Wrapper):
    """Number guard: positions inside numbers (or marked spans) are committed one at a time per span."""

    kind = "heuristic"
    params = {
        **wrapped_params(),
        "rule": Param(str, choices=("digits", "meta", "both"), doc="what marks a span"),
        "digit_ids": Param(list, nullable=True, doc="token ids of digits; null = from the tokenizer"),
        "token_regex": Param(str, doc="a token is a digit when its text matches (with a tokenizer)"),
        "order": Param(str, choices=("left_to_right", "confidence"), doc="which position of a span goes first"),
    }

    def __init__(self, inner: str = "fast_dllm", inner_params: Optional[dict] = None, rule: str = "digits",
                 digit_ids: Optional[list] = None, token_regex: str = r"^\s*\d\s*$",
                 order: str = "left_to_right") -> None:
        self.inner = inner
        self.inner_params = inner_params
        self.rule = rule
        self.digit_ids = digit_ids
        self.token_regex = token_regex
        self.order = order

    def check_combination(self) -> None:
        super().check_combination()
        if self.digit_ids is not None and not (
            isinstance(self.digit_ids, (list, tuple)) and all(isinstance(i, int) and i >= 0 for i in self.digit_ids)
        ):
            raise ParameterError(f"number_guard.digit_ids={self.digit_ids!r} is not allowed; "
                                 f"allowed: a list of token ids (integers ≥ 0) or null")
        try:
            re.compile(self.token_regex)
        except re.error as exc:
            raise ParameterError(f"number_guard.token_regex={self.token_regex!r} is not a valid regular "
                                 f"expression ({exc})") from None
        if self.rule == "meta" and (self.digit_ids is not None or self.token_regex != r"^\s*\d\s*$"):
            self.warn_no_effect("digit_ids" if self.digit_ids is not None else "token_regex",
                                "rule='meta' marks spans from state.context.span_mask only")

    def reset(self, state: DecodeState) -> None:
        """Find the digit tokens (``rule`` digits/both) and check that the context holds what the rule
        reads: a tokenizer where ``digit_ids`` is not given, the task's ``span_mask`` for ``rule`` meta/both."""
        super().reset(state)
        self._digits: Optional[torch.Tensor] = None
        if self.rule in ("meta", "both"):
            state.context.require("number_guard", "span_mask",
                                  f"rule={self.rule!r} marks the spans the task gives; a task marks them with "
                                  f"Task.span_mask, and this call's task marks none")
        if self.rule != "meta":
            ids = list(self.digit_ids) if self.digit_ids is not None else None
            if ids is None:
                tok = state.context.require("number_guard", "tokenizer",
                                            f"rule={self.rule!r} finds digit tokens through it; or give digit_ids")
                ids = _tokenizer_ids(tok, self.token_regex)
            self._digits = torch.as_tensor(sorted(set(ids)), dtype=torch.long, device=state.seeds.device)

    def number_positions(self, f: StepFeatures, state: DecodeState) -> torch.Tensor:
        """Bool ``[B, L]``: generation positions inside a number (or a marked span)."""
        g = state.config.gen_length
        in_gen = (f.position >= 0) & (f.position < g)
        marked = torch.zeros_like(f.eligible)
        digits = self._digits
        if self.rule in ("digits", "both") and digits.numel():
            canvas = state.context.canvas
            tok = f.x0 if canvas is None or canvas.shape != f.x0.shape else torch.where(f.masked, f.x0, canvas)
            marked |= torch.isin(tok, digits.to(tok.device)) & in_gen
        span = state.context.span_mask
        if self.rule in ("meta", "both"):
            idx = f.position.clamp(0, max(0, span.shape[1] - 1))
            marked |= span.to(f.eligible.device).bool().gather(1, idx) & in_gen & (f.position < span.shape[1])
        return marked

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        d = self.wrapped().decide(f, state)
        commit = d.commit & f.eligible
        spans = segment_ids(self.number_positions(f, state))
        if self.order == "left_to_right":
            # the span's leftmost still-masked position replaces the inner's commits in that span
            first = one_per_span(f.eligible, spans, -f.position.float()) & (spans >= 0)
            any_in = commit & (spans >= 0)
            b, l = commit.shape  # noqa: E741
            key = torch.arange(b, device=commit.device)[:, None] * (l + 1) + spans.clamp(min=0)
            hit = torch.zeros(b * (l + 1), dtype=torch.bool, device=commit.device)
            hit[key[any_in]] = True
            touched = first & hit[key]
            guarded = (commit & (spans < 0)) | touched
        else:
            guarded = one_per_span(commit, spans, f.confidence)
        info = dict(d.info)
        info["guarded"] = (commit & ~guarded).sum(1)
        return dataclasses.replace(d, commit=guarded, info=info)


@CONTROLLERS.register("compliance_entropy")
class ComplianceEntropy(Wrapper):
    """Compliance entropy: H' = H + λ·π (π = 1 inside a predicted violation) for the wrapped controller."""

    kind = "heuristic"
    params = {
        **wrapped_params(),
        "weight": Param(float, low=0.0, doc="λ, nats added to H inside a violation", tune=(0.5, 4.0)),
        "compliance": Param(dict, nullable=True, doc="parameters of the compliance scorer (banned, numbers, ...)"),
    }

    def __init__(self, inner: str = "entropy_topk", inner_params: Optional[dict] = None, weight: float = 2.0,
                 compliance: Optional[dict] = None) -> None:
        self.inner = inner
        self.inner_params = inner_params
        self.weight = weight
        self.compliance = compliance

    def check_combination(self) -> None:
        super().check_combination()
        from adaptive_decoding.scorers.compliance import Compliance

        if self.compliance is not None and not isinstance(self.compliance, Mapping):
            raise ParameterError(f"compliance_entropy.compliance={self.compliance!r} is not allowed; "
                                 f"allowed: a mapping of compliance-scorer parameters, or null")
        try:
            self._scorer = Compliance.build(**dict(self.compliance or {}))
        except ParameterError as exc:
            raise ParameterError(f"compliance_entropy.compliance: {exc}") from None

    def reset(self, state: DecodeState) -> None:
        """Check that the context holds what the penalty reads: the tokenizer (the predicted text), and
        the task's metas where the compliance scorer copies numbers from ``meta``."""
        super().reset(state)
        state.context.require("compliance_entropy", "tokenizer", "it reads the predicted text")
        if getattr(self._scorer, "numbers", None) == "meta":
            state.context.require("compliance_entropy", "meta", "compliance numbers='meta' reads copy_numbers")

    def penalty(self, f: StepFeatures, state: DecodeState) -> torch.Tensor:
        """π ``[B, L]``: 1 at generation positions inside a violation of the predicted text."""
        tok = state.context.tokenizer
        pen = torch.zeros_like(f.entropy)
        g = state.config.gen_length
        canvas = state.context.canvas
        ids = f.x0 if canvas is None or canvas.shape != f.x0.shape else torch.where(f.masked, f.x0, canvas)
        specials = {getattr(tok, a, None) for a in ("eos_token_id", "pad_token_id", "mask_token_id")}
        prompts = state.context.prompt_text
        metas = state.context.meta
        sample = state.context.sample_index
        pos = f.position.tolist()
        for b, row in enumerate(ids.tolist()):  # text matching is per row by nature
            gen = [(i, t) for i, (t, p) in enumerate(zip(row, pos[b])) if 0 <= p < g]
            prompt_ids = [t for t, p in zip(row, pos[b]) if p < 0]
            pieces = ["" if t in specials else tok.decode([t], stop_at_eos=False) for _, t in gen]
            text, offsets = _offsets(tok, [t for _, t in gen], pieces, specials)
            s = int(sample[b]) if isinstance(sample, torch.Tensor) else b
            prompt = prompts[s] if prompts is not None else tok.decode([t for t in prompt_ids if t not in specials],
                                                                        stop_at_eos=False)
            meta = metas if isinstance(metas, dict) else (metas[s] if metas is not None else {})
            for v in self._scorer.violations(text, prompt, meta or {}):
                for (i, _), (lo, hi) in zip(gen, offsets):
                    if lo < v.end and hi > v.start:
                        pen[b, i] = 1.0
        return pen

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        pen = self.penalty(f, state)
        entropy = torch.where(f.eligible, f.entropy + self.weight * pen, f.entropy)
        d = self.wrapped().decide(dataclasses.replace(f, entropy=entropy), state)
        info = dict(d.info)
        info["penalised"] = (pen > 0).sum(1)
        return dataclasses.replace(d, info=info)


def _offsets(tok: Any, ids: list[int], pieces: list[str], specials: set) -> tuple[str, list[tuple[int, int]]]:
    """The text of ``ids`` (specials dropped) and each token's character span in it."""
    keep = [i for i in ids if i not in specials]
    text = tok.decode(keep, stop_at_eos=False) if keep else ""
    own = ["" if i in specials else p for i, p in zip(ids, pieces)]
    spans: list[tuple[int, int]] = []
    if "".join(own) == text:  # the tokenizer concatenates token texts: offsets are cumulative
        at = 0
        for p in own:
            spans.append((at, at + len(p)))
            at += len(p)
        return text, spans
    prev = 0
    for k in range(1, len(ids) + 1):  # tokenizers that join tokens (spaces between words): prefixes
        prefix = [i for i in ids[:k] if i not in specials]
        cur = len(tok.decode(prefix, stop_at_eos=False)) if prefix else 0
        spans.append((prev, max(prev, cur)))
        prev = max(prev, cur)
    return text, spans
