"""Row-level helpers of the lookahead (:mod:`framework.engine.lookahead`): branch positions, their
alternatives, window/canvas bookkeeping and the rollouts as scorer :class:`Candidates`."""

from __future__ import annotations

import torch

from framework.engine.controller import DecodeState
from framework.engine.denoise import token_logprob
from framework.engine.features import StepFeatures
from framework.engine.scorer import Candidates


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
    sample = state.extras.get("sample_index")
    source = sample[src] if isinstance(sample, torch.Tensor) else src
    return Candidates(tokens=gen, source=source.long(), prompt_ids=prompt, prompt_mask=pmask,
                      decided=gen != mask_id, logprobs=lp_rec.gather(1, gidx), logprob_mask=lp_mask.gather(1, gidx))
