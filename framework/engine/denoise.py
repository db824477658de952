"""How the loop calls a denoiser: logits of the window only, with or without a KV cache.

Two kinds of denoiser follow the protocol (:mod:`adaptive_decoding.framework.models.protocol`):

* **plain**: ``model(input_ids, attention_mask) -> logits [B, L, V]``. The loop gathers the
  window's columns from them; ``cache`` must be ``none``.
* **windowed** (``supports_kv_cache = True``), the framework's own architectures (tiny, LLaDA,
  Dream): ``model.window_logits(x, attention_mask, out_cols, cache=, query_cols=, query_valid=,
  use_cache=) -> (logits [B, W, V], cache)``. Only the query columns run through the layers,
  only the output columns through the LM head, so a step never builds ``[B, L, V]``. With a
  ``cache``, the query columns' keys and values are written into it in place and the queries
  attend over every cached column (masked by ``attention_mask``).

:class:`CacheSession` is the loop's cache policy, with Fast-dLLM's semantics: a row's first step
in a block (and every ``cache_refresh`` steps, if set) is a full forward that refreshes the cache
and serves that step; ``prefix`` then queries the block and everything after it, ``dual`` the
block only. Controllers never see any of it; every forward is one NFE for each row it serves. The
session counts nothing: each call says which rows it refreshed (:class:`Served`), and the step counts.

On a block-causal model ``cache='block'`` is the exact cache of completed blocks; ``sub_block_cache``
adds Fast-dLLM v2's approximate sub-block cache on top of it (:meth:`CacheSession._serve_sub_blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from adaptive_decoding.framework.core.params import ParameterError


def supports_cache(model: Any) -> bool:
    """Whether ``model`` implements the windowed, cached call (``window_logits``)."""
    return bool(getattr(model, "supports_kv_cache", False)) and hasattr(model, "window_logits")


def gather_columns(logits: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[B, L, V]`` at the canvas columns ``cols`` ``[B, W]``: ``[B, W, V]``."""
    return logits.gather(1, cols[:, :, None].expand(-1, -1, logits.shape[-1]))


def window_logits(model: Any, x: torch.Tensor, attn: torch.Tensor, out_cols: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, W, V]`` at canvas columns ``out_cols`` ``[B, W]`` from a full forward."""
    if supports_cache(model):
        return model.window_logits(x, attn, out_cols)[0]
    return gather_columns(model(x, attention_mask=attn), out_cols)


def check_cache_support(model: Any, mode: str) -> None:
    """Refuse a cache mode the model cannot serve, before any work (which modes have a meaning for
    the model's canvas layout is :meth:`DecodeConfig.for_layout`'s check)."""
    if mode != "none" and not supports_cache(model):
        raise ParameterError(
            f"cache={mode!r} needs a denoiser with a KV cache (the framework's own tiny, LLaDA or Dream "
            f"implementations); {type(model).__name__} has none; allowed for it: cache='none'"
        )


def suppress_mask_logit(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """The mask token is never a prediction (MDLM's zero-masking parameterisation): its logit becomes
    the dtype's lowest finite value (probability 0, and no ``0 · -inf`` in the entropy)."""
    if 0 <= mask_id < logits.shape[-1]:
        logits = logits.clone() if not logits.is_contiguous() or logits.requires_grad else logits
        logits[..., mask_id] = torch.finfo(logits.dtype).min
    return logits


@dataclass
class Served:
    """What one :meth:`CacheSession.serve` call gave for its rows ``[b]``: the window logits ``[b, W, V]``,
    the shadow logits (``None`` unless asked for) and ``refreshed`` (bool ``[b]``): the rows whose forward
    was a full one that refreshed the cache. Every row served is one forward, refreshed or not."""

    logits: torch.Tensor
    shadow: Optional[torch.Tensor]
    refreshed: torch.Tensor


class CacheSession:
    """The KV cache of one decode call and when to refresh it (per row).

    Args:
        model: a windowed denoiser (:func:`supports_cache`), or any denoiser with ``mode='none'``.
        mode: ``none``, ``prefix``, ``dual`` or (block-causal models) ``block``
            (:data:`adaptive_decoding.framework.engine.config.CACHE_MODES`).
        refresh: refresh every this many steps inside a block too (``None``: block starts only).
        batch: the decode call's batch size B (the cache holds one row per sample).
        block_size: a block-causal model's block size (``block`` mode's block alignment).
        sub_block: ``block`` mode only: Fast-dLLM v2's approximate sub-block cache with sub-blocks of
            this many positions (``DecodeConfig.sub_block_cache``); ``None`` = off.
    """

    def __init__(self, model: Any, mode: str, refresh: Optional[int], batch: int, device: torch.device,
                 block_size: Optional[int] = None, sub_block: Optional[int] = None) -> None:
        check_cache_support(model, mode)
        self.model, self.mode, self.refresh, self.block_size = model, mode, refresh, block_size
        self.cache: Any = None
        self.cached_block = torch.full((batch,), -1, dtype=torch.long, device=device)
        self.since = torch.zeros(batch, dtype=torch.long, device=device)
        self.sub_block = sub_block if mode == "block" else None
        #: per row, the block whose keys and values are frozen for its sub-blocks (-1: none yet)
        self.frozen_block = torch.full((batch,), -1, dtype=torch.long, device=device)
        #: ``[B, b, V]``: each block offset's logits from the last forward that gave them (sub-block cache)
        self.latest: Optional[torch.Tensor] = None
        #: ``block`` mode: each row's window start column at its last forward (−1 before the first)
        self.served_from = torch.full((batch,), -1, dtype=torch.long, device=device)

    def serve(
        self, x: torch.Tensor, attn: torch.Tensor, rows: torch.Tensor, out_cols: torch.Tensor,
        out_valid: torch.Tensor, block_index: torch.Tensor, lengths: torch.Tensor, shadow: bool = False,
    ) -> Served:
        """Window logits ``[b, W, V]`` for the batch rows ``rows`` (``x``, ``attn`` are the full
        batch; ``out_cols`` / ``out_valid`` (the window's canvas columns and which are real),
        ``block_index`` and ``lengths`` (real tokens per row) are per row of ``rows``); with ``shadow``
        also, from the same forward, WINO's shadow logits ``[b, W, V]`` (each window column predicted
        with that column hidden; :func:`supports_shadow` models only). Every row served here costs
        one forward (one NFE, counted by the caller); ``refreshed`` says which were refreshes."""
        none = torch.zeros(rows.numel(), dtype=torch.bool, device=rows.device)
        if self.mode == "none":
            if shadow:
                return Served(*self.model.shadow_logits(x[rows], attn[rows], out_cols), refreshed=none)
            return Served(window_logits(self.model, x[rows], attn[rows], out_cols), None, refreshed=none)
        due = self.cached_block[rows] != block_index
        if self.mode == "block":
            serve_block = self._serve_sub_blocks if self.sub_block else self._serve_block
            return serve_block(x, attn, rows, out_cols, out_valid, block_index, lengths, due)
        if self.refresh is not None:
            due |= self.since[rows] >= self.refresh
        if self.cache is None:
            due = torch.ones_like(due)
        out: list[Optional[torch.Tensor]] = [None, None]
        for flag in (True, False):
            pick = (due == flag).nonzero().squeeze(1)
            if pick.numel() == 0:
                continue
            sub_rows = rows[pick]
            if flag:
                got = self._refresh(x, attn, sub_rows, out_cols[pick], block_index[pick], shadow)
            else:
                got = self._cached(x, attn, sub_rows, out_cols[pick], out_valid[pick], lengths[pick], shadow)
            for i, lg in enumerate(got):
                if lg is None:
                    continue
                if pick.numel() == rows.numel():  # every row took this path: no copy
                    out[i] = lg
                    continue
                if out[i] is None:
                    out[i] = lg.new_empty((rows.numel(), *lg.shape[1:]))
                out[i][pick] = lg  # type: ignore[index]
        self.since[rows] += 1
        return Served(out[0], out[1], refreshed=due)  # type: ignore[arg-type]

    def _refresh(self, x, attn, rows, out_cols, block_index, shadow: bool = False):
        sh = None
        if self.cache is not None and not shadow:
            # every column is a query written in place: the same numbers as a fresh full forward, and
            # the old cache is never held beside a new one (at LLaDA-8B's size a cache is gigabytes)
            cols = torch.arange(x.shape[1], device=x.device).expand(rows.numel(), -1)
            logits, _ = self._against_cache(x, attn, rows, out_cols, cols, torch.ones_like(cols, dtype=torch.bool))
        else:
            if shadow:
                logits, sh, cache = self.model.shadow_window_logits(x[rows], attn[rows], out_cols, use_cache=True)
            else:
                logits, cache = self.model.window_logits(x[rows], attn[rows], out_cols, use_cache=True)
            if self.cache is None or rows.numel() == self.cached_block.numel():
                self.cache = cache if rows.numel() == self.cached_block.numel() else self._full(cache, rows)
            else:
                self.cache.update_rows(rows, cache)
        self.cached_block[rows] = block_index
        self.since[rows] = 0
        return logits, sh

    def _serve_block(self, x, attn, rows, out_cols, out_valid, block_index, lengths, entering):
        """The exact cache of completed blocks (``cache='block'``, block-causal models): the first
        forward builds the cache over the whole canvas; every later one runs the rows' window (from
        its start at a multiple of the block size: the prompt's part of a shared block included)
        against it, and on a row's first step in a block also every block since its last forward's
        window start (the block before, or several when multi-block decoding finished more than one
        at once), so the final tokens of those blocks are stored by this forward (no extra forward,
        nothing stale)."""
        b = int(self.block_size)
        if self.cache is None:
            logits, _ = self._refresh(x, attn, rows, out_cols, block_index)
            self.served_from[rows] = out_cols[:, 0]
            return Served(logits, None, refreshed=torch.ones_like(entering))
        start = (out_cols[:, 0] // b) * b
        before = self.served_from[rows]
        before = torch.where(before >= 0, (before // b) * b, (start - b).clamp(min=0))
        start = torch.where(entering, torch.minimum(before, start), start)
        self.served_from[rows] = out_cols[:, 0]
        end = torch.where(out_valid, out_cols, torch.zeros_like(out_cols)).amax(1) + 1
        span = int((end - start).max())
        query = start[:, None] + torch.arange(span, device=x.device)[None, :]
        valid = query < end[:, None]
        query = torch.where(valid, query, (end - 1)[:, None].expand_as(query))  # ascending, pads last
        logits, _ = self._against_cache(x, attn, rows, out_cols, query, valid)
        self.cached_block[rows] = block_index
        return Served(logits, None, refreshed=torch.zeros_like(entering))

    def _serve_sub_blocks(self, x, attn, rows, out_cols, out_valid, block_index, lengths, entering) -> Served:
        """Fast-dLLM v2's approximate sub-block cache (``use_block_cache``; ``sub_block`` s) over the exact
        cache of completed blocks. A row's current sub-block is the first one (s positions, aligned to
        the model block's start) holding a masked slot. Once the row's block is frozen and that
        sub-block's first position is decided, the sub-block runs alone: its keys and values written,
        the rest of the block's as the last whole-block forward left them (Fast-dLLM v2's
        ``block_past_key_values`` with ``replace_position``); the window's other slots keep the logits
        of the last forward that gave them. Otherwise the block runs whole (:meth:`_serve_block`) and
        is frozen when its first position is decided (Fast-dLLM v2 freezes a block in its first forward
        after taking that token from the forward that stored the block before). ``refreshed``: the
        rows that ran their whole block."""
        mask_id = int(self.model.mask_token_id)
        b, s = int(self.block_size), int(self.sub_block)  # type: ignore[arg-type]
        start = (out_cols[:, 0] // b) * b  # each row's model block start
        masked = (x[rows].gather(1, out_cols) == mask_id) & out_valid
        sub = (out_cols - start[:, None]) // s
        first = start + torch.where(masked, sub, torch.full_like(sub, b)).amin(1) * s  # the sub-block's start
        decided = x[rows].gather(1, first.clamp(max=x.shape[1] - 1)[:, None])[:, 0] != mask_id
        alone = masked.any(1) & decided & ~entering & (self.frozen_block[rows] == block_index)
        if self.cache is None:
            alone = torch.zeros_like(alone)
        out: Optional[torch.Tensor] = None
        for flag in (False, True):
            pick = (alone == flag).nonzero().squeeze(1)
            if pick.numel() == 0:
                continue
            if flag:
                logits = self._sub_block_logits(x, attn, rows[pick], out_cols[pick], out_valid[pick], first[pick])
            else:
                logits = self._serve_block(x, attn, rows[pick], out_cols[pick], out_valid[pick], block_index[pick],
                                           lengths[pick], entering[pick]).logits
                head = x[rows[pick], start[pick]] != mask_id
                self.frozen_block[rows[pick]] = torch.where(head, block_index[pick], -1)
            if pick.numel() == rows.numel():
                out = logits
            else:
                out = logits.new_empty((rows.numel(), *logits.shape[1:])) if out is None else out
                out[pick] = logits
            self._keep_latest(rows[pick], out_cols[pick], out_valid[pick], logits)
        return Served(out, None, refreshed=~alone)  # type: ignore[arg-type]

    def _sub_block_logits(self, x, attn, rows, out_cols, out_valid, first) -> torch.Tensor:
        """Window logits ``[n, W, V]`` of rows whose current sub-block (from canvas column ``first``) runs
        alone against the cache: fresh in the sub-block, the latest kept elsewhere."""
        b, s = int(self.block_size), int(self.sub_block)  # type: ignore[arg-type]
        end = torch.where(out_valid, out_cols, torch.zeros_like(out_cols)).amax(1) + 1
        query = first[:, None] + torch.arange(s, device=x.device)[None, :]
        valid = query < end[:, None]
        query = torch.where(valid, query, (end - 1)[:, None].expand_as(query))  # ascending, pads last
        fresh, _ = self._against_cache(x, attn, rows, query, query, valid)
        j = out_cols - first[:, None]
        inside = (j >= 0) & (j < s) & out_valid
        fresh = fresh.gather(1, j.clamp(0, s - 1)[:, :, None].expand(-1, -1, fresh.shape[-1]))
        return torch.where(inside[:, :, None], fresh, self.latest[rows[:, None], out_cols % b])  # type: ignore[index]

    def _keep_latest(self, rows, out_cols, out_valid, logits) -> None:
        """Store the real window slots' logits by block offset (``latest`` ``[B, b, V]``)."""
        b = int(self.block_size)  # type: ignore[arg-type]
        if self.latest is None:
            self.latest = logits.new_zeros((self.cached_block.numel(), b, logits.shape[-1]))
        r, j = out_valid.nonzero(as_tuple=True)
        self.latest[rows[r], out_cols[r, j] % b] = logits[r, j]

    def _full(self, cache: Any, rows: torch.Tensor) -> Any:
        """A batch-sized cache from a subset's (only when the first refresh serves a subset)."""
        full = cache.select(torch.zeros(self.cached_block.numel(), dtype=torch.long, device=rows.device))
        full.update_rows(rows, cache)
        return full

    def _cached(self, x, attn, rows, out_cols, out_valid, lengths, shadow: bool = False):
        start = out_cols[:, :1]  # the block's first canvas column per row
        if self.mode == "prefix":  # the block and everything after it, ragged per row
            span = int((lengths[:, None] - start).max())
            query = start + torch.arange(span, device=x.device)[None, :]
            valid = query < lengths[:, None]
        else:  # dual: the block only
            query, valid = out_cols, out_valid
        query = torch.where(valid, query, (lengths - 1)[:, None].expand_as(query))  # ascending, pads last
        return self._against_cache(x, attn, rows, out_cols, query, valid, shadow)

    def _against_cache(self, x, attn, rows, out_cols, query, valid, shadow: bool = False):
        """Run the ``query`` columns of batch ``rows`` against the cache (written in place where
        ``valid``): ``(logits, shadow logits or None)``."""
        whole = rows.numel() == self.cached_block.numel() and bool(
            (rows == torch.arange(rows.numel(), device=rows.device)).all())
        sub = self.cache if whole else self.cache.select(rows)
        sh = None
        if shadow:
            logits, sh, sub = self.model.shadow_window_logits(x[rows], attn[rows], out_cols, cache=sub,
                                                              query_cols=query, query_valid=valid)
        else:
            logits, sub = self.model.window_logits(x[rows], attn[rows], out_cols, cache=sub, query_cols=query,
                                                   query_valid=valid)
        if not whole:
            self.cache.update_rows(rows, sub)
        return logits, sh


# ---------------------------------------------------------------------- verification (revocable decoding)
def supports_shadow(model: Any) -> bool:
    """Whether ``model`` computes WINO's shadow block in its own forward (``shadow_window_logits``)."""
    return (supports_cache(model) and bool(getattr(model, "supports_shadow", False))
            and hasattr(model, "shadow_window_logits"))


def token_logprob(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens) ``[...]`` under ``logits`` ``[..., V]``, in float32 (the token's logit less the
    log-sum-exp: no log-softmax over the vocabulary is kept)."""
    z = logits.float()
    return z.gather(-1, tokens.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, -1)


def verification_logits(model: Any, x: torch.Tensor, attn: torch.Tensor, cols: torch.Tensor,
                        probe: torch.Tensor, exact: bool = False) -> tuple[Optional[torch.Tensor], torch.Tensor]:
    """Logits ``[b, W, V]`` of each window column ``cols`` with that column hidden (rows of the
    ``probe`` ``[b, W]`` slots are meaningful; ``None`` when nothing is probed), and the forwards
    this cost per row ``[b]``.

    A model with the shadow block runs it as one extra forward (1 per row that probes). Any other
    denoiser (and any, with ``exact``) gets the exact version: one canvas per probed slot with that
    slot masked, batched, each counted as one forward of its row.
    """
    b, w = cols.shape
    cost = torch.zeros(b, dtype=torch.long, device=x.device)
    if not probe.any():
        return None, cost
    if supports_shadow(model) and not exact:
        idx = probe.any(1).nonzero().squeeze(1)
        _, sh = model.shadow_logits(x[idx], attn[idx], cols[idx])
        out = sh.new_zeros((b, *sh.shape[1:]))
        out[idx] = sh
        cost[idx] = 1
        return out, cost
    r, j = probe.nonzero(as_tuple=True)
    canvas = x[r].clone()
    canvas[torch.arange(r.numel(), device=x.device), cols[r, j]] = int(model.mask_token_id)
    at = window_logits(model, canvas, attn[r], cols[r, j][:, None])[:, 0]  # [n, V]
    out = at.new_zeros((b, w, at.shape[-1]))
    out[r, j] = at
    cost.index_add_(0, r, torch.ones_like(r))
    return out, cost
