"""The stages of one decoding step, each a small function with a typed input and output.

:func:`adaptive_decoding.framework.engine.loop.decode` runs, every step, on a :class:`Run` (what the call holds):

1. :func:`gather_window` -> :class:`Window`: the unfinished rows and each one's current block
   (advancing finished blocks), as ``[b, W]`` canvas columns; with multi-block decoding
   (``block_add_threshold``) every active block from the current one on (:func:`advance_blocks`);
2. :func:`forward` -> :class:`Forward`: the window logits, through the KV cache session; with a
   verifying controller also the shadow block (WINO) or exact probes; rows whose forward the previous
   step's lookahead already ran on this very canvas (its :class:`Handoff`) reuse it;
3. :func:`features` -> :class:`~adaptive_decoding.framework.engine.features.StepFeatures` on the window;
4. :func:`decide` -> ``controller.decide`` on the rows' :class:`DecodeState` view (its typed
   ``context`` carries the step's ``canvas`` and ``generation``);
5. :func:`refine` -> :class:`Refined`: the lookahead's tokens and commits where the decision asks for
   one, and the :class:`Handoff` of the forwards it ran on the canvas the next step decodes;
6. :func:`commit` -> :class:`StepOutcome`: the progress guarantee (≥ 1 token per unfinished row),
   end-of-text fill, re-masking within its bounds, and the step counters;
7. :func:`record` appends the step's trace record.

:func:`step` runs them in order. NFE is counted in one place: the stages that run forwards
(:func:`forward`, :func:`refine`) return them as a :class:`Cost`, and :func:`step` adds their sum to
the rows' counters once (:func:`charge`); no stage and no :class:`CacheSession` touches the counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from adaptive_decoding.framework.core.measure import synced_clock
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision, DecodeState, stay_limit_of
from adaptive_decoding.framework.engine.denoise import (
    CacheSession,
    Served,
    suppress_mask_logit,
    token_logprob,
    verification_logits,
)
from adaptive_decoding.framework.engine.features import (
    FeatureOptions,
    StepFeatures,
    StepWindow,
    compute_features,
)
from adaptive_decoding.framework.engine.selection import ensure_progress


@dataclass
class Canvas:
    """The whole batch's tokens and layout: ``x``, ``attn``, ``rel`` (column minus generation start),
    ``in_gen``, ``revocable`` (positions this decode committed), ``remask_count`` are ``[B, L]``;
    ``gen_start``, ``lengths`` (real tokens per row) ``[B]``; ``gen_index`` ``[B, G]``."""

    x: torch.Tensor
    attn: torch.Tensor
    gen_start: torch.Tensor
    gen_index: torch.Tensor
    rel: torch.Tensor
    in_gen: torch.Tensor
    lengths: torch.Tensor
    revocable: torch.Tensor
    remask_count: torch.Tensor


@dataclass
class Counters:
    """Per-sample progress ``[B]``: the figures of :class:`~adaptive_decoding.framework.engine.loop.DecodeResult` (the
    forwards ``nfe``, ``lookahead_nfe`` and ``cache_refreshes`` written by :func:`charge` only) and the
    semi-autoregressive block each row is in (``block_start``/``block_end`` relative to the generation,
    ``next_len`` the next block's length, ``block_masked_at_start`` its masked positions when it began).
    The active blocks run from the current one to ``active_end``; the last begins at ``last_start`` and
    has index ``last_index``; ``block_of`` ``[B, G]`` is each generation position's block index (−1
    before its block opens). One block at a time: ``active_end = block_end``, ``last_start = block_start``."""

    nfe: torch.Tensor
    steps: torch.Tensor
    block_step: torch.Tensor
    block_index: torch.Tensor
    forced: torch.Tensor
    lookahead_nfe: torch.Tensor
    remasks: torch.Tensor
    edits: torch.Tensor
    stay: torch.Tensor
    stay_steps: torch.Tensor
    escalations: torch.Tensor
    fallbacks: torch.Tensor
    cache_refreshes: torch.Tensor
    block_start: torch.Tensor
    block_end: torch.Tensor
    next_len: torch.Tensor
    block_masked_at_start: torch.Tensor
    active_end: torch.Tensor
    last_start: torch.Tensor
    last_index: torch.Tensor
    block_of: torch.Tensor

    @classmethod
    def start(cls, batch: int, block_length: int, gen_length: int, device: torch.device,
              first_end: Optional[torch.Tensor] = None) -> "Counters":
        """Zero counts; every row in its first block ``[0, first_end)`` (default ``min(block_length, G)``;
        a block-causal canvas's first block is the rest of the prompt's last block)."""
        zeros = lambda: torch.zeros(batch, dtype=torch.long, device=device)  # noqa: E731
        next_len = torch.full((batch,), block_length, dtype=torch.long, device=device)
        end = next_len.clone().clamp(max=gen_length) if first_end is None else first_end.to(device).long()
        pos = torch.arange(gen_length, device=device)[None, :]
        block_of = torch.where(pos < end[:, None], 0, -1).expand(batch, gen_length).clone()
        return cls(nfe=zeros(), steps=zeros(), block_step=zeros(), block_index=zeros(), forced=zeros(),
                   lookahead_nfe=zeros(), remasks=zeros(), edits=zeros(), stay=zeros().bool(), stay_steps=zeros(),
                   escalations=zeros(), fallbacks=zeros(),
                   cache_refreshes=zeros(), block_start=zeros(), block_end=end, next_len=next_len,
                   block_masked_at_start=zeros(), active_end=end.clone(), last_start=zeros(), last_index=zeros(),
                   block_of=block_of)


@dataclass
class Run:
    """What one decode call holds across its steps."""

    model: Any
    controller: Controller
    config: DecodeConfig
    lookahead: Any
    session: CacheSession
    state: DecodeState
    canvas: Canvas
    counters: Counters
    verifies: bool
    shadow_step: bool  # the shadow block rides in the step's own forward (verification='shadow')
    trace: bool
    block_add: Optional[float]  # multi-block decoding's threshold (None: one block at a time)
    t_start: float
    forward_seconds: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mask_id(self) -> int:
        return self.state.mask_token_id


@dataclass
class Window:
    """The rows decided this step (``rows`` ``[b]``; ``full`` when all B are) and their current blocks
    as window slots ``[b, W]``: canvas ``cols``, generation positions ``rel``, ``valid`` (inside the
    row's block; pad slots repeat the last column), current ``tokens``, ``eligible`` (masked and valid),
    ``revocable`` (decided by this decode), ``block_of`` (the slot's block relative to the row's first
    active block: 0, 1, …; multi-block decoding). ``canvas`` is the rows' ``[b, L]`` tokens (the batch's
    own tensor when ``full``), ``n_masked`` their masked generation positions."""

    rows: torch.Tensor
    full: bool
    start: torch.Tensor
    length: torch.Tensor
    cols: torch.Tensor
    rel: torch.Tensor
    valid: torch.Tensor
    tokens: torch.Tensor
    eligible: torch.Tensor
    revocable: torch.Tensor
    canvas: torch.Tensor
    n_masked: torch.Tensor
    block_of: torch.Tensor

    def sub(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` ``[B, …]`` at the window's rows (``t`` itself when every row is decided)."""
        return t if self.full else t[self.rows]


@dataclass
class Cost:
    """The forward passes a stage ran, per window row ``[b]`` (long): ``forward`` the step's own (1, or
    0 where the row reused a handed-on forward; the shadow block rides in it), ``verification`` a
    verifying controller's separate shadow forward or exact probes, ``lookahead`` the rollout, branch
    and re-scoring forwards. ``refreshes``: how many of ``forward`` refreshed the KV cache (a part of
    it, not added to the NFE)."""

    forward: torch.Tensor
    verification: torch.Tensor
    lookahead: torch.Tensor
    refreshes: torch.Tensor

    @classmethod
    def zero(cls, w: Window) -> "Cost":
        """Nothing spent, for the window's rows."""
        zeros = lambda: torch.zeros(w.rows.numel(), dtype=torch.long, device=w.rows.device)  # noqa: E731
        return cls(forward=zeros(), verification=zeros(), lookahead=zeros(), refreshes=zeros())

    @property
    def nfe(self) -> torch.Tensor:
        """The forwards run ``[b]``: every part but ``refreshes`` (which counts some of ``forward``)."""
        return self.forward + self.verification + self.lookahead

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(forward=self.forward + other.forward, verification=self.verification + other.verification,
                    lookahead=self.lookahead + other.lookahead, refreshes=self.refreshes + other.refreshes)


@dataclass
class Handoff:
    """Forwards a lookahead already ran on the canvas the next step decodes (each winner's first
    rollout forward, or its a-th with ``advance``), handed from the step that ran them to the next:
    batch row -> (its canvas ``[L]``, its window's canvas columns ``[W_r]``, their logits ``[W', V]``).
    Empty where no lookahead ran; a row whose canvas or window moved since is not reused."""

    rows: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def reusable(self, w: Window) -> torch.Tensor:
        """Rows ``[b]`` of the window whose logits were computed on exactly this canvas and window."""
        hit = torch.zeros(w.rows.numel(), dtype=torch.bool, device=w.rows.device)
        if not self.rows:  # no lookahead ran last step: no host sync, no loop
            return hit
        for i, r in enumerate(w.rows.tolist()):
            got = self.rows.get(r)
            if got is not None and torch.equal(got[0], w.canvas[i]) and torch.equal(
                    got[1], w.cols[i, : int(w.length[i])]):
                hit[i] = True
        return hit

    def logits(self, w: Window, reused: torch.Tensor, fresh: Optional[torch.Tensor]) -> torch.Tensor:
        """Window logits ``[b, W, V]``: the handed-on ones where ``reused``, ``fresh`` (the forward of
        the other rows, in order; ``None`` when there are none) elsewhere."""
        first = self.rows[int(w.rows[int(reused.nonzero()[0])])][2]
        out = first.new_empty((w.rows.numel(), w.cols.shape[1], first.shape[-1]))
        if fresh is not None:
            out[(~reused).nonzero().squeeze(1)] = fresh.to(out.dtype)
        for i in reused.nonzero().squeeze(1).tolist():
            _, cols, lg = self.rows[int(w.rows[i])]
            lg = lg[: cols.numel()]
            n = min(out.shape[1], lg.shape[0])
            out[i, :n] = lg[:n]
            out[i, n:] = lg[n - 1]  # padding slots repeat the last column, as a forward would
        return out


@dataclass
class Forward:
    """The window logits ``[b, W, V]`` (the mask id suppressed), the shadow-block logits where the
    controller verifies, and the forwards this took (:class:`Cost`)."""

    logits: torch.Tensor
    shadow: Optional[torch.Tensor]
    cost: Cost


@dataclass
class Refined:
    """Tokens and commits ``[b, W]`` after the lookahead, the rollout steps it committed on top
    (``Lookahead.advance``: 0 or a long ``[b]``), the forwards it ran (``cost.lookahead``) and the
    :class:`Handoff` of those that serve the next step."""

    tokens: torch.Tensor
    commit: torch.Tensor
    cost: Cost
    adopted: Any = 0
    handoff: Handoff = field(default_factory=Handoff)


@dataclass
class StepOutcome:
    """What the step wrote: the final commit mask ``[b, W]`` and its (row, slot) indices; the re-masked
    (row, canvas column) indices, ``None`` when the decision named no re-mask."""

    commit: torch.Tensor
    commit_rows: torch.Tensor
    commit_slots: torch.Tensor
    remasked: Optional[tuple[torch.Tensor, torch.Tensor]] = None


def _masked_in(masked: torch.Tensor, rel: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Masked positions per row ``[B]`` in the generation span ``[lo, hi)``."""
    return (masked & (rel >= lo[:, None]) & (rel < hi[:, None])).sum(1)


def open_blocks(c: Counters, which: torch.Tensor, gen_length: int) -> None:
    """Open the next block after the last active one in rows ``which`` ``[B]`` (in place): it begins
    at ``active_end`` and is ``next_len`` long (clamped to the generation)."""
    new_end = (c.active_end + c.next_len).clamp(max=gen_length)
    pos = torch.arange(gen_length, device=which.device)[None, :]
    span = which[:, None] & (pos >= c.active_end[:, None]) & (pos < new_end[:, None])
    c.block_of = torch.where(span, (c.last_index + 1)[:, None], c.block_of)
    c.last_start = torch.where(which, c.active_end, c.last_start)
    c.last_index = c.last_index + which.long()
    c.active_end = torch.where(which, new_end, c.active_end)


def advance_blocks(c: Counters, masked: torch.Tensor, rel: torch.Tensor, unfinished: torch.Tensor,
                   gen_length: int, block_add: Optional[float] = None) -> None:
    """Open and leave blocks (in place), for every unfinished row.

    Multi-block decoding (``block_add`` = d3LLM's ``block_add_threshold``): the next block opens when
    the last active one is at least that fraction decided, ``1 − masked/length ≥ block_add`` (one
    such opening a step, as d3LLM adds one block an iteration). Then, as one block at a time does:
    a decided last block opens the next, and a decided current block gives way to the next active
    one (its step counters restart), until the current block has a masked position.
    """
    if block_add is not None:
        left = _masked_in(masked, rel, c.last_start, c.active_end)
        size = (c.active_end - c.last_start).clamp(min=1)
        far = 1.0 - left.double() / size.double() >= block_add
        open_blocks(c, unfinished & (left > 0) & far & (c.active_end < gen_length), gen_length)
    for _ in range(2 * gen_length + 1):
        last_done = _masked_in(masked, rel, c.last_start, c.active_end) == 0
        opening = unfinished & last_done & (c.active_end < gen_length)
        open_blocks(c, opening, gen_length)
        need = unfinished & (_masked_in(masked, rel, c.block_start, c.block_end) == 0) & (c.block_end < c.active_end)
        if not (need.any() or opening.any()):
            return
        nxt = ((c.block_of >= 0) & (c.block_of <= (c.block_index + 1)[:, None])).sum(1)
        c.block_start = torch.where(need, c.block_end, c.block_start)
        c.block_end = torch.where(need, nxt, c.block_end)
        c.block_index = c.block_index + need.long()
        c.block_step = torch.where(need, torch.zeros_like(c.block_step), c.block_step)
        c.stay_steps = torch.where(need, torch.zeros_like(c.stay_steps), c.stay_steps)
        c.block_masked_at_start = torch.where(need, _masked_in(masked, rel, c.block_start, c.block_end),
                                              c.block_masked_at_start)


def stop_after_eos_blocks(run: Run, masked: torch.Tensor) -> torch.Tensor:
    """``eos_stop``: rows whose current block is decided and contains end-of-text up to its end end
    there: their masked positions become end-of-text (no forward). Returns the updated ``masked``."""
    cv, c, ends = run.canvas, run.counters, run.state.context.eos_token_ids
    if not run.config.stops_at_eos_block or not ends:
        return masked
    upto = cv.in_gen & (cv.rel < c.block_end[:, None])
    block_done = ~(masked & upto & (cv.rel >= c.block_start[:, None])).any(1)
    has_end = (torch.isin(cv.x, torch.as_tensor(ends, device=cv.x.device)) & upto).any(1)
    stop = block_done & has_end & masked.any(1)
    if not stop.any():
        return masked
    cv.x = torch.where(stop[:, None] & masked, torch.full_like(cv.x, int(ends[0])), cv.x)
    return masked & ~stop[:, None]


def gather_window(run: Run) -> Optional[Window]:
    """The unfinished rows' current blocks as ``[b, W]`` slots; ``None`` when every row is finished."""
    cv, c = run.canvas, run.counters
    masked = stop_after_eos_blocks(run, (cv.x == run.mask_id) & cv.in_gen)
    n_masked = masked.sum(1)
    unfinished = (n_masked > 0) | c.stay  # a row the controller keeps in its block for editing too
    if not unfinished.any():
        return None
    advance_blocks(c, masked, cv.rel, unfinished & ~c.stay, run.config.gen_length, run.block_add)
    rows = unfinished.nonzero().squeeze(1)
    full = rows.numel() == cv.x.shape[0]
    sub = (lambda t: t) if full else (lambda t: t[rows])  # noqa: E731
    start, length = sub(c.block_start), sub(c.active_end - c.block_start)
    slot = torch.arange(int(length.max()), device=cv.x.device)[None, :]
    valid = slot < length[:, None]
    rel = start[:, None] + torch.minimum(slot, (length - 1)[:, None])  # pad slots repeat the last column
    cols = sub(cv.gen_start)[:, None] + rel
    xs = sub(cv.x)
    tokens = xs.gather(1, cols)
    return Window(rows=rows, full=full, start=start, length=length, cols=cols, rel=rel, valid=valid,
                  tokens=tokens, eligible=(tokens == run.mask_id) & valid,
                  revocable=sub(cv.revocable).gather(1, cols) & valid & (tokens != run.mask_id),
                  canvas=xs, n_masked=sub(n_masked),
                  block_of=sub(c.block_of).gather(1, rel) - sub(c.block_index)[:, None])


def step(run: Run, w: Window, handoff: Handoff) -> Handoff:
    """One decoding step of the window's rows: the stages in order, then the forwards they ran
    added to the counters, once (:func:`charge`). ``handoff``: the forwards the previous step's
    lookahead ran on this canvas; returns this step's, for the next step."""
    fwd = forward(run, w, handoff)
    feats = features(run, w, fwd)
    decision, view = decide(run, w, feats)
    refined = refine(run, w, feats, decision, view)
    outcome = commit(run, w, feats, decision, refined)
    charge(run.counters, w, fwd.cost + refined.cost)
    record(run, w, decision, outcome)
    return refined.handoff


def charge(c: Counters, w: Window, cost: Cost) -> None:
    """The one place forwards are counted: the step's :class:`Cost` added to its rows' ``nfe``, and its
    parts to ``lookahead_nfe`` and ``cache_refreshes``."""
    c.nfe[w.rows] += cost.nfe
    c.lookahead_nfe[w.rows] += cost.lookahead
    c.cache_refreshes[w.rows] += cost.refreshes


def forward(run: Run, w: Window, handoff: Handoff) -> Forward:
    """One forward over the window's rows, except those whose forward the ``handoff`` already ran on
    this very canvas; the shadow block in the same forward, or the verification forwards. Counts
    nothing: what it ran is its :class:`Cost` (1 per row not reused, plus the verification's)."""
    cv = run.canvas
    t0 = synced_clock(cv.x.device)
    reused = handoff.reusable(w) & (not run.shadow_step)
    served = serve_window(run, w, handoff, reused)
    cost = Cost.zero(w)
    cost.forward, cost.refreshes = (~reused).long(), served.refreshed.long()
    shadow = served.shadow
    if run.verifies and not run.shadow_step:
        shadow, cost.verification = verification_logits(run.model, w.canvas, w.sub(cv.attn), w.cols, w.revocable,
                                                        exact=run.config.verification == "probe")
    run.forward_seconds += synced_clock(cv.x.device) - t0
    return Forward(logits=suppress_mask_logit(served.logits, run.mask_id), shadow=shadow, cost=cost)


def serve_window(run: Run, w: Window, handoff: Handoff, reused: torch.Tensor) -> Served:
    """The window logits from the cache session (with the shadow block on a shadow step), the
    ``handoff``'s where ``reused`` (those rows' ``refreshed`` is False: they ran no forward here)."""
    cv = run.canvas
    index, lengths = w.sub(run.counters.block_index), w.sub(cv.lengths)
    if run.shadow_step or not reused.any():
        return run.session.serve(cv.x, cv.attn, w.rows, w.cols, w.valid, index, lengths, shadow=run.shadow_step)
    fresh = (~reused).nonzero().squeeze(1)
    refreshed = torch.zeros_like(reused)
    ran = None
    if fresh.numel():
        got = run.session.serve(cv.x, cv.attn, w.rows[fresh], w.cols[fresh], w.valid[fresh], index[fresh],
                                lengths[fresh])
        ran, refreshed[fresh] = got.logits, got.refreshed
    return Served(logits=handoff.logits(w, reused, ran), shadow=None, refreshed=refreshed)


def features(run: Run, w: Window, fwd: Forward) -> StepFeatures:
    """The step's features on the window, with the revocable slots and, for a verifying controller,
    p(token) with the slot hidden (``verify_prob``, ``verify_top_prob``)."""
    c = run.counters
    window = StepWindow(
        eligible=w.eligible, masked=w.eligible, rel=w.rel, block_start=w.start, block_end=w.start + w.length,
        block_index=w.sub(c.block_index), block_masked_at_start=w.sub(c.block_masked_at_start), step=w.sub(c.steps),
        block_step=w.sub(c.block_step), seeds=w.sub(run.state.seeds), window_index=w.cols, n_masked=w.n_masked,
        block_of=w.block_of,
    )
    options = FeatureOptions(gen_length=run.config.gen_length, temperature=run.config.temperature)
    feats = compute_features(fwd.logits, window, options)
    feats.revocable = w.revocable
    if fwd.shadow is not None:
        feats.verify_prob, feats.verify_top_prob = verification(
            suppress_mask_logit(fwd.shadow, run.mask_id), w.tokens, w.revocable)
    return feats


def decide(run: Run, w: Window, feats: StepFeatures) -> tuple[Decision, DecodeState]:
    """``controller.decide`` on the rows' state view, whose context holds this step's ``canvas`` (the
    window tokens) and ``generation``; the view's memory is written back to the batch."""
    state = run.state
    state.context.canvas = state.context.generation = None  # per-step views, set on the rows decided
    view = state if w.full else state.rows(w.rows)
    view.context.canvas = w.tokens
    view.context.generation = w.canvas.gather(1, w.sub(run.canvas.gen_index))
    decision = run.controller.decide(feats, view)
    if not w.full:
        state.update_rows(w.rows, view)
    return decision, view


def refine(run: Run, w: Window, feats: StepFeatures, decision: Decision, view: DecodeState) -> Refined:
    """The decision's tokens and commits, replaced by the lookahead's where the decision asks for a
    rollout (``Decision.depth``); its forwards are its :class:`Cost` (``lookahead``, counted by
    :func:`step`), the winners' next forwards its :class:`Handoff`."""
    tokens = decision.tokens if decision.tokens is not None else feats.x0
    commit = decision.commit & feats.eligible
    la, c = run.lookahead, run.counters
    cost = Cost.zero(w)
    if la is None or decision.depth is None:
        return Refined(tokens=tokens, commit=commit, cost=cost)
    budget_left = la.budget_left(view, w.sub(c.lookahead_nfe))
    res = la.refine(run.model, w.canvas, w.sub(run.canvas.attn), feats, decision, commit, tokens, view,
                    budget_left, controller=run.controller)
    cost.lookahead = res.extra_nfe
    handoff = Handoff()
    if res.next_rows is not None:
        for i, r in enumerate(res.next_rows.tolist()):
            handoff.rows[int(w.rows[r])] = (res.next_canvas[i], w.cols[r, : int(w.length[r])], res.next_logits[i])
    c.fallbacks[w.rows] += res.fallback.long()
    run.forward_seconds += res.forward_seconds
    if res.escalated is not None:
        c.escalations[w.rows] += res.escalated.long()
    return Refined(tokens=res.tokens, commit=res.commit & feats.eligible, cost=cost,
                   adopted=res.advanced if res.advanced is not None else 0, handoff=handoff)


def commit(run: Run, w: Window, feats: StepFeatures, decision: Decision, refined: Refined) -> StepOutcome:
    """Write the step: at least one token per row (the most confident eligible one where none was
    committed), end-of-text fill, re-masking; then the row's step counters (not its forwards:
    :func:`charge`)."""
    cfg, cv, c = run.config, run.canvas, run.counters
    had_commit = refined.commit.any(1)
    mask = ensure_progress(refined.commit, feats.eligible, feats.confidence)
    c.forced[w.rows] += (~had_commit & feats.eligible.any(1)).long()  # a step kept for editing has none to force
    r_idx, c_idx = mask.nonzero(as_tuple=True)
    xs = w.canvas
    xs[r_idx, w.cols[r_idx, c_idx]] = refined.tokens[r_idx, c_idx]
    eos_id = run.state.eos_token_id
    if cfg.eos_fill and eos_id is not None:
        own = torch.where(refined.tokens == feats.x0, feats.confidence, torch.zeros_like(feats.confidence))
        trigger = (mask & (refined.tokens == int(eos_id)) & (own >= cfg.eos_fill_threshold)).any(1)
        xs = eos_fill(xs, trigger, w.sub(cv.rel), w.sub(cv.in_gen), run.mask_id, int(eos_id))
    rev = w.sub(cv.revocable)
    rev[r_idx, w.cols[r_idx, c_idx]] = True
    if decision.edit is not None:
        edit(run, w, decision.edit & ~mask, refined.tokens, xs)
    remasked = None
    if decision.remask is not None:
        remasked = remask(run, w, decision.remask, mask, xs, rev)
    keep_in_block(run, w, decision, feats)
    if w.full:
        cv.x, cv.revocable = xs, rev
    else:
        cv.x[w.rows] = xs
        cv.revocable[w.rows] = rev
    c.steps[w.rows] += 1 + refined.adopted
    c.block_step[w.rows] += 1 + refined.adopted
    if decision.next_block_length is not None:
        c.next_len[w.rows] = decision.next_block_length.to(c.next_len).clamp(min=1)
    return StepOutcome(commit=mask, commit_rows=r_idx, commit_slots=c_idx, remasked=remasked)


def edit(run: Run, w: Window, wanted: torch.Tensor, tokens: torch.Tensor, xs: torch.Tensor) -> None:
    """Token-to-token editing: rewrite the decided slots ``wanted`` ``[b, W]`` of the window with
    ``tokens`` (in ``xs`` in place; never a masked slot, a pad slot or the mask id); count, per row,
    the slots whose token changed."""
    ed = wanted.bool() & w.valid & (w.tokens != run.mask_id) & (tokens != run.mask_id) & (tokens != w.tokens)
    r_idx, s_idx = ed.nonzero(as_tuple=True)
    xs[r_idx, w.cols[r_idx, s_idx]] = tokens[r_idx, s_idx]
    run.counters.edits[w.rows] += ed.sum(1)


def keep_in_block(run: Run, w: Window, decision: Decision, feats: StepFeatures) -> None:
    """``Decision.stay``: keep a row in its block for another step, at most the controller's
    :meth:`~adaptive_decoding.framework.engine.controller.Controller.stay_limit` steps with no masked position a block."""
    c = run.counters
    c.stay_steps[w.rows] += (~feats.eligible.any(1)).long()
    if decision.stay is None:
        c.stay[w.rows] = False
        return
    c.stay[w.rows] = decision.stay.bool() & (c.stay_steps[w.rows] < stay_limit_of(run.controller))


def remask(run: Run, w: Window, wanted: torch.Tensor, committed: torch.Tensor, xs: torch.Tensor,
           rev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return decided slots to the mask (in ``xs``/``rev`` in place): only revocable ones not committed
    this step, each position at most ``remask_per_position`` times, the first ones in window order up
    to the sample's remaining ``remask_budget``. Returns the (row, canvas column) indices."""
    cfg, cv, c = run.config, run.canvas, run.counters
    budget = cfg.effective_remask_budget - w.sub(c.remasks)
    rm = wanted.bool() & w.revocable & ~committed
    rm &= w.sub(cv.remask_count).gather(1, w.cols) < cfg.remask_per_position
    rm &= rm.long().cumsum(1) <= budget[:, None]
    q_idx, s_idx = rm.nonzero(as_tuple=True)
    cols = w.cols[q_idx, s_idx]
    xs[q_idx, cols] = run.mask_id
    rev[q_idx, cols] = False
    cv.remask_count[w.rows[q_idx], cols] += 1
    c.remasks[w.rows] += rm.sum(1)
    return q_idx, cols


def record(run: Run, w: Window, decision: Decision, out: StepOutcome) -> None:
    """With ``trace``: the step's rows, commit counts, commit (and re-mask) masks in canvas columns,
    block bounds and the decision's ``info`` tensors, on the CPU."""
    if not run.trace:
        return
    n, L = w.rows.numel(), run.canvas.x.shape[1]
    canvas_commit = torch.zeros(n, L, dtype=torch.bool, device=w.rows.device)
    canvas_commit[out.commit_rows, w.cols[out.commit_rows, out.commit_slots]] = True
    rec = {"rows": w.rows.cpu(), "commits": out.commit.sum(1).cpu(), "commit": canvas_commit.cpu(),
           "block_start": w.start.cpu(), "block_end": w.sub(run.counters.block_end).cpu(),
           "active_end": (w.start + w.length).cpu()}
    if out.remasked is not None:
        canvas_rm = torch.zeros(n, L, dtype=torch.bool, device=w.rows.device)
        canvas_rm[out.remasked] = True
        rec["remask"] = canvas_rm.cpu()
    rec.update({k: v.detach().cpu() for k, v in decision.info.items()})
    run.records.append(rec)


def verification(logits: torch.Tensor, tokens: torch.Tensor, where: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p(tokens) and the largest probability under ``logits`` ``[b, W, V]`` at ``where`` ``[b, W]``, NaN elsewhere."""
    p = token_logprob(logits, tokens).exp()
    z = logits.float()
    top = (z.amax(-1) - torch.logsumexp(z, -1)).exp()
    nan = torch.full_like(p, float("nan"))
    return torch.where(where, p, nan), torch.where(where, top, nan)


def eos_fill(
    x: torch.Tensor, trigger: torch.Tensor, rel: torch.Tensor, in_gen: torch.Tensor, mask_id: int, eos_id: int,
) -> torch.Tensor:
    """In rows where a confident EOS was committed (``trigger`` ``[B]``), fill the masked positions
    after the row's first EOS with EOS."""
    if not trigger.any():
        return x
    big = torch.iinfo(torch.long).max
    eos_rel = torch.where((x == eos_id) & in_gen, rel, torch.full_like(rel, big)).min(1).values
    fill = trigger[:, None] & in_gen & (x == mask_id) & (rel > eos_rel[:, None])
    return torch.where(fill, torch.full_like(x, eos_id), x)
