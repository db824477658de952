"""LLaDA's Monte-Carlo estimate of ``log p(target | prefix)`` for a masked diffusion LM, batched.

A masked diffusion LM has no left-to-right factorisation, so a continuation's log-likelihood is
bounded from below by the ELBO of the masked-diffusion objective (LLaDA, eq. 6 and Algorithm 3):

    log p(y | c)  >=  E_l [ (T / l) · Σ_{i masked} log p_θ(y_i | c, y with l of its T tokens masked) ]

with ``l ~ U{1..T}`` masks placed uniformly at random in the target ``y`` of ``T`` tokens (the
prefix ``c`` is never masked). Each Monte-Carlo sample is one forward pass; ``mc_num`` samples are
averaged. Like LLaDA's ``eval_llada.py`` we draw the mask counts with low variance: one
``k ~ U{1..T}``, then the ``n`` samples get ``round(k + j·T/n)`` masks, wrapped into ``1..T``
(stratified over ``1..T`` instead of ``n`` independent draws). LLaDA stratifies each forward batch
separately; here the strata span all ``mc_num`` samples of a request, so the estimate does not depend
on ``batch_size``.

Randomness per request comes from its own ``torch.Generator`` seeded with ``seed``: first ``k``
(``torch.randint``), then one ``torch.randperm(T)`` per sample, in sample order. Rows of different
requests share forward passes (right padded, padding masked out of the keys), and only the target
columns reach the LM head. As in decoding, the mask token's logit is suppressed before the softmax
(it is never a prediction).

:func:`greedy_matches` is LLaDA's ``is_check_greedy``: whether decoding the masked target one token
per step, most confident first (the ``llada`` controller with ``steps = T``), reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.denoise import suppress_mask_logit, window_logits
from adaptive_decoding.framework.engine.loop import decode, model_device


@dataclass(frozen=True)
class MCRequest:
    """One continuation to score: token ids of the prefix and of the target, and its seed."""

    prefix: Sequence[int]
    target: Sequence[int]
    seed: int = 0


def mask_counts(target_len: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` mask counts in ``1..target_len``, evenly spaced from one random start (LLaDA's low-variance
    draw)."""
    k = int(torch.randint(1, target_len + 1, (), generator=generator))
    span = torch.linspace(float(k), k + (n - 1) * (target_len / n), steps=n, dtype=torch.float64)
    return (torch.round(span).long() - 1) % target_len + 1


def draw_masks(target_len: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(masked [n, T] bool, counts [n])``: sample ``j`` masks ``counts[j]`` target positions chosen at
    random."""
    counts = mask_counts(target_len, n, generator)
    order = torch.arange(target_len)
    masked = torch.empty(n, target_len, dtype=torch.bool)
    for j in range(n):
        masked[j] = (order < counts[j])[torch.randperm(target_len, generator=generator)]
    return masked, counts


def _rows(requests: Sequence[MCRequest], mc_num: int,
          mask_id: int) -> Iterator[tuple[int, list[int], list[int], float]]:
    """Every Monte-Carlo row: ``(request index, noisy ids, masked target offsets, weight T / l)``."""
    for r, req in enumerate(requests):
        target = list(req.target)
        t = len(target)
        if t == 0:
            continue
        g = torch.Generator().manual_seed(int(req.seed))
        masked, counts = draw_masks(t, mc_num, g)
        for j in range(mc_num):
            noisy = [mask_id if m else tok for tok, m in zip(target, masked[j].tolist())]
            yield r, list(req.prefix) + noisy, masked[j].nonzero().flatten().tolist(), t / float(counts[j])


@torch.no_grad()
def mc_loglikelihoods(
    model: Any, requests: Sequence[MCRequest], *, mc_num: int = 128, batch_size: int = 32, cfg: float = 0.0,
    pad_token_id: Optional[int] = None,
) -> list[float]:
    """The Monte-Carlo estimate of ``log p(target | prefix)`` for each request (0.0 for an empty target).

    Args:
        model: a denoiser (``model(input_ids, attention_mask) -> logits``, or a windowed one).
        requests: :class:`MCRequest` items; ragged lengths are fine.
        mc_num: Monte-Carlo samples per request (one forward row each).
        batch_size: rows per forward pass (rows of different requests are batched together).
        cfg: classifier-free guidance scale as LLaDA's ``cfg``: logits ``u + (cfg + 1)(c − u)`` with
            ``u`` from the same row with its prefix masked; 0 = off (one forward per row).
        pad_token_id: padding id (default: the model's, else its mask id; padding is never attended).
    """
    if mc_num < 1 or batch_size < 1:
        raise ValueError(f"mc_num={mc_num} and batch_size={batch_size} must be >= 1")
    mask_id = int(model.mask_token_id)
    pad = pad_token_id if pad_token_id is not None else getattr(model, "pad_token_id", None)
    pad = mask_id if pad is None else int(pad)
    totals = [0.0] * len(requests)
    buffer: list[tuple[int, list[int], list[int], float]] = []
    device = model_device(model)
    for row in _rows(requests, mc_num, mask_id):
        buffer.append(row)
        if len(buffer) == batch_size:
            _add_batch_nll(model, requests, buffer, totals, pad, mask_id, cfg, device)
            buffer.clear()
    if buffer:
        _add_batch_nll(model, requests, buffer, totals, pad, mask_id, cfg, device)
    return [-total / mc_num if len(req.target) else 0.0 for total, req in zip(totals, requests)]


def _add_batch_nll(model: Any, requests: Sequence[MCRequest],
                   buffer: list[tuple[int, list[int], list[int], float]],
                   totals: list[float], pad: int, mask_id: int, cfg: float, device: Any) -> None:
    """One forward over the buffered rows: add each row's weighted NLL of its masked target tokens,
    (T / l) · Σ −log p(x_i), to its request's total."""
    x, attn, cols, gold, hit, weight, prefix_cols = _batch_tensors(requests, buffer, pad)
    x, attn, cols = x.to(device), attn.to(device), cols.to(device)
    if cfg > 0:
        uncond = torch.where(prefix_cols.to(device), torch.full_like(x, mask_id), x)
        both = window_logits(model, torch.cat([x, uncond]), torch.cat([attn, attn]), torch.cat([cols, cols]))
        cond, un = both.float().chunk(2)
        logits = un + (cfg + 1.0) * (cond - un)
    else:
        logits = window_logits(model, x, attn, cols).float()
    logp = torch.log_softmax(suppress_mask_logit(logits, mask_id), dim=-1).cpu()
    nll = -logp.gather(2, gold[:, :, None]).squeeze(2).double()
    loss = (nll * hit).sum(1) * weight
    for i, (r, _, _, _) in enumerate(buffer):
        totals[r] += float(loss[i])


def _batch_tensors(requests: Sequence[MCRequest], buffer: list[tuple[int, list[int], list[int], float]],
                   pad: int) -> tuple[torch.Tensor, ...]:
    """The buffered rows as padded tensors: ids, attention mask, the target columns to read, the gold
    target ids, the masked targets, the weights T / l, and the prefix columns (for the guidance)."""
    b = len(buffer)
    width = max(len(row) for _, row, _, _ in buffer)
    tlen = max(len(requests[r].target) for r, _, _, _ in buffer)
    x = torch.full((b, width), pad, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    cols = torch.zeros((b, tlen), dtype=torch.long)
    gold = torch.zeros((b, tlen), dtype=torch.long)
    hit = torch.zeros((b, tlen), dtype=torch.bool)
    weight = torch.zeros(b, dtype=torch.float64)
    prefix_cols = torch.zeros((b, width), dtype=torch.bool)
    for i, (r, row, where, w) in enumerate(buffer):
        p, t = len(requests[r].prefix), len(requests[r].target)
        x[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        attn[i, : len(row)] = 1
        prefix_cols[i, :p] = True
        cols[i] = torch.arange(tlen).clamp(max=t - 1) + p
        gold[i, :t] = torch.as_tensor(list(requests[r].target), dtype=torch.long)
        hit[i, where] = True
        weight[i] = w
    return x, attn, cols, gold, hit, weight, prefix_cols


def greedy_matches(model: Any, requests: Sequence[MCRequest], *, batch_size: int = 32) -> list[bool]:
    """Whether one-token-per-step, most-confident-first decoding of each masked target reproduces it
    (LLaDA's ``suffix_greedy_prediction``); requests with equal target lengths share a decode call."""
    out = [True] * len(requests)
    by_len: dict[int, list[int]] = {}
    for r, req in enumerate(requests):
        if len(req.target):
            by_len.setdefault(len(req.target), []).append(r)
    for t, idx in by_len.items():
        controller = build_controller("llada", steps=t)
        config = DecodeConfig.build(gen_length=t)
        for start in range(0, len(idx), batch_size):
            chunk = idx[start : start + batch_size]
            res = decode(model, [list(requests[r].prefix) for r in chunk], controller, config)
            for i, r in enumerate(chunk):
                out[r] = res.generated[i].tolist() == list(requests[r].target)
    return out
