"""Adaptive multi-step lookahead: branch at uncertain positions, roll out, score, commit.

At a step where the controller asks for depth ``d_b > 0`` (``Decision.depth``) and keeps
``k > 1`` candidates at uncertain positions (eligible, not committed), the loop calls
:meth:`Lookahead.refine`. For every such row b:

1. **Branch positions**: the ``positions`` most uncertain positions U_b (lowest margin
   top1 − top2 among the uncertain ones).
2. **Candidate set**: joint assignments of U_b, each position i ∈ U_b taking one of its top-k_i
   tokens under the denoiser (k_i = ``Decision.k``, capped by ``width``), ranked by their summed
   log-probability Σ_{i∈U} log p_θ(v_i | x_t); the ``width`` best are kept. Candidate 0 is the
   all-top-1 (greedy) assignment, so ties keep the greedy choice. With ``positions=1`` (the
   default) the candidates are simply the j-th best tokens at the most uncertain position. With
   two or more, ``verify`` re-scores each branch token given the others (pseudo-likelihood, one
   forward per branch position), since a product of marginals cannot see their coupling.
3. **Rollouts as extra batch rows**: candidate c starts from x_t with the controller's commits and
   its own branch tokens written, then runs up to d steps of a fill policy (greedy tokens; a
   rollout whose block is already full stops early and costs nothing more):
   ``threshold`` commits the positions with confidence > ``rollout_threshold`` (at least one),
   ``sequential`` the single most confident one, ``controller`` whatever the step's controller
   decides on the rollout's features (on a copy of its memory). With ``complete`` the last
   rollout step also fills every position still masked in the block with its greedy token (no
   extra forward), so the scorer sees a whole block. Rollouts stay inside the current block.
   All candidates of all rows roll out together; row r's candidates each cost one NFE per step,
   counted for r (``extra_nfe``).
4. **Scoring**: the scorer ranks the rollouts (:class:`framework.engine.scorer.Candidates` with the
   log-probabilities recorded when each token was chosen); the row commits the **first step of
   the best rollout**: the controller's commits plus the best candidate's branch tokens.

Budget: a row with ``budget_left`` extra NFE runs its C candidates for
``d = min(d_b, budget_left // C)`` steps; if that is 0 but ``budget_left ≥ 2``, the C is cut to
``budget_left`` candidates of depth 1; otherwise the row commits directly. Memory: only canvases
``[N, L]`` (long) and the recorded log-probabilities ``[N, L]`` are kept across rollout steps;
each step's logits ``[n, L, V]`` are reduced to the greedy token and its log-probability at once.

Failure: if planning, a rollout, the rollout controller or the scorer raises, the rows fall back
to the controller's own decision for this step (``fallback``), the failure is logged on the
``framework.engine.lookahead`` logger, and the NFE already spent is still counted.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from framework.core.params import Configurable, Param, ParameterError
from framework.engine.controller import Decision, DecodeState
from framework.engine.denoise import window_logits
from framework.engine.features import StepFeatures, compute_features
from framework.engine.scorer import Candidates, Scorer, ScoringContext
from framework.engine.selection import ensure_progress, select_topk

logger = logging.getLogger(__name__)

ROLLOUTS = ("threshold", "sequential", "controller")


@dataclass
class LookaheadResult:
    """What :meth:`Lookahead.refine` hands back to the loop (rows of the step's sub-batch)."""

    tokens: torch.Tensor
    commit: torch.Tensor
    extra_nfe: torch.Tensor
    fallback: torch.Tensor
    forward_seconds: float = 0.0
    info: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Plan:
    rows: torch.Tensor  # [R] sub-batch rows that branch
    branch_pos: torch.Tensor  # [R, m] positions
    branch_ok: torch.Tensor  # [R, m] position used
    cand_tokens: torch.Tensor  # [R, W, m] tokens per candidate
    cand_logp: torch.Tensor  # [R, W, m] their log-probabilities
    cand_ok: torch.Tensor  # [R, W] candidate exists
    depth: torch.Tensor  # [R] rollout steps


class Lookahead(Configurable):
    """Branch at the most uncertain positions, roll candidates out as extra rows, commit the best.

    Args:
        scorer: a :class:`framework.engine.scorer.Scorer` or a ``--scorer`` spec string.
        width: most candidates per row (W).
        positions: branch positions per row (m); candidates are joint assignments of them.
        rollout: fill policy of the rollouts (``threshold``, ``sequential``, ``controller``).
        rollout_threshold: confidence above which the ``threshold`` policy fills a position.
        max_depth: cap on the controller's depth d.
        complete: fill the rest of the block greedily after the last rollout forward.
        verify: with two or more branch positions, replace each branch token's first-forward
            (marginal) log-probability by log p(v_i | the other branch tokens), one forward per
            branch position and candidate (counted), so joint candidates are ranked by their
            pseudo-likelihood rather than by a product of marginals.
        context: a :class:`framework.engine.scorer.ScoringContext` (tokenizer, prompt texts, meta);
            per-call values in ``state.extras`` (``tokenizer``, ``meta``, ``prompt_text``) win.
    """

    params = {
        "width": Param(int, low=1, high=64, doc="most candidates per sample (W)", tune=(2, 8)),
        "positions": Param(int, low=1, high=4, doc="branch positions per sample (m)", tune=(1, 2)),
        "rollout": Param(str, choices=ROLLOUTS, doc="fill policy of the rollouts"),
        "rollout_threshold": Param(float, low=0.0, high=1.0, doc="confidence the threshold policy fills at"),
        "max_depth": Param(int, low=1, high=64, doc="cap on the lookahead depth d", tune=(1, 7)),
        "complete": Param(bool, doc="fill the rest of the block greedily after the last rollout step"),
        "verify": Param(bool, doc="with positions ≥ 2, re-score branch tokens by pseudo-likelihood (m NFE)"),
    }

    def __init__(
        self,
        scorer: "Scorer | str" = "logprob",
        width: int = 4,
        positions: int = 1,
        rollout: str = "threshold",
        rollout_threshold: float = 0.9,
        max_depth: int = 8,
        complete: bool = True,
        verify: bool = True,
        context: Optional[ScoringContext] = None,
    ) -> None:
        self.scorer = scorer
        self.width = width
        self.positions = positions
        self.rollout = rollout
        self.rollout_threshold = rollout_threshold
        self.max_depth = max_depth
        self.complete = complete
        self.verify = verify
        self.context = context

    def check_combination(self) -> None:
        if not isinstance(self.scorer, (Scorer, str)):
            raise ParameterError(f"Lookahead.scorer={self.scorer!r} is not allowed; allowed: a Scorer or a spec string")
        if self.rollout != "threshold" and self.rollout_threshold != 0.9:
            self.warn_no_effect("rollout_threshold", f"rollout={self.rollout!r} does not use a threshold")

    def get_scorer(self) -> Scorer:
        if isinstance(self.scorer, str):
            from framework.engine.scorer import parse_scorer_spec

            if getattr(self, "_scorer_spec", None) != self.scorer:
                self._scorer_obj, self._scorer_spec = parse_scorer_spec(self.scorer), self.scorer
            return self._scorer_obj
        return self.scorer

    # ------------------------------------------------------------------ the hook
    @torch.no_grad()
    def refine(
        self, model: Any, x: torch.Tensor, attn: torch.Tensor, feats: StepFeatures, decision: Decision,
        commit: torch.Tensor, tokens: torch.Tensor, state: DecodeState, budget_left: torch.Tensor,
        controller: Any = None,
    ) -> LookaheadResult:
        """Tokens and commits ``[B, W]`` of this step's window for the sub-batch whose canvas is ``x``
        ``[B, L]`` (see the module doc); ``feats.window_index`` maps window slots to canvas columns."""
        b = x.shape[0]
        spent = torch.zeros(b, dtype=torch.long, device=x.device)
        fallback = torch.zeros(b, dtype=torch.bool, device=x.device)
        out = LookaheadResult(tokens=tokens, commit=commit, extra_nfe=spent, fallback=fallback)
        wanted = (decision.depth.to(x.device) > 0) if decision.depth is not None else fallback
        try:
            self.validate()
            plan = self.plan(feats, decision, commit, budget_left)
            if plan is None:
                return out
            best, secs = self._rollout_and_rank(model, x, attn, feats, commit, tokens, state, plan, spent,
                                                controller)
        except Exception as exc:  # noqa: BLE001 - any plug-in failure falls back, logged
            rows = wanted.nonzero().squeeze(1).tolist()
            logger.warning("lookahead failed (%s: %s); rows %s fall back to plain decoding this step",
                           type(exc).__name__, exc, rows)
            logger.debug("lookahead failure", exc_info=True)
            out.fallback = wanted.clone()
            return out
        r = plan.rows
        chosen = plan.cand_tokens[torch.arange(r.numel(), device=x.device), best]  # [R, m]
        new_tokens = tokens.clone()
        new_commit = commit.clone()
        sub_tok = new_tokens[r]
        sub_com = new_commit[r]
        sub_tok.scatter_(1, plan.branch_pos, torch.where(plan.branch_ok, chosen, sub_tok.gather(1, plan.branch_pos)))
        sub_com.scatter_(1, plan.branch_pos, sub_com.gather(1, plan.branch_pos) | plan.branch_ok)
        new_tokens[r], new_commit[r] = sub_tok, sub_com
        best_full = torch.full((b,), -1, dtype=torch.long, device=x.device)
        best_full[r] = best
        n_cand = torch.zeros(b, dtype=torch.long, device=x.device)
        n_cand[r] = plan.cand_ok.sum(1)
        depth = torch.zeros(b, dtype=torch.long, device=x.device)
        depth[r] = plan.depth
        return LookaheadResult(tokens=new_tokens, commit=new_commit, extra_nfe=spent, fallback=fallback,
                               forward_seconds=secs,
                               info={"best": best_full, "candidates": n_cand, "depth": depth})

    # ------------------------------------------------------------------ 1-2: the candidate set
    def plan(self, f: StepFeatures, decision: Decision, commit: torch.Tensor,
             budget_left: torch.Tensor) -> Optional[_Plan]:
        """Rows that branch, their branch positions and candidates, and the depth they can afford."""
        b, l = f.x0.shape
        dev = f.x0.device
        depth = (decision.depth.to(dev).long() if decision.depth is not None
                 else torch.zeros(b, dtype=torch.long, device=dev)).clamp(0, int(self.max_depth))
        k = decision.k.to(dev).long() if decision.k is not None else torch.ones_like(f.x0)
        uncertain = f.eligible & ~commit & (k > 1)
        rows = ((depth > 0) & uncertain.any(1) & (budget_left.to(dev) >= 2)).nonzero().squeeze(1)
        if rows.numel() == 0:
            return None
        unc, kk = uncertain[rows], k[rows]
        m = min(int(self.positions), l)
        key = torch.where(unc, -f.margin[rows].float(), torch.full_like(f.margin[rows], float("-inf"), dtype=torch.float))
        pos, ok = _stable_positions(key, unc, m)  # most uncertain first, ties to the lower index
        kmax = max(1, min(int(self.width), int(kk.max())))
        alt_ids, alt_lp = _alternatives(f, rows, pos, kmax)  # [R, m, K]
        k_at = kk.gather(1, pos).clamp(max=kmax)  # [R, m]
        k_at = torch.where(ok, k_at, torch.ones_like(k_at))
        combos = torch.tensor(list(itertools.product(range(kmax), repeat=m)), dtype=torch.long, device=dev)  # [C, m]
        c = combos.shape[0]
        idx = combos.t().unsqueeze(0).expand(rows.numel(), m, c)  # [R, m, C]
        lp = alt_lp.gather(2, idx)  # [R, m, C]
        lp = torch.where(ok[:, :, None], lp, torch.zeros_like(lp)).sum(1)  # [R, C]
        valid = (combos.t().unsqueeze(0) < k_at[:, :, None]).all(1)  # [R, C]
        w = min(int(self.width), c)
        ranked = torch.where(valid, lp, torch.full_like(lp, float("-inf")))
        order = torch.argsort(ranked, dim=1, descending=True, stable=True)[:, :w]  # combo 0 (all top-1) first
        cand_ok = valid.gather(1, order)
        cand_idx = combos[order]  # [R, W, m]
        cand_tokens = alt_ids.unsqueeze(1).expand(-1, w, -1, -1).gather(3, cand_idx.unsqueeze(-1)).squeeze(-1)
        cand_logp = alt_lp.unsqueeze(1).expand(-1, w, -1, -1).gather(3, cand_idx.unsqueeze(-1)).squeeze(-1)
        # budget: C candidates × (d steps + v verification forwards) ≤ budget_left
        n = cand_ok.sum(1)
        bl = budget_left.to(dev)[rows].long()
        m_ok = ok.sum(1)
        v = torch.where((m_ok >= 2) & bool(self.verify), m_ok, torch.zeros_like(m_ok))
        d = torch.minimum(depth[rows], bl // n.clamp(min=1) - v)
        cut = (d < 1) & (bl >= 2 * (1 + v))
        n = torch.where(cut, torch.minimum(n, bl // (1 + v)), n)
        d = torch.where(cut, torch.ones_like(d), d)
        cand_ok = cand_ok & (torch.arange(w, device=dev)[None, :] < n[:, None])
        keep = (d >= 1) & (cand_ok.sum(1) >= 2)
        if not keep.any():
            return None
        return _Plan(rows=rows[keep], branch_pos=pos[keep], branch_ok=ok[keep], cand_tokens=cand_tokens[keep],
                     cand_logp=cand_logp[keep], cand_ok=cand_ok[keep], depth=d[keep])

    # ------------------------------------------------------------------ 3-4: rollouts and ranking
    def _rollout_and_rank(
        self, model: Any, x: torch.Tensor, attn: torch.Tensor, f: StepFeatures, commit: torch.Tensor,
        tokens: torch.Tensor, state: DecodeState, plan: _Plan, spent: torch.Tensor, controller: Any,
    ) -> tuple[torch.Tensor, float]:
        dev = x.device
        mask_id = int(state.mask_token_id)
        r_cnt, w = plan.cand_ok.shape
        flat = plan.cand_ok.reshape(-1).nonzero().squeeze(1)  # candidate rows, no Python loop over them
        src_plan = flat // w  # index into plan rows
        src = plan.rows[src_plan]  # index into the step's sub-batch
        cand_j = flat % w
        cols = _window_index(f)[src]  # [N, W] the window's canvas columns, per candidate
        real = _window_valid(f)[src]
        # starting window: controller commits + this candidate's branch tokens (all in window slots)
        base_lp = _token_logprob(f, tokens)  # [B, W] log p of the step's tokens at the first forward
        win = torch.where(commit, tokens, x.gather(1, _window_index(f)))[src]
        lp_rec = torch.where(commit, base_lp, torch.zeros_like(base_lp))[src]
        lp_mask = commit[src].clone()
        bpos, bok = plan.branch_pos[src_plan], plan.branch_ok[src_plan]
        btok = plan.cand_tokens[src_plan, cand_j]
        blp = plan.cand_logp[src_plan, cand_j]
        win.scatter_(1, bpos, torch.where(bok, btok, win.gather(1, bpos)))
        lp_rec.scatter_(1, bpos, torch.where(bok, blp, lp_rec.gather(1, bpos)))
        lp_mask.scatter_(1, bpos, lp_mask.gather(1, bpos) | bok)
        region = f.eligible[src]
        depth = plan.depth[src_plan]
        attn_c = attn[src]
        canvas = x[src]
        secs = 0.0
        if self.verify and bpos.shape[1] >= 2:
            secs += self._verify(model, canvas, cols, real, win, attn_c, bpos, bok, btok, lp_rec, src, spent, mask_id)
        for t in range(int(depth.max())):
            open_ = ((win == mask_id) & region).any(1)
            act = ((depth > t) & open_).nonzero().squeeze(1)  # a finished rollout stops early
            if act.numel() == 0:
                break
            t0 = time.perf_counter()
            logits = window_logits(model, _write(canvas[act], cols[act], win[act], real[act]), attn_c[act], cols[act])
            secs += time.perf_counter() - t0
            spent.index_add_(0, src[act], torch.ones_like(act))
            still = (win[act] == mask_id) & region[act]
            logp = torch.log_softmax(logits.float(), dim=-1)
            best_lp, pred = logp.max(-1)
            if self.rollout == "controller" and controller is not None:
                fill = self._controller_fill(controller, logits, still, win[act], src[act], f, state, t)
            else:
                del logits
                fill = self._policy_fill(best_lp.exp(), still)
            del logp
            last = depth[act] == t + 1
            if self.complete:
                fill = fill | (still & last[:, None])
            fill = fill & still
            win[act] = torch.where(fill, pred, win[act])
            lp_rec[act] = torch.where(fill, best_lp, lp_rec[act])
            lp_mask[act] = lp_mask[act] | fill
        cands = _candidates(_write(canvas, cols, win, real), cols, real, lp_rec, lp_mask, f, src, state, mask_id, x)
        context = self._context(state, model)
        scores = self.get_scorer().score(cands, context)
        grid = torch.full((r_cnt, w), float("-inf"), device=dev)
        grid[src_plan, cand_j] = scores.to(dev).float()
        return grid.argmax(1), secs

    def _verify(self, model: Any, canvas: torch.Tensor, cols: torch.Tensor, real: torch.Tensor, win: torch.Tensor,
                attn: torch.Tensor,
                bpos: torch.Tensor, bok: torch.Tensor, btok: torch.Tensor, lp_rec: torch.Tensor, src: torch.Tensor,
                spent: torch.Tensor, mask_id: int) -> float:
        """Pseudo-likelihood of the branch tokens: log p(v_i | x with the other branch tokens), in place."""
        n, m = bpos.shape
        rows = bok.reshape(-1).nonzero().squeeze(1)  # (candidate, branch position) pairs, one forward each
        cand, j = rows // m, rows % m
        pos = bpos[cand, j]
        probe = win[cand].clone()
        probe[torch.arange(rows.numel(), device=probe.device), pos] = mask_id
        at_col = cols[cand].gather(1, pos[:, None])  # [n·m, 1] the probed canvas column
        t0 = time.perf_counter()
        at = window_logits(model, _write(canvas[cand], cols[cand], probe, real[cand]), attn[cand], at_col)[:, 0]  # [n·m, V]
        secs = time.perf_counter() - t0
        spent.index_add_(0, src[cand], torch.ones_like(cand))
        lp = torch.log_softmax(at.float(), dim=-1).gather(1, btok[cand, j].unsqueeze(1)).squeeze(1)
        lp_rec[cand, pos] = lp
        return secs

    def _policy_fill(self, conf: torch.Tensor, still: torch.Tensor) -> torch.Tensor:
        best = select_topk(conf, still, 1)
        if self.rollout == "sequential":
            return best
        return (still & (conf > self.rollout_threshold)) | best

    def _controller_fill(self, controller: Any, logits: torch.Tensor, still: torch.Tensor, win: torch.Tensor,
                         src: torch.Tensor, f: StepFeatures, state: DecodeState, t: int) -> torch.Tensor:
        g = state.config.gen_length
        feats = compute_features(
            logits, eligible=still, masked=(win == state.mask_token_id) & f.eligible[src], rel=f.position[src],
            gen_length=g, block_start=f.block_start[src], block_end=f.block_end[src],
            block_index=f.block_index[src], block_masked_at_start=f.block_masked_at_start[src],
            step=f.step[src] + t + 1, block_step=f.block_step[src] + t + 1, temperature=0.0,
            seeds=state.seeds[src], window_index=_window_index(f)[src],
        )
        sub = state.rows(src)  # a copy of the controller's memory: rollouts never leak into it
        sub.extras["canvas"] = win
        d = controller.decide(feats, sub)
        return ensure_progress(d.commit & still, still, feats.confidence)

    def _context(self, state: DecodeState, model: Any) -> ScoringContext:
        base = self.context or ScoringContext()
        ex = state.extras
        return ScoringContext(
            tokenizer=ex.get("tokenizer", base.tokenizer),
            denoiser=base.denoiser if base.denoiser is not None else model,
            prompt_text=ex.get("prompt_text", base.prompt_text),
            meta=ex.get("meta", base.meta),
            resources=base.resources,
            special_ids=base.special_ids,
        )


# ---------------------------------------------------------------------- helpers
def _stable_positions(key: torch.Tensor, ok: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The m highest ``key`` positions per row (ties: lower index), and which of them exist."""
    order = torch.argsort(key, dim=1, descending=True, stable=True)[:, :m]
    return order, ok.gather(1, order)


def _alternatives(f: StepFeatures, rows: torch.Tensor, pos: torch.Tensor, kmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``kmax`` token ids and log-probabilities ``[R, m, K]`` at the branch positions."""
    if f.logits is not None:
        lg = f.logits[rows].gather(1, pos[:, :, None].expand(-1, -1, f.logits.shape[-1]))
        logp = torch.log_softmax(lg.float(), dim=-1)
        top = logp.topk(min(kmax, logp.shape[-1]), dim=-1)
        ids, lp = top.indices, top.values
    else:  # only the top-2 statistics are known
        ids = torch.stack([f.top1_id[rows].gather(1, pos), f.top2_id[rows].gather(1, pos)], -1)
        p = torch.stack([f.top1_prob[rows].gather(1, pos), f.top2_prob[rows].gather(1, pos)], -1)
        ids, lp = ids[..., :kmax], p[..., :kmax].float().clamp(min=1e-30).log()
    if ids.shape[-1] < kmax:  # a vocabulary smaller than k: pad with impossible alternatives
        pad = kmax - ids.shape[-1]
        ids = torch.cat([ids, ids[..., :1].expand(*ids.shape[:-1], pad)], -1)
        lp = torch.cat([lp, torch.full((*lp.shape[:-1], pad), float("-inf"), device=lp.device)], -1)
    return ids, lp


def _token_logprob(f: StepFeatures, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) ``[B, L]`` under the step's distribution (from logits, else the confidence)."""
    if f.logits is not None:
        return torch.log_softmax(f.logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    own = torch.where(tokens == f.x0, f.confidence.float(), torch.full_like(f.confidence, 1e-30, dtype=torch.float))
    return own.clamp(min=1e-30).log()


def _window_index(f: StepFeatures) -> torch.Tensor:
    """The window's canvas columns ``[B, W]`` (the identity when the window is the whole canvas)."""
    if f.window_index is not None:
        return f.window_index
    return torch.arange(f.x0.shape[1], device=f.x0.device).expand_as(f.x0)


def _window_valid(f: StepFeatures) -> torch.Tensor:
    """Which window slots are real ``[B, W]`` (slots past a row's shorter block repeat a column)."""
    if f.window_index is None:
        return torch.ones_like(f.eligible)
    slot = torch.arange(f.x0.shape[1], device=f.x0.device)[None, :]
    return slot < (f.block_end - f.block_start)[:, None]


def _write(canvas: torch.Tensor, cols: torch.Tensor, win: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``canvas`` ``[N, L]`` with the window's real slots ``win`` ``[N, W]`` written at ``cols``."""
    out = canvas.clone()
    r, c = valid.nonzero(as_tuple=True)
    out[r, cols[r, c]] = win[r, c]
    return out


def _candidates(canvas: torch.Tensor, cols: torch.Tensor, real: torch.Tensor, lp_win: torch.Tensor,
                lp_mask_win: torch.Tensor,
                f: StepFeatures, src: torch.Tensor, state: DecodeState, mask_id: int, x: torch.Tensor) -> Candidates:
    """The rollouts' generation regions and prompts as :class:`Candidates` (log-probabilities are
    recorded for the window; the rest of the generation has none)."""
    g = state.config.gen_length
    start = (cols[:, 0] - f.position[src][:, 0]).clamp(min=0)  # gen_start per candidate row
    lp_rec = _write(torch.zeros(canvas.shape, dtype=lp_win.dtype, device=canvas.device), cols, lp_win, real)
    lp_mask = _write(torch.zeros(canvas.shape, dtype=torch.bool, device=canvas.device), cols, lp_mask_win, real)
    gidx = start[:, None] + torch.arange(g, device=canvas.device)[None, :]
    gidx = gidx.clamp(max=canvas.shape[1] - 1)
    gen = canvas.gather(1, gidx)
    p = int(start.max()) if start.numel() else 0
    pidx = torch.arange(p, device=canvas.device)[None, :].expand(canvas.shape[0], p)
    prompt = x[src].gather(1, pidx) if p else torch.zeros(canvas.shape[0], 0, dtype=torch.long, device=canvas.device)
    pmask = pidx < start[:, None]
    sample = state.extras.get("sample_index")
    source = sample[src] if isinstance(sample, torch.Tensor) else src
    return Candidates(tokens=gen, source=source.long(), prompt_ids=prompt, prompt_mask=pmask,
                      decided=gen != mask_id, logprobs=lp_rec.gather(1, gidx), logprob_mask=lp_mask.gather(1, gidx))


# ---------------------------------------------------------------------- the benchmark's entry point
def lookahead_sweep(
    loaded: Any, task: Any, controller: Any, config: Any, *, scorer: "Scorer | str" = "logprob",
    widths: tuple[int, ...] = (2, 4), depths: tuple[int, ...] = (1, 2, 4), n: int = 100, split: str = "test",
    batch_size: int = 50, include_baseline: bool = True, data_seed: int = 0, **lookahead_params: Any,
) -> list[dict[str, Any]]:
    """Accuracy, joint coherence, NFE and peak memory of ``controller`` as lookahead width/depth grow.

    One row per setting (``width = depth = 0``: no lookahead), each decoding the same ``n``
    examples of ``split`` with the same per-item seeds. ``depth`` caps the controller's
    ``Decision.depth`` (``max_depth``), so use a controller that asks for deep lookahead (e.g.
    ``confidence_ladder`` with ``d_max ≥ max(depths)``); ``config.lookahead_budget`` caps the extra
    NFE per sample. Decoding gets ``extras`` with the tokenizer and each example's prompt text and
    meta, so text scorers and ``compliance(numbers=meta)`` see them.

    Row keys: ``width, depth, accuracy, nfe, lookahead_nfe, tpf, fallbacks, peak_mem_mb,
    seconds`` and, for tasks with ``joint_coherence`` (pairs), ``valid_slots`` and
    ``incoherent_slots`` (fractions of the answer slots).
    """
    from framework.core.measure import PeakMemory
    from framework.engine.evaluate import item_seeds
    from framework.engine.loop import decode

    examples = task.examples(split, n, seed=data_seed)
    tok = loaded.tokenizer
    settings = [(0, 0)] if include_baseline else []
    settings += [(w, d) for w in widths for d in depths]
    rows = []
    for w, d in settings:
        la = None if w == 0 else Lookahead(scorer=scorer, width=w, max_depth=d,
                                           context=ScoringContext(tokenizer=tok), **lookahead_params)
        texts: list[str] = []
        nfe, la_nfe, fb = [], [], []
        t0 = time.perf_counter()
        with PeakMemory(getattr(loaded.denoiser, "device", "cpu")) as pm:
            for i in range(0, len(examples), batch_size):
                chunk = examples[i : i + batch_size]
                res = decode(loaded.denoiser, [tok.encode(e.prompt) for e in chunk], controller, config,
                             seeds=item_seeds([e.id for e in chunk], config.seed), lookahead=la,
                             extras={"tokenizer": tok, "prompt_text": [e.prompt for e in chunk],
                                     "meta": [dict(e.meta, task=task.name) for e in chunk]})
                texts += [tok.decode(g.tolist(), stop_at_eos=True) for g in res.generated]
                nfe.append(res.nfe)
                la_nfe.append(res.lookahead_nfe)
                fb.append(res.fallbacks)
        nfe_t = torch.cat(nfe).float()
        row: dict[str, Any] = {
            "width": w, "depth": d, "n": len(examples),
            "accuracy": sum(task.score(e, t) for e, t in zip(examples, texts)) / max(1, len(examples)),
            "nfe": float(nfe_t.mean()), "lookahead_nfe": float(torch.cat(la_nfe).float().mean()),
            "tpf": float((config.gen_length / nfe_t.clamp(min=1)).mean()),
            "fallbacks": int(torch.cat(fb).sum()), "peak_mem_mb": pm.peak_mb,
            "seconds": time.perf_counter() - t0,
        }
        if hasattr(task, "joint_coherence"):
            counts = [task.joint_coherence(e, t) for e, t in zip(examples, texts)]
            slots = max(1, sum(c["slots"] for c in counts))
            row["valid_slots"] = sum(c["valid"] for c in counts) / slots
            row["incoherent_slots"] = sum(c["incoherent"] for c in counts) / slots
        rows.append(row)
    return rows
