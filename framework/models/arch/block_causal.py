"""Block-causal attention and the exact cache of completed blocks (SDAR, Fast-dLLM v2).

A block-diffusion model splits the sequence into blocks of ``block_size`` positions; a query at
position ``p`` sees a key at position ``q`` iff ``q // block_size <= p // block_size`` (its own
block bidirectionally, every earlier block, nothing later). Positions count real tokens: with
padding, pass ``position_ids`` (e.g. ``key_valid.cumsum(-1) - 1`` for left padding) and
``key_valid`` (False at pads); a row's blocks are then those of its unpadded run, so a padded
batch equals its rows run one by one. With right padding (the engine's layout) positions are the
canvas columns and the defaults apply.

The cache is the framework's in-place :class:`~.layers.KVCache` (the protocol LLaDA and Dream use,
see :meth:`.layers.MaskedDiffusionLM.forward`) with one slot per canvas column, allocated once by
:meth:`BlockCausalLM.new_cache`. :meth:`BlockCausalLM.forward_cached` runs the queries at some
canvas ``columns``, WRITES their keys/values at those slots and attends block-causally over every
slot (slots of later blocks are masked out whatever they hold). Hence the protocol, equivalent to
SDAR's ``store_kv`` / Fast-dLLM v2's ``update_past_key_values`` appends:

1. prefill: ``forward_cached(prompt, columns=[0, P))`` (whole prompt blocks, or the whole prompt:
   a partial last block is rewritten by the first decoding forward anyway);
2. decoding block ``k`` (columns ``[s, e)``): each step ``forward_cached(x[:, s:e], columns=[s, e))``
   sees the completed blocks from the cache and the current block bidirectionally;
3. once the block's last token is committed, ONE more ``forward_cached`` over the block stores the
   keys/values of its final tokens (SDAR's extra "store" forward; Fast-dLLM v2's forward that also
   yields the next block's first token). Every later block then reads exactly what a full forward
   would compute: keys of block ``k`` depend only on blocks ``<= k``.

Forward the whole current block each time (a partial query window would read stale slots of its
own block). ``write_valid`` (False = query but do not write) and ``output_positions`` pass through:
Fast-dLLM v2's shifted logits for block ``[s, e)`` come from the rows ``s - 1 .. e - 2``; query
``[s - 1, e)`` with ``write_valid`` False at ``s - 1`` (its block ``k - 1`` is complete, so its
row equals the store forward's last row). Cache modes: ``"none"`` (:meth:`forward_full`, or the
plain forward with a :meth:`block_key_mask`) and ``"block"`` (this protocol); LLaDA/Dream's
``"prefix"`` / ``"dual"`` refresh caches are refused (:meth:`check_cache_mode`): under a
block-causal mask the completed-block cache is already exact and nothing needs refreshing.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .errors import UnsupportedArchitectureError
from .layers import KVCache, MaskedDiffusionLM

CACHE_MODES = ("none", "block")


def default_positions(B: int, L: int, device: torch.device, key_valid: Optional[Tensor] = None) -> Tensor:
    """``[B, L]`` positions: ``arange(L)``, or with ``key_valid`` the count of real tokens before each
    column (``cumsum - 1``, pads clamped to 0), which is left padding's convention."""
    if key_valid is None:
        return torch.arange(L, device=device).expand(B, L)
    return (key_valid.long().cumsum(-1) - 1).clamp(min=0)


def block_key_mask(query_positions: Tensor, key_positions: Tensor, block_size: int,
                   key_valid: Optional[Tensor] = None) -> Tensor:
    """Boolean ``[B, T, S]``: query ``t`` may see key ``s`` (same or earlier block, real key)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    q = torch.div(query_positions, block_size, rounding_mode="floor")[:, :, None]
    k = torch.div(key_positions, block_size, rounding_mode="floor")[:, None, :]
    mask = k <= q
    return mask & key_valid.bool()[:, None, :] if key_valid is not None else mask


def block_columns(pads: Tensor, block: int, block_size: int) -> Tensor:
    """``[B, block_size]`` canvas columns of block ``block`` for left-padded rows (``pads`` ``[B]``
    = left pad count per row): ``pads[b] + block * block_size + arange(block_size)``."""
    return pads.long()[:, None] + block * block_size + torch.arange(block_size, device=pads.device)[None]


class BlockCausalLM(MaskedDiffusionLM):
    """A :class:`~.layers.MaskedDiffusionLM` trained block-causally (see the module docstring).

    Subclasses set ``block_size`` (from the checkpoint's config). ``forward`` itself is the plain
    (mask-agnostic) forward; :meth:`forward_full` and :meth:`forward_cached` add the block mask.
    """

    block_size: int = 0
    block_causal = True
    cache_modes = CACHE_MODES

    def check_block_length(self, block_length: int) -> None:
        """Refuse a decoding block length other than the one the checkpoint was trained with."""
        if int(block_length) != self.block_size:
            raise UnsupportedArchitectureError(
                f"{self.arch_name} was trained with blocks of {self.block_size} tokens (config.json); "
                f"block_length={block_length} would change its attention pattern: use {self.block_size}")

    def check_cache_mode(self, mode: str) -> None:
        """Refuse a cache mode this model has no exact meaning for."""
        if mode not in self.cache_modes:
            raise UnsupportedArchitectureError(
                f"{self.arch_name} is block-causal: cache modes {list(self.cache_modes)} ('block' = the exact "
                f"cache of completed blocks); {mode!r} (a bidirectional refresh cache) does not apply")

    def block_key_mask(self, query_positions: Tensor, key_positions: Tensor,
                       key_valid: Optional[Tensor] = None) -> Tensor:
        """:func:`block_key_mask` with this model's ``block_size``."""
        return block_key_mask(query_positions, key_positions, self.block_size, key_valid)

    def forward_full(self, input_ids: Tensor, *, position_ids: Optional[Tensor] = None,
                     key_valid: Optional[Tensor] = None, output_positions: Optional[Tensor] = None) -> Tensor:
        """Logits ``[B, T or W, V]`` of a block-causal forward over ``input_ids`` ``[B, T]``, no cache.
        ``position_ids`` default to :func:`default_positions` of ``key_valid``."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = default_positions(B, T, input_ids.device, key_valid)
        mask = self.block_key_mask(position_ids, position_ids, key_valid)
        logits, _ = self(input_ids, position_ids=position_ids, key_mask=mask, output_positions=output_positions)
        return logits

    def new_cache(self, batch_size: int, length: int) -> KVCache:
        """An empty (zero) cache of ``length`` slots, one per canvas column, on the model's device and dtype."""
        attn = self.layers[0].attn
        shape = (batch_size, attn.n_kv_heads, length, attn.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        return KVCache(keys, values)

    def forward_cached(self, input_ids: Tensor, columns: Tensor, cache: KVCache, *,
                       position_ids: Optional[Tensor] = None, key_valid: Optional[Tensor] = None,
                       write_valid: Optional[Tensor] = None, output_positions: Optional[Tensor] = None) -> Tensor:
        """Logits of the queries ``input_ids`` ``[B, T]`` at canvas ``columns`` ``[B, T]`` against ``cache``
        (S slots); their keys/values are written at ``columns`` (except where ``write_valid`` is False).

        ``position_ids`` / ``key_valid`` describe the whole canvas (``[B, S]``; defaults: ``arange(S)``
        and every slot real, or positions from ``key_valid``). See the module docstring for the protocol.
        """
        B, T = input_ids.shape
        S = cache.length
        if columns.shape != (B, T):
            raise ValueError(f"columns must be [B, T] = [{B}, {T}], got {tuple(columns.shape)}")
        if position_ids is None:
            position_ids = default_positions(B, S, input_ids.device, key_valid)
        if position_ids.shape != (B, S) or (key_valid is not None and key_valid.shape != (B, S)):
            raise ValueError(f"position_ids and key_valid describe the whole canvas: [B, S] = [{B}, {S}]")
        columns = columns.to(input_ids.device).long()
        q_pos = position_ids.gather(1, columns)
        mask = self.block_key_mask(q_pos, position_ids, key_valid)
        logits, _ = self(input_ids, position_ids=q_pos, key_mask=mask, cache=cache, write_positions=columns,
                         write_valid=write_valid, output_positions=output_positions)
        return logits
