"""Layer variants of the Qwen2 / Qwen3 / OLMoE-style checkpoints (SDAR, Fast-dLLM v2, LLaDA-MoE)
on top of :mod:`.layers`: an attention with an explicit head dim, optional per-head query/key RMS
norm, optional clipping and partial rotary, and a softmax-routed mixture of experts.

Both plug into :class:`.layers.Block` / :class:`.layers.MaskedDiffusionLM` unchanged: the
attention subclasses :class:`.layers.SelfAttention` (same ``keys_values`` / ``attend`` /
``expand_heads``), so the forward, the in-place :class:`.layers.KVCache`, per-query key masks
and the chunked forward all apply. The model's ``head_dim`` attribute, which sizes the RoPE
tables in :meth:`.layers.MaskedDiffusionLM.forward`, is set to the ROTARY width (``head_dim *
partial_rotary_factor``); the attention's own ``head_dim`` is the full head width.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import Block, RMSNorm, SelfAttention, SwiGLU, apply_rope


class HeadAttention(SelfAttention):
    """Multi-head attention with explicit ``head_dim`` (``H * D`` may differ from ``C``, as in
    Qwen3/SDAR-4B: C = 2560, H = 32, D = 128), optional query/key RMS norm over each head's
    ``D`` channels applied before RoPE (Qwen3 ``q_norm``/``k_norm``; LLaDA-MoE ``qk_layernorm``),
    optional ``clip_qkv`` clamping after the norm (LLaDA-MoE), RoPE on the first ``rotary_dim``
    channels (cos/sin cast to the activation dtype, as Qwen2/Qwen3/OLMoE do)."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, *, qkv_bias: bool,
                 out_bias: bool, qk_norm: bool, eps: float, rotary_dim: Optional[int] = None,
                 clip_qkv: Optional[float] = None) -> None:
        nn.Module.__init__(self)
        if n_heads % n_kv_heads:
            raise ValueError(f"num_attention_heads={n_heads} must be a multiple of num_key_value_heads={n_kv_heads}")
        rotary_dim = head_dim if rotary_dim is None else int(rotary_dim)
        if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            raise ValueError(f"the rotary width {rotary_dim} must be even and in (0, head_dim={head_dim}]")
        self.n_heads, self.n_kv_heads, self.head_dim, self.rotary_dim = n_heads, n_kv_heads, head_dim, rotary_dim
        self.rope_full_precision = False
        self.clip_qkv = clip_qkv
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=out_bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def _heads(self, proj: nn.Linear, norm: Optional[RMSNorm], x: Tensor, heads: int) -> Tensor:
        B, T, _ = x.shape
        h = proj(x).view(B, T, heads, self.head_dim)
        if norm is not None:
            h = norm(h)
        if self.clip_qkv is not None:
            h = h.clamp(-self.clip_qkv, self.clip_qkv)
        return h.transpose(1, 2)

    def _rope(self, t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.rotary_dim == self.head_dim:
            return apply_rope(t, cos, sin, False)
        r = self.rotary_dim
        return torch.cat([apply_rope(t[..., :r], cos, sin, False), t[..., r:]], dim=-1)

    def keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Rotated (normed, clipped) keys and the values of rows ``x`` ``[B, T, C]``: ``[B, H_kv, T, D]``."""
        k = self._heads(self.k_proj, self.k_norm, x, self.n_kv_heads)
        v = self._heads(self.v_proj, None, x, self.n_kv_heads)
        return self._rope(k, cos, sin), v

    def attend(self, x: Tensor, cos: Tensor, sin: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor]) -> Tensor:
        """``o_proj(softmax(q k^T / sqrt(D)) v)`` for query rows ``x`` over ``k, v`` (see the base class)."""
        B, T, _ = x.shape
        q = self._rope(self._heads(self.q_proj, self.q_norm, x, self.n_heads), cos, sin)
        k, v = self.expand_heads(k), self.expand_heads(v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MoEFeedForward(nn.Module):
    """LLaDA-MoE's ``LLaDAMoESparseMoeBlock`` (+ the layer's optional shared expert).

    ``p = softmax(gate(x))`` in float32 (+ ``expert_bias`` when the checkpoint has one), the
    top-k experts by ``p`` with their ``p`` as weights (NOT renormalised: the published module
    hard-codes ``norm_topk_prob = False`` whatever the config says), cast to the activation dtype;
    output ``sum_k w_k * expert_k(x)`` (+ ``shared(x)``). Tokens are grouped by expert: one
    SwiGLU call per expert over all its tokens of the whole batch (a loop over experts, never over
    tokens), summed in ascending expert order like the reference's ``index_add_``. Each token's
    output depends on that token alone, so padding rows never change real rows.
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, expert_hidden: int,
                 shared_hidden: Optional[int], expert_bias: bool) -> None:
        super().__init__()
        if not 0 < top_k <= n_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be in [1, num_experts={n_experts}]")
        self.n_experts, self.top_k = n_experts, top_k
        self.gate = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, expert_hidden) for _ in range(n_experts))
        self.shared = SwiGLU(d_model, shared_hidden) if shared_hidden else None
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(n_experts))
        else:
            self.expert_bias = None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(weights ``[N, k]`` in ``x``'s dtype, expert ids ``[N, k]``) of the rows ``x`` ``[N, C]``."""
        p = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        if self.expert_bias is not None:
            p = p + self.expert_bias
        w, ids = torch.topk(p, self.top_k, dim=-1)
        return w.to(x.dtype), ids

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        w, ids = self.route(flat)
        order = ids.reshape(-1).argsort(stable=True)  # (token, slot) pairs grouped by expert
        counts = torch.bincount(ids.reshape(-1), minlength=self.n_experts).tolist()  # one host sync
        tokens = order // self.top_k
        weights = w.reshape(-1)[order]
        out = torch.zeros_like(flat)
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = tokens[start:start + n]
                y = self.experts[e](flat[rows]) * weights[start:start + n, None]
                out.index_add_(0, rows, y.to(out.dtype))
                start += n
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.reshape(shape)


class VariantBlock(Block):
    """Pre-norm block ``x + attn(norm(x))``, ``x + mlp(norm(x))`` with a :class:`HeadAttention` and
    either a dense :class:`~.layers.SwiGLU` or a :class:`MoEFeedForward` as ``mlp``."""

    def __init__(self, d_model: int, attn: HeadAttention, mlp: nn.Module, eps: float) -> None:
        nn.Module.__init__(self)
        self.attn_norm = RMSNorm(d_model, eps)
        self.attn = attn
        self.mlp_norm = RMSNorm(d_model, eps)
        self.mlp = mlp


def build_variant_lm(model: nn.Module, *, vocab_size: int, d_model: int, blocks: list[VariantBlock], eps: float,
                     rope_theta: float, rotary_dim: int, tie: bool) -> None:
    """Set the modules and attributes :meth:`.layers.MaskedDiffusionLM.forward` reads on ``model``."""
    model.vocab_size = vocab_size
    model.rotary_dim = rotary_dim  # the width of the RoPE tables the forward computes
    model.rope_theta = rope_theta
    model.tie_embeddings = tie
    model.embed = nn.Embedding(vocab_size, d_model)
    model.layers = nn.ModuleList(blocks)
    model.norm = RMSNorm(d_model, eps)
    model.lm_head = None if tie else nn.Linear(d_model, vocab_size, bias=False)
