"""The stages of one decoding step, each a small function with a typed input and output.

:func:`framework.engine.loop.decode` runs, every step, on a :class:`Run` (what the call holds):

1. :func:`gather_window` -> :class:`Window`: the unfinished rows and each one's current block
   (advancing finished blocks), as ``[b, W]`` canvas columns;
2. :func:`forward` -> :class:`Forward`: the window logits, through the KV cache session; with a
   verifying controller also the shadow block (WINO) or exact probes; rows whose forward a lookahead
   already ran on this very canvas reuse it (``Lookahead`` ``next_*`` fields);
3. :func:`features` -> :class:`~framework.engine.features.StepFeatures` on the window;
4. :func:`decide` -> ``controller.decide`` on the rows' :class:`DecodeState` view (its typed
   ``context`` carries the step's ``canvas`` and ``generation``);
5. :func:`refine` -> :class:`Refined`: the lookahead's tokens and commits where the decision asks for one;
6. :func:`commit` -> :class:`StepOutcome`: the progress guarantee (≥ 1 token per unfinished row),
   end-of-text fill, re-masking within its bounds, and the counters;
7. :func:`record` appends the step's trace record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from framework.core.measure import synced_clock
from framework.engine.config import DecodeConfig
from framework.engine.controller import Controller, Decision, DecodeState
from framework.engine.denoise import CacheSession, suppress_mask_logit, token_logprob, verification_logits
from framework.engine.features import StepFeatures, compute_features
from framework.engine.selection import ensure_progress


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
    """Per-sample progress ``[B]``: the figures of :class:`~framework.engine.loop.DecodeResult` and the
    semi-autoregressive block each row is in (``block_start``/``block_end`` relative to the generation,
    ``next_len`` the next block's length, ``block_masked_at_start`` its masked positions when it began)."""

    nfe: torch.Tensor
    steps: torch.Tensor
    block_step: torch.Tensor
    block_index: torch.Tensor
    forced: torch.Tensor
    lookahead_nfe: torch.Tensor
    remasks: torch.Tensor
    escalations: torch.Tensor
    fallbacks: torch.Tensor
    block_start: torch.Tensor
    block_end: torch.Tensor
    next_len: torch.Tensor
    block_masked_at_start: torch.Tensor

    @classmethod
    def start(cls, batch: int, block_length: int, gen_length: int, device: torch.device,
              first_end: Optional[torch.Tensor] = None) -> "Counters":
        """Zero counts; every row in its first block ``[0, first_end)`` (default ``min(block_length, G)``;
        a block-causal canvas's first block is the rest of the prompt's last block)."""
        zeros = lambda: torch.zeros(batch, dtype=torch.long, device=device)  # noqa: E731
        next_len = torch.full((batch,), block_length, dtype=torch.long, device=device)
        end = next_len.clone().clamp(max=gen_length) if first_end is None else first_end.to(device).long()
        return cls(nfe=zeros(), steps=zeros(), block_step=zeros(), block_index=zeros(), forced=zeros(),
                   lookahead_nfe=zeros(), remasks=zeros(), escalations=zeros(), fallbacks=zeros(),
                   block_start=zeros(), block_end=end, next_len=next_len, block_masked_at_start=zeros())


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
    t_start: float
    #: row -> (canvas, window columns, window logits) of a forward the lookahead already ran
    pending: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)
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
    ``revocable`` (decided by this decode). ``canvas`` is the rows' ``[b, L]`` tokens (the batch's own
    tensor when ``full``), ``n_masked`` their masked generation positions."""

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

    def sub(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` ``[B, …]`` at the window's rows (``t`` itself when every row is decided)."""
        return t if self.full else t[self.rows]


@dataclass
class Forward:
    """The window logits ``[b, W, V]`` (the mask id suppressed), the shadow-block logits where the
    controller verifies, and ``reused`` ``[b]``: rows whose forward the lookahead had already run."""

    logits: torch.Tensor
    shadow: Optional[torch.Tensor]
    reused: torch.Tensor


@dataclass
class Refined:
    """Tokens and commits ``[b, W]`` after the lookahead, and the rollout steps it committed on top
    (``Lookahead.advance``: 0 or a long ``[b]``)."""

    tokens: torch.Tensor
    commit: torch.Tensor
    adopted: Any = 0


@dataclass
class StepOutcome:
    """What the step wrote: the final commit mask ``[b, W]`` and its (row, slot) indices; the re-masked
    (row, canvas column) indices, ``None`` when the decision named no re-mask."""

    commit: torch.Tensor
    commit_rows: torch.Tensor
    commit_slots: torch.Tensor
    remasked: Optional[tuple[torch.Tensor, torch.Tensor]] = None


def advance_blocks(c: Counters, masked: torch.Tensor, rel: torch.Tensor, unfinished: torch.Tensor,
                   gen_length: int) -> None:
    """Move every unfinished row whose block has no masked position to its next block (in place)."""
    in_block = masked & (rel >= c.block_start[:, None]) & (rel < c.block_end[:, None])
    for _ in range(gen_length):
        need = unfinished & ~in_block.any(1)
        if not need.any():
            return
        c.block_start = torch.where(need, c.block_end, c.block_start)
        c.block_end = torch.where(need, (c.block_end + c.next_len).clamp(max=gen_length), c.block_end)
        c.block_index = c.block_index + need.long()
        c.block_step = torch.where(need, torch.zeros_like(c.block_step), c.block_step)
        in_block = masked & (rel >= c.block_start[:, None]) & (rel < c.block_end[:, None])
        c.block_masked_at_start = torch.where(need, in_block.sum(1), c.block_masked_at_start)


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
    unfinished = n_masked > 0
    if not unfinished.any():
        return None
    advance_blocks(c, masked, cv.rel, unfinished, run.config.gen_length)
    rows = unfinished.nonzero().squeeze(1)
    full = rows.numel() == cv.x.shape[0]
    sub = (lambda t: t) if full else (lambda t: t[rows])  # noqa: E731
    start, length = sub(c.block_start), sub(c.block_end - c.block_start)
    slot = torch.arange(int(length.max()), device=cv.x.device)[None, :]
    valid = slot < length[:, None]
    rel = start[:, None] + torch.minimum(slot, (length - 1)[:, None])  # pad slots repeat the last column
    cols = sub(cv.gen_start)[:, None] + rel
    xs = sub(cv.x)
    tokens = xs.gather(1, cols)
    return Window(rows=rows, full=full, start=start, length=length, cols=cols, rel=rel, valid=valid,
                  tokens=tokens, eligible=(tokens == run.mask_id) & valid,
                  revocable=sub(cv.revocable).gather(1, cols) & valid & (tokens != run.mask_id),
                  canvas=xs, n_masked=sub(n_masked))


def forward(run: Run, w: Window) -> Forward:
    """One forward over the window's rows (1 NFE each, counted at :func:`commit` unless reused); the
    shadow block in the same forward, or the verification probes (counted here)."""
    cv, c = run.canvas, run.counters
    t0 = synced_clock(cv.x.device)
    shadow = None
    reused = reusable(run.pending, w.rows, w.canvas, w.cols, w.length) & (not run.shadow_step)
    window_args = (w.sub(c.block_index), w.sub(cv.lengths))
    if run.shadow_step:  # one forward (cached or not) gives the window and the shadow block
        logits, shadow = run.session.logits_and_shadow(cv.x, cv.attn, w.rows, w.cols, w.valid, *window_args)
    elif reused.any():  # the lookahead already ran these rows' forward on this very canvas
        logits = with_reused(run.pending, w.rows, reused, w.cols.shape[1], lambda run_rows: run.session.logits(
            cv.x, cv.attn, w.rows[run_rows], w.cols[run_rows], w.valid[run_rows],
            window_args[0][run_rows], window_args[1][run_rows]))
    else:
        logits = run.session.logits(cv.x, cv.attn, w.rows, w.cols, w.valid, *window_args)
    run.pending = {}  # spent, or stale: every unfinished row is decoded this step
    if run.verifies and not run.shadow_step:
        shadow, cost = verification_logits(run.model, w.canvas, w.sub(cv.attn), w.cols, w.revocable,
                                           exact=run.config.verification == "probe")
        c.nfe[w.rows] += cost
    run.forward_seconds += synced_clock(cv.x.device) - t0
    return Forward(logits=suppress_mask_logit(logits, run.mask_id), shadow=shadow, reused=reused)


def features(run: Run, w: Window, fwd: Forward) -> StepFeatures:
    """The step's features on the window, with the revocable slots and, for a verifying controller,
    p(token) with the slot hidden (``verify_prob``, ``verify_top_prob``)."""
    c = run.counters
    feats = compute_features(
        fwd.logits, eligible=w.eligible, masked=w.eligible, rel=w.rel, gen_length=run.config.gen_length,
        block_start=w.start, block_end=w.sub(c.block_end), block_index=w.sub(c.block_index),
        block_masked_at_start=w.sub(c.block_masked_at_start), step=w.sub(c.steps),
        block_step=w.sub(c.block_step), temperature=run.config.temperature, seeds=w.sub(run.state.seeds),
        window_index=w.cols, n_masked=w.n_masked,
    )
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
    rollout (``Decision.depth``); its forwards are counted and a winner's next forward kept for reuse."""
    tokens = decision.tokens if decision.tokens is not None else feats.x0
    commit = decision.commit & feats.eligible
    la, c = run.lookahead, run.counters
    if la is None or decision.depth is None:
        return Refined(tokens=tokens, commit=commit)
    budget_left = la.budget_left(view, w.sub(c.lookahead_nfe))
    res = la.refine(run.model, w.canvas, w.sub(run.canvas.attn), feats, decision, commit, tokens, view,
                    budget_left, controller=run.controller)
    c.lookahead_nfe[w.rows] += res.extra_nfe
    c.nfe[w.rows] += res.extra_nfe
    if res.next_rows is not None:
        for i, r in enumerate(res.next_rows.tolist()):
            run.pending[int(w.rows[r])] = (res.next_canvas[i], w.cols[r, : int(w.length[r])], res.next_logits[i])
    c.fallbacks[w.rows] += res.fallback.long()
    run.forward_seconds += res.forward_seconds
    if res.escalated is not None:
        c.escalations[w.rows] += res.escalated.long()
    return Refined(tokens=res.tokens, commit=res.commit & feats.eligible,
                   adopted=res.advanced if res.advanced is not None else 0)


def commit(run: Run, w: Window, feats: StepFeatures, decision: Decision, refined: Refined,
           fwd: Forward) -> StepOutcome:
    """Write the step: at least one token per row (the most confident eligible one where none was
    committed), end-of-text fill, re-masking; then the row's counters."""
    cfg, cv, c = run.config, run.canvas, run.counters
    had_commit = refined.commit.any(1)
    mask = ensure_progress(refined.commit, feats.eligible, feats.confidence)
    c.forced[w.rows] += (~had_commit).long()
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
    remasked = None
    if decision.remask is not None:
        remasked = remask(run, w, decision.remask, mask, xs, rev)
    if w.full:
        cv.x, cv.revocable = xs, rev
    else:
        cv.x[w.rows] = xs
        cv.revocable[w.rows] = rev
    c.nfe[w.rows] += (~fwd.reused).long()
    c.steps[w.rows] += 1 + refined.adopted
    c.block_step[w.rows] += 1 + refined.adopted
    if decision.next_block_length is not None:
        c.next_len[w.rows] = decision.next_block_length.to(c.next_len).clamp(min=1)
    return StepOutcome(commit=mask, commit_rows=r_idx, commit_slots=c_idx, remasked=remasked)


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
           "block_start": w.start.cpu(), "block_end": w.sub(run.counters.block_end).cpu()}
    if out.remasked is not None:
        canvas_rm = torch.zeros(n, L, dtype=torch.bool, device=w.rows.device)
        canvas_rm[out.remasked] = True
        rec["remask"] = canvas_rm.cpu()
    rec.update({k: v.detach().cpu() for k, v in decision.info.items()})
    run.records.append(rec)


def reusable(pending: dict, rows: torch.Tensor, xs: torch.Tensor, cols: torch.Tensor,
             blen: torch.Tensor) -> torch.Tensor:
    """Rows ``[b]`` whose window logits a lookahead already computed on exactly this canvas."""
    hit = torch.zeros(rows.numel(), dtype=torch.bool, device=rows.device)
    if not pending:  # no lookahead ran last step: no host sync, no loop
        return hit
    for i, r in enumerate(rows.tolist()):
        got = pending.get(r)
        if got is not None and torch.equal(got[0], xs[i]) and torch.equal(got[1], cols[i, : int(blen[i])]):
            hit[i] = True
    return hit


def with_reused(pending: dict, rows: torch.Tensor, reused: torch.Tensor, width: int, run_forward: Any) -> torch.Tensor:
    """Window logits ``[b, W, V]``: the pending ones where ``reused``, a forward for the other rows."""
    run = (~reused).nonzero().squeeze(1)
    ran = run_forward(run) if run.numel() else None
    first = pending[int(rows[int(reused.nonzero()[0])])][2]
    out = first.new_empty((rows.numel(), width, first.shape[-1]))
    if ran is not None:
        out[run] = ran.to(out.dtype)
    for i in reused.nonzero().squeeze(1).tolist():
        lg = pending[int(rows[i])][2][: pending[int(rows[i])][1].numel()]
        n = min(width, lg.shape[0])
        out[i, :n] = lg[:n]
        out[i, n:] = lg[n - 1]  # padding slots repeat the last column, as a forward would
    return out


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
