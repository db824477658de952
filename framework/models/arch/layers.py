"""Building blocks of the bidirectional (masked-diffusion) Transformers LLaDA and Dream.

Both are Llama-style stacks run WITHOUT a causal mask (LLaDA, Nie et al. 2025, "Large Language
Diffusion Models"; Dream 7B, Ye et al. 2025, a Qwen2.5 body): token embedding, ``n_layers``
pre-norm blocks ``x + Attn(RMSNorm(x))`` then ``x + SwiGLU(RMSNorm(x))``, a final RMSNorm and a
vocabulary projection. Only the names of the parameters and a few numeric details differ; the
architecture modules (:mod:`.llada`, :mod:`.dream`) map their checkpoints onto these modules.

Symbols (config keys of the checkpoints): ``d_model``/``hidden_size`` = C, ``n_heads``/
``num_attention_heads`` = H, ``n_kv_heads``/``num_key_value_heads`` = H_kv (GQA when < H),
head dim D = C / H, ``rope_theta`` = RoPE base, ``rms_norm_eps``, ``mlp_hidden_size``/
``intermediate_size``.

Attention is ``torch.nn.functional.scaled_dot_product_attention`` with a boolean key mask
broadcast as ``[B, 1, 1, S]`` (no ``[B, L, L]`` mask is built); a query row whose keys are all
masked attends to every key instead, so no NaN appears (its output is meaningless but finite).

:class:`KVCache` holds per layer ``k, v`` of shape ``[B, H_kv, S, D]`` with RoPE ALREADY applied
to ``k`` (Fast-dLLM keeps keys before RoPE and re-rotates the whole cache every step; rotating
once at write time gives the same numbers because a key's position never changes). A forward
with a cache writes its T new keys/values in place at ``write_positions`` and then attends over
all S slots, which covers Fast-dLLM's prefix cache (write ``[block_start, L)``) and dual cache
(write ``[block_start, block_end)`` only).
"""

from __future__ import annotations

import re
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KVCache:
    """Keys and values of every layer: ``keys[l]``, ``values[l]`` are ``[B, H_kv, S, D]``, keys rotated.

    Forwards update it in place, so create and use it under the same grad mode (a cache made
    under ``torch.inference_mode()`` can only be written inside ``inference_mode``).
    """

    def __init__(self, keys: list[Tensor], values: list[Tensor]) -> None:
        if len(keys) != len(values) or not keys:
            raise ValueError(f"a KVCache needs one key and one value tensor per layer, "
                             f"got {len(keys)} and {len(values)}")
        self.keys = list(keys)
        self.values = list(values)

    @property
    def length(self) -> int:
        """S, the number of cached positions."""
        return int(self.keys[0].shape[2])

    @property
    def batch_size(self) -> int:
        return int(self.keys[0].shape[0])

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def select(self, rows: Tensor) -> "KVCache":
        """A copy holding only batch ``rows`` (a 1-D LongTensor)."""
        rows = rows.to(self.keys[0].device)
        return KVCache([k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values])

    def update_rows(self, rows: Tensor, other: "KVCache") -> None:
        """Write ``other`` (``len(rows)`` rows, same S) back into batch ``rows`` of this cache, in place."""
        if other.num_layers != self.num_layers or other.length != self.length:
            raise ValueError(f"cannot update a cache of {self.num_layers} layers x {self.length} positions from one "
                             f"of {other.num_layers} layers x {other.length} positions")
        rows = rows.to(self.keys[0].device)
        for mine, theirs in zip(self.keys + self.values, other.keys + other.values):
            mine.index_copy_(0, rows, theirs.to(mine.dtype))

    def clone(self) -> "KVCache":
        return KVCache([k.clone() for k in self.keys], [v.clone() for v in self.values])

    def write(self, layer: int, k: Tensor, v: Tensor, positions: Tensor,
              rows: Optional[tuple[Tensor, Tensor]] = None, ephemeral: int = 0) -> tuple[Tensor, Tensor]:
        """Store layer ``layer``'s new ``k, v`` (``[B, H_kv, T, D]``) in place and return its full
        ``[B, H_kv, S, D]`` tensors. Either ``positions`` is ``[B, T]`` (every query row is written,
        one copy per batch row, no host sync) or ``rows = (b, t)`` selects the written entries and
        ``positions`` is their 1-D slot list. With ``ephemeral`` = E the last E queries' keys and
        values (not written: ``rows`` leaves them out) follow the S slots in the returned tensors,
        ``[B, H_kv, S + E, D]``: seen in this forward only, never cached."""
        ck, cv = self.keys[layer], self.values[layer]
        if rows is None:  # one index_copy_ per row: scatter_ on bfloat16 CPU tensors copies the layer to float32
            k, v = k.to(ck.dtype), v.to(cv.dtype)
            for b in range(ck.shape[0]):
                ck[b].index_copy_(1, positions[b], k[b])
                cv[b].index_copy_(1, positions[b], v[b])
        else:
            b, t = rows
            ck[b, :, positions] = k.transpose(1, 2)[b, t].to(ck.dtype)
            cv[b, :, positions] = v.transpose(1, 2)[b, t].to(cv.dtype)
        if ephemeral:
            n = k.shape[2] - ephemeral
            return (torch.cat([ck, k[:, :, n:].to(ck.dtype)], dim=2),
                    torch.cat([cv, v[:, :, n:].to(cv.dtype)], dim=2))
        return ck, cv


def check_ephemeral(ephemeral: int, cache: Optional[KVCache], write_valid: Optional[Tensor], t: int) -> int:
    """Validate ``ephemeral`` (queries whose keys are seen in this forward only) and return it."""
    if not ephemeral:
        return 0
    if cache is None or write_valid is None or not 0 < ephemeral <= t:
        raise ValueError(f"ephemeral={ephemeral} needs a cache, write_valid and 0 < ephemeral <= {t} queries")
    if bool(write_valid[:, t - ephemeral:].any()):
        raise ValueError("the ephemeral (last) queries must have write_valid False: they are never cached")
    return ephemeral


class RMSNorm(nn.Module):
    """``weight * (x / sqrt(mean(x^2) + eps))`` computed in float32 and cast back before the weight
    (LLaDA's ``RMSLayerNorm`` and Qwen2's ``RMSNorm`` agree on this order)."""

    def __init__(self, dim: int, eps: float, bias: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(x.dtype)
        return out + self.bias if self.bias is not None else out


def rope_cos_sin(position_ids: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """RoPE (Su et al. 2021) tables for ``position_ids`` ``[B, T]``: float32 ``cos, sin`` ``[B, T, D]``
    in the rotate-half layout (``cat(freqs, freqs)``), ``inv_freq = theta^(-2i/D)``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device).float() / head_dim))
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, full_precision: bool) -> Tensor:
    """Rotate ``x`` ``[B, H, T, D]``; in float32 when ``full_precision`` (LLaDA's
    ``rope_full_precision``), else in ``x``'s dtype with cos/sin cast to it (Qwen2/Dream)."""
    cos, sin = cos[:, None], sin[:, None]
    if full_precision:
        xf = x.float()
        return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention with GQA, RoPE and an optional in-place :class:`KVCache`."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, *, qkv_bias: bool, out_bias: bool,
                 rope_full_precision: bool) -> None:
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"d_model={d_model} must divide into n_heads={n_heads}, "
                             f"and n_heads into n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.rope_full_precision = rope_full_precision
        kv_dim = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, kv_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=out_bias)

    def keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Rotated keys and the values of the (normed) rows ``x`` ``[B, T, C]``: ``[B, H_kv, T, D]`` each."""
        B, T, _ = x.shape
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin, self.rope_full_precision), v

    def attend(self, x: Tensor, cos: Tensor, sin: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor]) -> Tensor:
        """``o_proj(softmax(q k^T / sqrt(D)) v)`` for the (normed) query rows ``x`` ``[B, T, C]`` over the
        keys and values ``k, v`` ``[B, H or H_kv, S, D]`` (GQA heads expanded here when still H_kv)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin, self.rope_full_precision)
        k, v = self.expand_heads(k), self.expand_heads(v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def expand_heads(self, t: Tensor) -> Tensor:
        """GQA: kv head j serves query heads ``j*g .. j*g+g-1``; ``t`` unchanged when it has H heads."""
        if t.shape[1] == self.n_heads:
            return t
        B, _, S, D = t.shape
        g = self.n_heads // self.n_kv_heads
        return t[:, :, None].expand(-1, -1, g, -1, -1).reshape(B, self.n_heads, S, D)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attn_mask: Optional[Tensor], cache: Optional[KVCache],
                layer: int, write_positions: Optional[Tensor], write_rows: Optional[tuple[Tensor, Tensor]],
                want_kv: bool, ephemeral: int = 0) -> tuple[Tensor, Optional[tuple[Tensor, Tensor]]]:
        k, v = self.keys_values(x, cos, sin)
        present = None
        if cache is not None:
            k, v = cache.write(layer, k, v, write_positions, write_rows, ephemeral)
        elif want_kv:  # a refresh: store contiguous [B, H_kv, T, D] so later in-place writes are plain strides
            present = (k.contiguous(), v.contiguous())
        return self.attend(x, cos, sin, k, v, attn_mask), present


class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020)."""

    def __init__(self, d_model: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=bias)
        self.up_proj = nn.Linear(d_model, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled():
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        g = F.silu(self.gate_proj(x), inplace=True)  # inference: one [.., hidden] intermediate fewer
        return self.down_proj(g.mul_(self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(attn_norm(x))``, then ``x + mlp(mlp_norm(x))``."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, mlp_hidden: int, eps: float, *,
                 qkv_bias: bool, bias: bool, norm_bias: bool, rope_full_precision: bool) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps, norm_bias)
        self.attn = SelfAttention(d_model, n_heads, n_kv_heads, qkv_bias=qkv_bias, out_bias=bias,
                                  rope_full_precision=rope_full_precision)
        self.mlp_norm = RMSNorm(d_model, eps, norm_bias)
        self.mlp = SwiGLU(d_model, mlp_hidden, bias)

    def forward(self, x: Tensor, *args) -> tuple[Tensor, Optional[tuple[Tensor, Tensor]]]:
        h, present = self.attn(self.attn_norm(x), *args)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), present

    def forward_chunked(self, x: Tensor, cos: Tensor, sin: Tensor, attn_mask: Optional[Tensor],
                        cache: Optional[KVCache], layer: int, write_positions: Optional[Tensor],
                        write_rows: Optional[tuple[Tensor, Tensor]], want_kv: bool, ephemeral: int,
                        chunk: int) -> tuple[Tensor, Optional[tuple[Tensor, Tensor]]]:
        """:meth:`forward` with the T query rows taken ``chunk`` at a time, updating ``x`` IN PLACE
        (inference only): first every row's keys and values (straight into the cache when every
        query is written), then per chunk the queries, attention, the MLP and both residual adds.
        Peak activations are the keys and values of this layer plus one chunk's, instead of every
        row's MLP intermediates ``[B, T, hidden]``; the numbers equal :meth:`forward`'s up to the
        order of floating-point sums inside the matrix products."""
        T = x.shape[1]
        spans = [(a, min(a + chunk, T)) for a in range(0, T, chunk)]
        present = None
        if cache is not None and write_rows is None and not ephemeral:  # write each chunk's k, v in place
            for a, b in spans:
                k, v = self.attn.keys_values(self.attn_norm(x[:, a:b]), cos[:, a:b], sin[:, a:b])
                k, v = cache.write(layer, k, v, write_positions[:, a:b])
        else:  # filled chunk by chunk: never a list of parts beside their concatenation
            B, Hkv, D = x.shape[0], self.attn.n_kv_heads, self.attn.head_dim
            k, v = x.new_empty(B, Hkv, T, D), x.new_empty(B, Hkv, T, D)
            for a, b in spans:
                k[:, :, a:b], v[:, :, a:b] = self.attn.keys_values(self.attn_norm(x[:, a:b]), cos[:, a:b], sin[:, a:b])
            if cache is not None:
                k, v = cache.write(layer, k, v, write_positions, write_rows, ephemeral)
            elif want_kv:
                present = (k, v)
        k, v = self.attn.expand_heads(k), self.attn.expand_heads(v)  # once per layer, not per chunk
        for a, b in spans:
            rows = x[:, a:b]
            mask = attn_mask if attn_mask is None or attn_mask.shape[2] == 1 else attn_mask[:, :, a:b]
            rows += self.attn.attend(self.attn_norm(rows), cos[:, a:b], sin[:, a:b], k, v, mask)
            rows += self.mlp(self.mlp_norm(rows))
        return x, present


def _key_count(B: int, T: int, cache: Optional[KVCache], write_positions: Optional[Tensor],
               write_valid: Optional[Tensor], ephemeral: int) -> int:
    """S, the keys a query sees (T, or the cache's slots, plus the ephemeral ones), after checking
    the shapes of the cache arguments of :meth:`MaskedDiffusionLM.forward`."""
    if cache is not None:
        if write_positions is None or write_positions.shape != (B, T):
            raise ValueError(f"with a cache, write_positions must be a [B, T] = [{B}, {T}] LongTensor of slots, "
                             f"got {None if write_positions is None else tuple(write_positions.shape)}")
        if cache.batch_size != B:
            raise ValueError(f"the cache holds {cache.batch_size} rows but input_ids has {B}; "
                             f"use cache.select(rows)")
        S = cache.length
    elif write_positions is not None or write_valid is not None:
        raise ValueError("write_positions / write_valid need a cache")
    else:
        S = T
    if write_valid is not None and write_valid.shape != (B, T):
        raise ValueError(f"write_valid must be [B, T] = [{B}, {T}], got {tuple(write_valid.shape)}")
    return S + check_ephemeral(ephemeral, cache, write_valid, T)


def _attention_mask(key_mask: Optional[Tensor], B: int, T: int, S: int, cache: Optional[KVCache]) -> Optional[Tensor]:
    """``key_mask`` (``[B, S]`` or per query ``[B, T, S]``, True = real key) as the boolean
    ``[B, 1, 1 or T, S]`` mask of the attention; ``None`` attends everywhere."""
    if key_mask is None:
        return None
    if key_mask.shape not in ((B, S), (B, T, S)):
        raise ValueError(f"key_mask must be [B, S] = [{B}, {S}] or per query [B, T, S] "
                         f"(S = {'cache length' if cache else 'T'}), got {tuple(key_mask.shape)}")
    km = key_mask.to(torch.bool)
    km = km | ~km.any(dim=-1, keepdim=True)  # a query with no real key: attend everywhere, stay finite
    return km[:, None, None, :] if km.dim() == 2 else km[:, None]


class MaskedDiffusionLM(nn.Module):
    """Embedding, :class:`Block` stack, final norm, LM head; the forward shared by LLaDA and Dream.

    Subclasses set the dimensions through :meth:`_build` and say how checkpoint names map onto
    these modules (``checkpoint_name``). Parameters: ``embed``, ``layers.N.{attn_norm, attn.{q,k,v,
    o}_proj, mlp_norm, mlp.{gate,up,down}_proj}``, ``norm``, ``lm_head`` (absent when tied).
    """

    arch_name = "masked diffusion LM"
    #: 1 when hidden state i predicts token i + 1 (Dream), 0 when it predicts token i (LLaDA)
    logits_shift = 0
    #: queries per chunk of a forward over more rows than this (None: one pass). A full forward
    #: (no cache, or a refresh) then holds one chunk's attention and MLP activations instead of every
    #: row's; smaller matrix products, so slower where arithmetic is the bound (set it for memory).
    query_chunk: Optional[int] = None

    def _build(self, *, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int,
               mlp_hidden: int, eps: float, rope_theta: float, rope_full_precision: bool, qkv_bias: bool,
               bias: bool, norm_bias: bool, tie: bool) -> None:
        self.vocab_size = vocab_size
        self.head_dim = d_model // n_heads
        self.rotary_dim = self.head_dim  # RoPE covers the whole head (LLaDA2 rotates a part of it)
        self.rope_theta = rope_theta
        self.tie_embeddings = tie
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            Block(d_model, n_heads, n_kv_heads, mlp_hidden, eps, qkv_bias=qkv_bias, bias=bias, norm_bias=norm_bias,
                  rope_full_precision=rope_full_precision) for _ in range(n_layers))
        self.norm = RMSNorm(d_model, eps, norm_bias)
        self.lm_head = None if tie else nn.Linear(d_model, vocab_size, bias=bias)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def forward(self, input_ids: Tensor, *, position_ids: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
                cache: Optional[KVCache] = None, write_positions: Optional[Tensor] = None,
                write_valid: Optional[Tensor] = None, output_positions: Optional[Tensor] = None,
                use_cache: bool = False, ephemeral: int = 0) -> tuple[Tensor, Optional[KVCache]]:
        """Logits ``[B, W or T, V]`` (model dtype, unshifted) and the cache.

        ``input_ids`` ``[B, T]`` are the queries. Without ``cache``: keys are the same T tokens,
        ``position_ids`` default to ``arange(T)``, ``key_mask`` is ``[B, T]``, and ``use_cache=True``
        returns a new :class:`KVCache` of all T positions (the refresh forward). With ``cache``
        (S slots): the T new k/v are written in place at ``write_positions`` ``[B, T]`` (slots in
        ``[0, S)``, distinct within a row; entries where ``write_valid`` is False are not written
        and their slot values are ignored), ``position_ids`` default to ``write_positions``, queries
        attend over all S slots masked by ``key_mask`` ``[B, S]`` (True = real key; the slots being
        written must be True there to be seen), and the same cache object is returned.
        ``output_positions`` ``[B, W]`` (indices into the T query rows) restricts the final norm and
        the LM head to W rows, so no ``[B, T, V]`` tensor is built. Attention is bidirectional.
        ``ephemeral`` = E (with a cache): the last E queries are not written (their ``write_valid``
        must be False) but their keys and values follow the S cached slots in this forward only, so
        ``key_mask`` is then ``[B, T, S + E]`` (WINO's shadow block under a cache).
        """
        B, T = input_ids.shape
        S = _key_count(B, T, cache, write_positions, write_valid, ephemeral)
        if position_ids is None:
            position_ids = (write_positions if cache is not None
                            else torch.arange(T, device=input_ids.device).expand(B, T))
        elif position_ids.shape != (B, T):
            raise ValueError(f"position_ids must be [B, T] = [{B}, {T}], got {tuple(position_ids.shape)}")
        mask = _attention_mask(key_mask, B, T, S, cache)
        write_rows = None
        if cache is not None and write_valid is not None and not bool(write_valid.all()):  # host syncs per
            write_rows = write_valid.to(torch.bool).nonzero(as_tuple=True)  # forward, not per layer; all
            write_positions = write_positions[write_rows]  # valid: the plain per-row copy, no gathers
        cos, sin = rope_cos_sin(position_ids, self.rotary_dim, self.rope_theta)
        h = self.embed(input_ids)
        want_kv = use_cache and cache is None
        keys, values = [], []
        chunk = self.query_chunk if self.query_chunk and T > self.query_chunk and not torch.is_grad_enabled() else 0
        for i, layer in enumerate(self.layers):
            if chunk:
                h, kv = layer.forward_chunked(h, cos, sin, mask, cache, i, write_positions, write_rows, want_kv,
                                              ephemeral, chunk)
            else:
                h, kv = layer(h, cos, sin, mask, cache, i, write_positions, write_rows, want_kv, ephemeral)
            if want_kv:
                keys.append(kv[0])
                values.append(kv[1])
        if output_positions is not None:
            if output_positions.dim() != 2 or output_positions.shape[0] != B:
                raise ValueError(f"output_positions must be [B, W] with B = {B}, got {tuple(output_positions.shape)}")
            h = h.gather(1, output_positions.to(h.device)[..., None].expand(-1, -1, h.shape[-1]))
        h = self.norm(h)
        logits = F.linear(h, self.embed.weight) if self.lm_head is None else self.lm_head(h)
        if cache is not None:
            return logits, cache
        return logits, (KVCache(keys, values) if want_kv else None)

    # ---- checkpoints -------------------------------------------------------------------------
    @staticmethod
    def checkpoint_name(name: str) -> str:
        """The checkpoint's name of parameter ``name`` of this module."""
        raise NotImplementedError

    @property
    def ignored_checkpoint_keys(self) -> tuple[str, ...]:
        """Regexes of checkpoint names that are tolerated and skipped: stored RoPE buffers, and the
        LM head of a tied model (transformers ties it to the embedding whatever the file holds)."""
        keys = (r"rotary_emb\.inv_freq$",)
        if self.lm_head is None:
            keys += ("^" + re.escape(self.checkpoint_name("lm_head.weight")) + "$",)
        return keys

    @classmethod
    def from_pretrained(cls, folder, dtype: Optional[torch.dtype] = None,
                        device: "torch.device | str | None" = None) -> "MaskedDiffusionLM":
        """Read ``folder/config.json`` and the weights (safetensors, sharded, or bin) without any
        remote code; parameters are frozen (``requires_grad=False``) and the model is in eval mode."""
        from .checkpoint import load_pretrained

        return load_pretrained(cls, folder, dtype=dtype, device=device)
