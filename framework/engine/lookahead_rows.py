"""Row-level helpers of the lookahead (:mod:`framework.engine.lookahead`): branch positions, their
alternatives, window/canvas bookkeeping and the rollouts as scorer :class:`Candidates`."""

from __future__ import annotations

import time
from typing import Any

import torch

from framework.engine.controller import DecodeState
from framework.engine.denoise import token_logprob, window_logits
from framework.engine.features import StepFeatures, compute_features
from framework.engine.scorer import Candidates
from framework.engine.selection import ensure_progress, select_topk


def stable_positions(key: torch.Tensor, ok: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The m highest ``key`` positions per row (ties: lower index), and which of them exist."""
    order = torch.argsort(key, dim=1, descending=True, stable=True)[:, :m]
    return order, ok.gather(1, order)


def alternatives(f: StepFeatures, rows: torch.Tensor, pos: torch.Tensor, kmax: int) -> tuple[torch.Tensor, torch.Tensor]:
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


def step_token_logprob(f: StepFeatures, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) ``[B, L]`` under the step's distribution (from logits, else the confidence)."""
    if f.logits is not None:
        return token_logprob(f.logits, tokens)
    own = torch.where(tokens == f.x0, f.confidence.float(), torch.full_like(f.confidence, 1e-30, dtype=torch.float))
    return own.clamp(min=1e-30).log()


def window_index(f: StepFeatures) -> torch.Tensor:
    """The window's canvas columns ``[B, W]`` (the identity when the window is the whole canvas)."""
    if f.window_index is not None:
        return f.window_index
    return torch.arange(f.x0.shape[1], device=f.x0.device).expand_as(f.x0)


def window_valid(f: StepFeatures) -> torch.Tensor:
    """Which window slots are real ``[B, W]`` (slots past a row's shorter block repeat a column)."""
    if f.window_index is None:
        return torch.ones_like(f.eligible)
    slot = torch.arange(f.x0.shape[1], device=f.x0.device)[None, :]
    return slot < (f.block_end - f.block_start)[:, None]


def write_window(canvas: torch.Tensor, cols: torch.Tensor, win: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``canvas`` ``[N, L]`` with the window's real slots ``win`` ``[N, W]`` written at ``cols``."""
    out = canvas.clone()
    r, c = valid.nonzero(as_tuple=True)
    out[r, cols[r, c]] = win[r, c]
    return out


def rollout_candidates(canvas: torch.Tensor, cols: torch.Tensor, real: torch.Tensor, lp_win: torch.Tensor,
                lp_mask_win: torch.Tensor,
                f: StepFeatures, src: torch.Tensor, state: DecodeState, mask_id: int, x: torch.Tensor) -> Candidates:
    """The rollouts' generation regions and prompts as :class:`Candidates` (log-probabilities are
    recorded for the window; the rest of the generation has none)."""
    g = state.config.gen_length
    start = (cols[:, 0] - f.position[src][:, 0]).clamp(min=0)  # gen_start per candidate row
    lp_rec = write_window(torch.zeros(canvas.shape, dtype=lp_win.dtype, device=canvas.device), cols, lp_win, real)
    lp_mask = write_window(torch.zeros(canvas.shape, dtype=torch.bool, device=canvas.device), cols, lp_mask_win, real)
    gidx = start[:, None] + torch.arange(g, device=canvas.device)[None, :]
    gidx = gidx.clamp(max=canvas.shape[1] - 1)
    gen = canvas.gather(1, gidx)
    p = int(start.max()) if start.numel() else 0
    pidx = torch.arange(p, device=canvas.device)[None, :].expand(canvas.shape[0], p)
    prompt = x[src].gather(1, pidx) if p else torch.zeros(canvas.shape[0], 0, dtype=torch.long, device=canvas.device)
    pmask = pidx < start[:, None]
    sample = state.context.sample_index
    source = sample[src] if isinstance(sample, torch.Tensor) else src
    return Candidates(tokens=gen, source=source.long(), prompt_ids=prompt, prompt_mask=pmask,
                      decided=gen != mask_id, logprobs=lp_rec.gather(1, gidx), logprob_mask=lp_mask.gather(1, gidx))


def verify_branch_tokens(model: Any, canvas: torch.Tensor, cols: torch.Tensor, real: torch.Tensor, win: torch.Tensor,
                         attn: torch.Tensor, bpos: torch.Tensor, bok: torch.Tensor, btok: torch.Tensor,
                         lp_rec: torch.Tensor, src: torch.Tensor, spent: torch.Tensor, mask_id: int) -> float:
    """Pseudo-likelihood of the branch tokens, log p(v_i | x with the other branch tokens), written into
    ``lp_rec`` in place, one counted forward per (candidate, branch position); the seconds spent."""
    n, m = bpos.shape
    rows = bok.reshape(-1).nonzero().squeeze(1)  # (candidate, branch position) pairs, one forward each
    cand, j = rows // m, rows % m
    pos = bpos[cand, j]
    probe = win[cand].clone()
    probe[torch.arange(rows.numel(), device=probe.device), pos] = mask_id
    at_col = cols[cand].gather(1, pos[:, None])  # [n·m, 1] the probed canvas column
    t0 = time.perf_counter()
    at = window_logits(model, write_window(canvas[cand], cols[cand], probe, real[cand]), attn[cand], at_col)[:, 0]
    secs = time.perf_counter() - t0
    spent.index_add_(0, src[cand], torch.ones_like(cand))
    lp = torch.log_softmax(at.float(), dim=-1).gather(1, btok[cand, j].unsqueeze(1)).squeeze(1)
    lp_rec[cand, pos] = lp
    return secs


def controller_fill(controller: Any, logits: torch.Tensor, still: torch.Tensor, win: torch.Tensor, src: torch.Tensor,
                    f: StepFeatures, state: DecodeState, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What the step's controller fills on a rollout's window at rollout step ``t``, on a copy of its
    memory (rollouts never leak into it), and that forward's predicted tokens (x0)."""
    feats = compute_features(
        logits, eligible=still, masked=(win == state.mask_token_id) & f.eligible[src], rel=f.position[src],
        gen_length=state.config.gen_length, block_start=f.block_start[src], block_end=f.block_end[src],
        block_index=f.block_index[src], block_masked_at_start=f.block_masked_at_start[src],
        step=f.step[src] + t + 1, block_step=f.block_step[src] + t + 1, temperature=state.config.temperature,
        seeds=state.seeds[src], window_index=window_index(f)[src],
    )
    sub = state.rows(src)
    sub.context.canvas = win
    d = controller.decide(feats, sub)
    return ensure_progress(d.commit & still, still, feats.confidence), feats.x0


def threshold_fill(conf: torch.Tensor, still: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Positions still open whose confidence is at least the row's threshold ``tau`` ``[N]``, and at
    least the most confident one: Fast-dLLM's threshold rule (``fast_dllm``), row by row."""
    return (still & (conf >= tau[:, None])) | select_topk(conf, still, 1)
