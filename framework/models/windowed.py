"""The windowed, cached call that the engine's KV-cache policy uses (:mod:`adaptive_decoding.framework.engine.denoise`).

A model that mixes in :class:`WindowedDenoiser` implements one primitive, :meth:`core` (the
signature of :meth:`adaptive_decoding.framework.models.arch.layers.MaskedDiffusionLM.forward`: queries, explicit
positions, a key mask, an in-place :class:`~adaptive_decoding.framework.models.arch.layers.KVCache` and the rows
that reach the LM head), and gets from this mixin

* the plain protocol: ``model(input_ids, attention_mask) -> logits [B, L, V]``;
* ``window_logits(x, attention_mask, out_cols, cache=, query_cols=, query_valid=, use_cache=)``:
  logits ``[B, W, V]`` at canvas columns ``out_cols`` only, from a full forward (optionally
  returning a fresh cache: the refresh) or from the query columns against the cache;
* ``shadow_window_logits(x, attention_mask, out_cols, cache=, query_cols=, ...)`` (and
  ``shadow_logits``, its uncached form): the same window logits and, from the same forward,
  WINO's **shadow block**: a mask token at each window column that sees every real column
  except its own, so its logits are the column's prediction with the column hidden (the
  verification of a decided token), with or without the KV cache (``supports_shadow`` is False
  for shifted models).

Positions are canvas columns: the loop pads rows on the right and masks the padding out of the
keys, so a row's positions and attention are those of its single run (a batch of N equals N
single runs, with or without the cache). ``logits_shift = 1`` (Dream) means hidden state ``i``
predicts token ``i + 1``: the logits of column ``c`` come from the hidden state of ``c − 1``
(column 0 keeps its own, as Dream's ``cat([logits[:, :1], logits[:, :-1]])``). Under the cache
the column before the first query is then added as a query that is not written back, so the
window's first position is predicted exactly (Fast-dLLM reads that row from the position's own
hidden state instead; it never uses it, having committed the block's first token at refresh).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

Tensor = torch.Tensor


class WindowedDenoiser:
    """Mixin: the plain and the windowed call in terms of :meth:`core` (see the module doc)."""

    supports_kv_cache = True
    #: 1 when hidden state i predicts token i + 1 (Dream), 0 when it predicts token i (LLaDA, tiny)
    logits_shift = 0
    #: the trained block size of a block-causal model (LLaDA2.x, SDAR, Fast-dLLM v2), else None
    block_size: Optional[int] = None

    @property
    def block_causal(self) -> bool:
        """Whether column q attends only to columns of blocks ``≤ q // block_size`` (module doc)."""
        return self.block_size is not None

    def key_mask(self, attention_mask: Optional[Tensor], query_cols: Tensor, n_keys: int) -> Optional[Tensor]:
        """The keys each query may see: ``attention_mask`` ``[B, S]`` (True = real), and on a
        block-causal model also only keys of its own or an earlier block: ``[B, T, S]``."""
        key_mask = None if attention_mask is None else attention_mask.bool()
        if not self.block_causal:
            return key_mask
        b = int(self.block_size)  # type: ignore[arg-type]
        keys = torch.arange(n_keys, device=query_cols.device)
        mask = (keys[None, None, :] // b) <= (query_cols[:, :, None] // b)
        return mask if key_mask is None else mask & key_mask[:, None, :]

    def core(self, input_ids: Tensor, *, position_ids: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
             cache: Any = None, write_positions: Optional[Tensor] = None, write_valid: Optional[Tensor] = None,
             output_positions: Optional[Tensor] = None, use_cache: bool = False) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def full_logits(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        """The plain protocol: logits ``[B, L, V]`` of every column (shifted where the model shifts)."""
        cols = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
        logits, _ = self.core(input_ids, key_mask=self.key_mask(attention_mask, cols, input_ids.shape[1]))
        if self.logits_shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    def window_logits(
        self, x: Tensor, attention_mask: Optional[Tensor], out_cols: Tensor, *, cache: Any = None,
        query_cols: Optional[Tensor] = None, query_valid: Optional[Tensor] = None, use_cache: bool = False,
    ) -> tuple[Tensor, Any]:
        """Logits ``[B, W, V]`` at canvas columns ``out_cols`` ``[B, W]`` of ``x`` ``[B, L]``, and the cache.

        Without ``cache``: one forward over the whole canvas (``use_cache=True`` also returns a new
        cache of all L columns: the refresh). With ``cache``: only ``query_cols`` ``[B, T]``
        (ascending per row; ``query_valid`` marks the real ones) run; their keys and values are
        written into the cache in place, and they attend over every column of the row.
        """
        src = (out_cols - self.logits_shift).clamp(min=0)  # the hidden rows that predict out_cols
        if cache is None:
            cols = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
            return self.core(x, key_mask=self.key_mask(attention_mask, cols, x.shape[1]), output_positions=src,
                             use_cache=use_cache)
        if query_cols is None:
            raise ValueError("window_logits with a cache needs query_cols")
        valid = torch.ones_like(query_cols, dtype=torch.bool) if query_valid is None else query_valid.bool()
        if self.logits_shift:  # the column before the block predicts its first position: query it, never write it
            prev = (query_cols[:, :1] - 1).clamp(min=0)
            query_cols = torch.cat([prev, query_cols], dim=1)
            valid = torch.cat([torch.zeros_like(prev, dtype=torch.bool), valid], dim=1)
        rows = torch.searchsorted(query_cols.contiguous(), src.contiguous())
        rows = rows.clamp(max=query_cols.shape[1] - 1)
        key_mask = self.key_mask(attention_mask, query_cols, x.shape[1])
        logits, cache = self.core(x.gather(1, query_cols), position_ids=query_cols, key_mask=key_mask, cache=cache,
                                  write_positions=query_cols, write_valid=valid, output_positions=rows)
        return logits, cache

    @property
    def supports_shadow(self) -> bool:
        """Whether :meth:`shadow_logits` is available (not for shifted, Dream-style models, nor for
        block-causal ones: verification then uses exact probes)."""
        return not self.logits_shift and not self.block_causal

    def shadow_logits(self, x: Tensor, attention_mask: Optional[Tensor], out_cols: Tensor) -> tuple[Tensor, Tensor]:
        """Window logits ``[B, W, V]`` at ``out_cols`` and shadow logits ``[B, W, V]``, in one forward
        over the whole canvas (:meth:`shadow_window_logits` without a cache)."""
        logits, shadow, _ = self.shadow_window_logits(x, attention_mask, out_cols)
        return logits, shadow

    def shadow_window_logits(
        self, x: Tensor, attention_mask: Optional[Tensor], out_cols: Tensor, *, cache: Any = None,
        query_cols: Optional[Tensor] = None, query_valid: Optional[Tensor] = None, use_cache: bool = False,
    ) -> tuple[Tensor, Tensor, Any]:
        """:meth:`window_logits` plus WINO's shadow block (arXiv 2507.18578) in the same forward.

        W mask tokens at the positions ``out_cols`` follow the queries: real queries attend to the
        real columns only (their logits equal :meth:`window_logits`'), shadow slot j to itself and
        every real column but ``out_cols[:, j]``, so it predicts column j as if it were masked, the
        other columns unchanged (exactly at the first layer; deeper layers see real states that saw
        the column's token, as in WINO). Without ``cache`` the queries are the whole canvas
        (``use_cache=True`` returns the refreshed cache of its L real columns); with ``cache`` they
        are ``query_cols`` as in :meth:`window_logits`, and the shadow slots' keys are seen in this
        forward only (``ephemeral``), never written. Returns ``(logits, shadow, cache)``.
        """
        if self.logits_shift:
            raise NotImplementedError(f"{type(self).__name__} shifts its logits; the shadow block needs an unshifted model")
        b, l = x.shape  # noqa: E741
        w = out_cols.shape[1]
        dev = x.device
        real = (torch.ones(b, l, dtype=torch.bool, device=dev) if attention_mask is None
                else attention_mask.bool())
        mask_id = int(getattr(self, "mask_token_id"))
        shadow_ids = torch.full((b, w), mask_id, dtype=x.dtype, device=dev)
        own = torch.zeros(b, w, l, dtype=torch.bool, device=dev).scatter_(2, out_cols[:, :, None], True)
        if cache is None:
            queries, t = torch.arange(l, device=dev).expand(b, l), l
        else:
            if query_cols is None:
                raise ValueError("shadow_window_logits with a cache needs query_cols")
            queries, t = query_cols, query_cols.shape[1]
        km = torch.zeros(b, t + w, l + w, dtype=torch.bool, device=dev)
        km[:, :t, :l] = real[:, None, :]
        km[:, t:, :l] = real[:, None, :] & ~own
        km[:, t:, l:] = torch.eye(w, dtype=torch.bool, device=dev)
        pos = torch.cat([queries, out_cols], dim=1)
        shadow_rows = t + torch.arange(w, device=dev).expand(b, w)
        if cache is None:
            rows = torch.cat([out_cols, shadow_rows], dim=1)
            logits, full = self.core(torch.cat([x, shadow_ids], dim=1), position_ids=pos, key_mask=km,
                                     output_positions=rows, use_cache=use_cache)
            if full is not None:  # keep the L real columns: the shadow is never cached
                full = type(full)([k[:, :, :l].contiguous() for k in full.keys],
                                  [v[:, :, :l].contiguous() for v in full.values])
            return logits[:, :w], logits[:, w:], full
        valid = torch.ones_like(query_cols, dtype=torch.bool) if query_valid is None else query_valid.bool()
        at = torch.searchsorted(query_cols.contiguous(), out_cols.contiguous()).clamp(max=t - 1)
        ids = torch.cat([x.gather(1, query_cols), shadow_ids], dim=1)
        logits, cache = self.core(ids, position_ids=pos, key_mask=km, cache=cache, write_positions=pos,
                                  write_valid=torch.cat([valid, torch.zeros_like(out_cols, dtype=torch.bool)], 1),
                                  output_positions=torch.cat([at, shadow_rows], dim=1), ephemeral=w)
        return logits[:, :w], logits[:, w:], cache
