"""LLaDA2.x-MoE (inclusionAI, "LLaDA2.0: Scaling Up Diffusion Language Models to 100B"; LLaDA2.1),
the framework's own implementation of ``model_type`` ``llada2_moe``.

LLaDA2.0-mini / -flash and LLaDA2.1-mini / -flash are **block-diffusion** models: a Ling-2.0 style
MoE Transformer trained with a block-causal attention mask (block size 32 in dFactory's SFT recipe,
``configs/sft/llada2_mini_bd_sft.yaml``). Hidden state ``i`` predicts token ``i`` (no shift). The
published code this module follows (read, not copied): the hub file ``modeling_llada2_moe.py`` as
copied in ZHZisZZ/dllm ``dllm/pipelines/llada2/models/`` (and ``llada21/``), inclusionAI/dFactory
``models/llada2_moe/modeling_llada2_moe.py``, inclusionAI/dInfer
``python/dinfer/model/modeling_llada2_moe.py`` and SGLang ``python/sglang/srt/models/llada2.py``.

Architecture (config symbols): C = ``hidden_size``, H = ``num_attention_heads``, H_kv =
``num_key_value_heads``, D = ``head_dim`` (or C / H), E = ``num_experts``, k =
``num_experts_per_tok``, G = ``n_group``, G_k = ``topk_group``.

* **Attention**: one fused projection ``query_key_value`` ``[(H + 2 H_kv) D, C]`` whose output, seen
  as ``[.., H + 2 H_kv, D]``, splits by heads into ``[H, H_kv, H_kv]`` (q, k, v); per-head RMSNorm of
  q and k (``query_layernorm`` / ``key_layernorm``, weight ``[D]``, ``use_qk_norm``) BEFORE RoPE;
  **partial rotary**: RoPE (``rope_theta``, rotate-half convention, ``inv_freq = theta^(-2i/d_r)``)
  on the FIRST ``d_r = int(D * partial_rotary_factor)`` dims of each head (64 of 128), the rest
  passes unchanged; cos/sin computed in float32 and cast to the model dtype, the rotation in the
  model dtype; SDPA with scale ``D^-0.5``; GQA; output projection ``dense``.
* **MLP**: layers ``< first_k_dense_replace`` (layer 0 of the released models) are a dense SwiGLU
  (``intermediate_size``); the others a sparse MoE. Router: ``s = sigmoid(h W_g^T)`` in float32;
  selection on ``s + expert_bias`` (``moe_router_enable_expert_bias``): the E experts form G groups,
  a group's score is the sum of its top-2 biased scores, the G_k best groups are kept, the top-k
  biased scores among their experts are chosen; the weights are the UNBIASED ``s`` of the chosen
  experts, renormalised to sum 1 (``+ 1e-20``) and times ``routed_scaling_factor``; the routed
  outputs are summed in float32, then the shared expert (SwiGLU of ``moe_intermediate_size *
  num_shared_experts``) is added unweighted. The router's ``weight`` and ``expert_bias`` are kept
  float32 whatever ``--dtype`` is (SGLang and dInfer do the same; the hub code casts the weight up
  in every forward).
* Embedding ``word_embeddings``, final RMSNorm, untied ``lm_head`` (``tie_word_embeddings`` false).
  Special ids of the released checkpoints: mask 156895, end of text 156892 (also ``pad_token_id``),
  vocabulary 157,184 (the ids are ``generate()``'s defaults; a ``config.json`` that names
  ``mask_token_id`` / ``eos_token_id`` wins).

Checkpoint names (``model.`` prefix) -> modules of :class:`~.layers.MaskedDiffusionLM`:
``word_embeddings`` -> ``embed``; ``layers.N.input_layernorm`` -> ``layers.N.attn_norm``;
``layers.N.attention.query_key_value`` / ``query_layernorm`` / ``key_layernorm`` / ``dense`` ->
``layers.N.attn.qkv_proj`` / ``q_norm`` / ``k_norm`` / ``o_proj``; ``layers.N.post_attention_layernorm``
-> ``layers.N.mlp_norm``; ``layers.N.mlp.{gate_proj,up_proj,down_proj}`` (dense layers),
``layers.N.mlp.gate.weight``, ``layers.N.mlp.gate.expert_bias``, ``layers.N.mlp.experts.E.{gate,up,
down}_proj``, ``layers.N.mlp.shared_experts.{gate,up,down}_proj`` -> the same under ``layers.N.mlp``;
``norm`` -> ``norm``; ``lm_head`` (no prefix) -> ``lm_head``.

**The block-causal interface** (what the block-diffusion engine calls). :meth:`LLaDA2MoeModel.forward`
takes every argument of :meth:`~.layers.MaskedDiffusionLM.forward` plus

* ``block_size`` = b: the attention becomes block-causal **by position**: a query at position ``p``
  sees a key at position ``q`` iff ``q // b <= p // b`` (blocks aligned from position 0; bidirectional
  inside a block), intersected with ``key_mask`` (``[B, S]`` or ``[B, T, S]``, True = real key). This
  is the reference's ``tril(ones(nb, nb))`` repeated by b, for any batch, padding or query subset;
  left padding works with ``position_ids = attention_mask.cumsum(-1) - 1`` (pads masked out of the
  keys), as for LLaDA / Dream;
* ``key_positions`` ``[B, S]``: the keys' positions. Default: the queries' ``position_ids`` without a
  cache; with a cache, the slot index (``slot == position``, the framework's right-padded canvas;
  pass it for a left-padded canvas under a cache). Ephemeral keys take the last E queries' positions.

The **exact block cache** uses the in-place :class:`~.layers.KVCache` of LLaDA / Dream (Fast-dLLM's
protocol) unchanged: ``cache = model.new_cache(B, L)`` allocates L slots (zeros); a forward with
``cache=cache, write_positions=cols`` writes its queries' keys/values at ``cols`` and attends over the
slots the block-causal mask allows, so slots of later blocks (stale or zero) are never seen. Keys of
completed blocks depend only on blocks <= theirs, so once written from their final tokens they are
exact, not approximate:

1. prefill: ``model(x[:, :s], cache=cache, write_positions=arange(s), block_size=b)`` (s = start of the
   first block with masks; a no-op when s = 0);
2. each step of block ``[s, e)``: ``logits, _ = model(x[:, s:e], cache=cache, write_positions=arange(s, e),
   block_size=b, key_mask=real)``: the rows equal the uncached forward's rows ``[s, e)`` over
   ``x[:, :e]``; the block's own slots are rewritten each step;
3. after the block's last commit, its final keys must be written once: either one more step-shaped
   forward over ``[s, e)`` (dInfer's "additional forward", ``generate_uniform.py``), or, equivalently,
   the next block's first forward run over ``[s, e + b)`` (the rows of block ``[s, e)`` see only blocks
   <= theirs, so their keys are the final ones and the new block's rows are exact in the same pass).

Batch rows may sit in different blocks (prompts of different lengths): ``write_positions`` is per row.
:func:`block_causal_mask` builds the same boolean mask for callers that want it explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import first_id
from .errors import CheckpointFormatError, UnsupportedArchitectureError
from .layers import Block, KVCache, MaskedDiffusionLM, RMSNorm, SelfAttention, SwiGLU, _rotate_half

LLADA2_MASK_TOKEN_ID = 156895
LLADA2_EOS_TOKEN_ID = 156892
LLADA2_VOCAB_SIZE = 157184
#: the block size LLaDA2.0 / 2.1 were trained with (dFactory's SFT recipe) and generate() defaults to
LLADA2_BLOCK_SIZE = 32

# option -> the only value implemented (the value of the released LLaDA2.0 / 2.1 checkpoints)
_FIXED = {"hidden_act": "silu", "norm_head": False, "use_bias": False, "score_function": "sigmoid",
          "router_dtype": "fp32", "norm_topk_prob": True, "use_sliding_window": False, "rope_scaling": None}


@dataclass(frozen=True)
class LLaDA2ArchConfig:
    """The subset of LLaDA2-MoE's ``config.json`` that determines the forward pass."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: Optional[int]  # the dense layers' SwiGLU width
    rotary_dim: int  # d_r = int(head_dim * partial_rotary_factor)
    num_experts: Optional[int] = None  # None: every layer dense
    num_experts_per_tok: int = 1
    n_group: int = 1
    topk_group: int = 1
    moe_intermediate_size: Optional[int] = None
    num_shared_experts: int = 0
    first_k_dense_replace: int = 0
    routed_scaling_factor: float = 1.0
    expert_bias: bool = True
    rope_theta: float = 600000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 16384
    use_qk_norm: bool = True
    use_qkv_bias: bool = False
    tie_word_embeddings: bool = False
    mask_token_id: int = LLADA2_MASK_TOKEN_ID
    eos_token_id: Optional[int] = LLADA2_EOS_TOKEN_ID
    pad_token_id: Optional[int] = None
    block_size: int = LLADA2_BLOCK_SIZE

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer`` is an MoE layer (the hub code's ``layer_idx >= first_k_dense_replace``)."""
        return self.num_experts is not None and layer >= self.first_k_dense_replace

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "LLaDA2ArchConfig":
        """Validate and convert a parsed LLaDA2-MoE ``config.json``."""
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            if config.get(key) is None:
                raise CheckpointFormatError(f"LLaDA2-MoE config.json lacks {key!r} (found keys: {sorted(config)})")
        for key, value in _FIXED.items():
            got = config.get(key, value)
            if got != value and not (key == "router_dtype" and got is None):
                raise UnsupportedArchitectureError(
                    f"LLaDA2-MoE config {key}={got!r} is not implemented; only {key}={value!r} "
                    f"(the released LLaDA2.0 / LLaDA2.1 checkpoints) is supported")
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        mask = config.get("mask_token_id")
        eos = first_id(config.get("eos_token_id"))
        return cls(hidden_size=hidden, num_hidden_layers=int(config["num_hidden_layers"]), num_attention_heads=heads,
                   num_key_value_heads=int(config.get("num_key_value_heads") or heads), head_dim=head_dim,
                   vocab_size=int(config["vocab_size"]), intermediate_size=_opt_int(config.get("intermediate_size")),
                   rotary_dim=_rotary_dim(config, head_dim), rope_theta=float(config.get("rope_theta", 10000.0)),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
                   max_position_embeddings=int(config.get("max_position_embeddings", 16384)),
                   use_qk_norm=bool(config.get("use_qk_norm", True)),
                   use_qkv_bias=bool(config.get("use_qkv_bias", False)),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   mask_token_id=LLADA2_MASK_TOKEN_ID if mask is None else int(mask),
                   eos_token_id=LLADA2_EOS_TOKEN_ID if eos is None else eos,
                   pad_token_id=first_id(config.get("pad_token_id")),
                   block_size=int(config.get("block_size") or LLADA2_BLOCK_SIZE), **_moe_fields(config))


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _rotary_dim(config: dict[str, Any], head_dim: int) -> int:
    """``int(head_dim * partial_rotary_factor)`` (the hub code's RoPE init); a ``rotary_dim`` key that
    disagrees (dFactory writes ``rotary_dim: 64``) is refused rather than silently ignored."""
    factor = float(config.get("partial_rotary_factor", 0.5))
    dim = int(head_dim * factor)
    if not 0 < dim <= head_dim or dim % 2:
        raise UnsupportedArchitectureError(
            f"LLaDA2-MoE config partial_rotary_factor={factor} gives a rotary dim of {dim} for head_dim={head_dim}; "
            f"it must be even and in (0, head_dim]")
    given = config.get("rotary_dim")
    if given is not None and int(given) != dim:
        raise UnsupportedArchitectureError(
            f"LLaDA2-MoE config rotary_dim={given} disagrees with head_dim * partial_rotary_factor = {dim}")
    return dim


def _moe_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The MoE part of the config, validated (group sizes, top-k, widths)."""
    experts = _opt_int(config.get("num_experts"))
    dense = int(config.get("first_k_dense_replace") or 0)
    layers = int(config["num_hidden_layers"])
    if (experts is None or dense > 0) and config.get("intermediate_size") is None:
        raise CheckpointFormatError("LLaDA2-MoE config.json has dense layers but no 'intermediate_size'")
    if experts is None or dense >= layers:
        return {"num_experts": experts, "first_k_dense_replace": dense}
    k = int(config.get("num_experts_per_tok") or 1)
    groups, keep = int(config.get("n_group") or 1), int(config.get("topk_group") or 1)
    width = config.get("moe_intermediate_size")
    problems = []
    if width is None:
        problems.append("'moe_intermediate_size' is missing")
    if experts % groups or experts // groups < 2:
        problems.append(f"num_experts={experts} must split into n_group={groups} groups of >= 2 experts "
                        f"(a group's score is the sum of its top-2)")
    elif not 1 <= keep <= groups or not 1 <= k <= keep * (experts // groups):
        problems.append(f"need 1 <= topk_group={keep} <= n_group={groups} and 1 <= num_experts_per_tok={k} <= "
                        f"topk_group * experts per group = {keep * (experts // groups)}")
    if problems:
        raise CheckpointFormatError("LLaDA2-MoE config.json: " + "; ".join(problems))
    return {"num_experts": experts, "first_k_dense_replace": dense, "num_experts_per_tok": k, "n_group": groups,
            "topk_group": keep, "moe_intermediate_size": int(width),
            "num_shared_experts": int(config.get("num_shared_experts") or 0),
            "routed_scaling_factor": float(config.get("routed_scaling_factor", 1.0)),
            "expert_bias": bool(config.get("moe_router_enable_expert_bias", True))}


# ---------------------------------------------------------------------------------- attention
def apply_partial_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on the first ``d_r`` dims of every head of ``x`` ``[B, H, T, D]`` (``cos, sin``: float32
    ``[B, T, d_r]``, rotate-half layout over those d_r dims), in ``x``'s dtype; dims ``d_r..D`` pass."""
    d_r = cos.shape[-1]
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    rot, rest = x[..., :d_r], x[..., d_r:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


class FusedQKVAttention(nn.Module):
    """LLaDA2's attention: fused ``qkv_proj`` split by heads into [H, H_kv, H_kv], per-head q/k RMSNorm,
    partial RoPE, GQA, ``o_proj``. Same call interface as :class:`~.layers.SelfAttention` (so
    :class:`~.layers.Block`'s plain and chunked forwards and the in-place cache work unchanged)."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, *, eps: float, qk_norm: bool,
                 qkv_bias: bool) -> None:
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"num_attention_heads={n_heads} must be a multiple of num_key_value_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.qkv_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias=qkv_bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)

    def _project(self, x: Tensor, first: int, heads: int) -> Tensor:
        """Heads ``first .. first + heads - 1`` of the fused projection of ``x`` ``[B, T, C]``: ``[B, heads, T, D]``
        (a row slice of the fused weight, so q is never computed where only k, v are needed)."""
        B, T, _ = x.shape
        rows = slice(first * self.head_dim, (first + heads) * self.head_dim)
        bias = None if self.qkv_proj.bias is None else self.qkv_proj.bias[rows]
        return F.linear(x, self.qkv_proj.weight[rows], bias).view(B, T, heads, self.head_dim).transpose(1, 2)

    def keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Normed, rotated keys and the values of the (normed) rows ``x``: ``[B, H_kv, T, D]`` each."""
        k = self._project(x, self.n_heads, self.n_kv_heads)
        v = self._project(x, self.n_heads + self.n_kv_heads, self.n_kv_heads)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_partial_rope(k, cos, sin), v

    def attend(self, x: Tensor, cos: Tensor, sin: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor]) -> Tensor:
        """``o_proj(softmax(q k^T / sqrt(D)) v)`` for the query rows ``x`` over ``k, v``."""
        B, T, _ = x.shape
        q = self._project(x, 0, self.n_heads)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_partial_rope(q, cos, sin)
        k, v = self.expand_heads(k), self.expand_heads(v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    expand_heads = SelfAttention.expand_heads
    forward = SelfAttention.forward


# ---------------------------------------------------------------------------------- MoE
def moe_route(logits: Tensor, expert_bias: Optional[Tensor], *, top_k: int, n_group: int, topk_group: int,
              scale: float) -> tuple[Tensor, Tensor]:
    """LLaDA2's router for router logits ``[N, E]``: ``(experts [N, k], weights [N, k] float32)``.

    ``s = sigmoid(logits)`` (float32); selection on ``s + expert_bias``: group score = sum of a group's
    top-2, the ``topk_group`` best groups kept (the hub code's ``group_limited_topk``), then top-k
    experts among them; weights = the chosen experts' unbiased ``s``, divided by their sum (+1e-20)
    when k > 1, times ``scale`` (``routed_scaling_factor``). The bias changes the choice, never the weight.
    """
    scores = torch.sigmoid(logits.float())
    biased = scores if expert_bias is None else scores + expert_bias.float()
    N, E = scores.shape
    group_scores = biased.view(N, n_group, E // n_group).topk(2, dim=-1).values.sum(dim=-1)
    groups = group_scores.topk(topk_group, dim=-1, sorted=False).indices
    keep = torch.zeros(N, n_group, dtype=torch.bool, device=logits.device).scatter_(1, groups, True)
    keep = keep[:, :, None].expand(N, n_group, E // n_group).reshape(N, E)
    experts = biased.masked_fill(~keep, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * scale


class Router(nn.Module):
    """The MoE gate: ``weight`` ``[E, C]`` and the selection-only ``expert_bias`` ``[E]`` (a buffer,
    stored in the checkpoint as the hub code's ``register_buffer``); both float32."""

    def __init__(self, d_model: int, n_experts: int, expert_bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, d_model, dtype=torch.float32))
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(n_experts, dtype=torch.float32))
        else:
            self.expert_bias = None

    def forward(self, h: Tensor) -> Tensor:
        """Router logits ``[N, E]`` in float32 for token rows ``h`` ``[N, C]``."""
        return F.linear(h.float(), self.weight.float())


class SparseMoE(nn.Module):
    """Routed experts (SwiGLU of ``moe_intermediate_size``) + the shared expert, per token.

    Tokens are independent (no capacity limit, no cross-token term), so a batch, its padding and any
    subset of rows route exactly as alone. Experts run batched: the (token, slot) pairs are sorted by
    expert and each expert with work runs once on its rows (one host sync per layer for the counts).
    """

    def __init__(self, cfg: LLaDA2ArchConfig) -> None:
        super().__init__()
        C, width = cfg.hidden_size, cfg.moe_intermediate_size
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.scale = cfg.routed_scaling_factor
        self.gate = Router(C, cfg.num_experts, cfg.expert_bias)
        self.experts = nn.ModuleList(SwiGLU(C, width) for _ in range(cfg.num_experts))
        shared = cfg.num_shared_experts
        self.shared_experts = SwiGLU(C, width * shared) if shared else None

    def route(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(experts [N, k], weights [N, k])`` for token rows ``h`` ``[N, C]`` (:func:`moe_route`)."""
        return moe_route(self.gate(h), self.gate.expert_bias, top_k=self.top_k, n_group=self.n_group,
                         topk_group=self.topk_group, scale=self.scale)

    def dispatch(self, h: Tensor, experts: Tensor, weights: Tensor) -> Tensor:
        """``sum_j weights[:, j] * expert_{experts[:, j]}(h)`` in float32, cast back to ``h``'s dtype."""
        N, K = experts.shape
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        src = order // K
        out = h.new_empty(N * K, h.shape[-1])
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = order[start:start + n]
                out.index_copy_(0, rows, self.experts[e](h.index_select(0, src[start:start + n])))
                start += n
        return (out.view(N, K, -1).float() * weights[..., None]).sum(dim=1).to(h.dtype)

    def forward(self, x: Tensor) -> Tensor:
        h = x.reshape(-1, x.shape[-1])
        y = self.dispatch(h, *self.route(h))
        if self.shared_experts is not None:
            y = y + self.shared_experts(h)
        return y.view(x.shape)


class LLaDA2Block(Block):
    """Pre-norm block ``x + attn(attn_norm(x))``, ``x + mlp(mlp_norm(x))`` with LLaDA2's attention and a
    dense SwiGLU (layers < ``first_k_dense_replace``) or :class:`SparseMoE`; forwards from :class:`Block`."""

    def __init__(self, cfg: LLaDA2ArchConfig, layer: int) -> None:
        nn.Module.__init__(self)
        C, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.attn_norm = RMSNorm(C, eps)
        self.attn = FusedQKVAttention(C, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, eps=eps,
                                      qk_norm=cfg.use_qk_norm, qkv_bias=cfg.use_qkv_bias)
        self.mlp_norm = RMSNorm(C, eps)
        self.mlp = SparseMoE(cfg) if cfg.is_sparse(layer) else SwiGLU(C, cfg.intermediate_size)


# ---------------------------------------------------------------------------------- the model
def block_causal_mask(query_positions: Tensor, key_positions: Tensor, block_size: int,
                      key_mask: Optional[Tensor] = None) -> Tensor:
    """Boolean ``[B, T, S]``: query at position ``p`` sees key at ``q`` iff ``q // b <= p // b``
    (``b = block_size``), and ``key_mask`` (``[B, S]`` or ``[B, T, S]``, True = real key) allows it.

    On a canvas of ``nb`` aligned blocks this is the reference's ``tril(ones(nb, nb))`` repeated by b
    in both dimensions."""
    if int(block_size) < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    qb = torch.div(query_positions, block_size, rounding_mode="floor")
    kb = torch.div(key_positions, block_size, rounding_mode="floor")
    mask = kb[:, None, :] <= qb[:, :, None]
    if key_mask is not None:
        mask = mask & (key_mask.bool()[:, None, :] if key_mask.dim() == 2 else key_mask.bool())
    return mask


_TO_CKPT = [  # our parameter name -> LLaDA2's (first match)
    (r"^embed\.", "model.word_embeddings."),
    (r"^layers\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^layers\.(\d+)\.attn\.qkv_proj\.", r"model.layers.\1.attention.query_key_value."),
    (r"^layers\.(\d+)\.attn\.q_norm\.", r"model.layers.\1.attention.query_layernorm."),
    (r"^layers\.(\d+)\.attn\.k_norm\.", r"model.layers.\1.attention.key_layernorm."),
    (r"^layers\.(\d+)\.attn\.o_proj\.", r"model.layers.\1.attention.dense."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^layers\.(\d+)\.mlp\.", r"model.layers.\1.mlp."),
    (r"^norm\.", "model.norm."),
    (r"^lm_head\.", "lm_head."),
]


class LLaDA2MoeModel(MaskedDiffusionLM):
    """LLaDA2-MoE's forward over our modules (see the module docstring for the block-causal interface).

    Attributes: ``config`` (:class:`LLaDA2ArchConfig`), ``vocab_size``, ``mask_token_id`` (156895 unless
    the config names one), ``eos_token_id`` (156892 unless ...), ``pad_token_id``, ``block_size`` (the
    trained block size, 32), ``block_causal = True``. Logits are unshifted: row ``i`` predicts token ``i``.
    """

    arch_key = "llada2_moe"
    arch_name = "LLaDA2-MoE"
    config_class = LLaDA2ArchConfig
    logits_shift = 0
    block_causal = True
    #: parameters kept float32 at any --dtype (the router; see :func:`~.checkpoint.load_weights`)
    float32_parameters = (r"\.mlp\.gate\.weight$", r"\.mlp\.gate\.expert_bias$")

    def __init__(self, config: LLaDA2ArchConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id, self.eos_token_id = config.mask_token_id, config.eos_token_id
        self.pad_token_id, self.block_size = config.pad_token_id, config.block_size
        self.vocab_size = config.vocab_size
        self.head_dim, self.rotary_dim, self.rope_theta = config.head_dim, config.rotary_dim, config.rope_theta
        self.tie_embeddings = config.tie_word_embeddings
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LLaDA2Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if self.tie_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: Tensor, *, block_size: Optional[int] = None, key_positions: Optional[Tensor] = None,
                key_mask: Optional[Tensor] = None, position_ids: Optional[Tensor] = None,
                cache: Optional[KVCache] = None, write_positions: Optional[Tensor] = None, ephemeral: int = 0,
                **kw: Any) -> tuple[Tensor, Optional[KVCache]]:
        """:meth:`MaskedDiffusionLM.forward`, block-causal when ``block_size`` is given (module docstring)."""
        if block_size is not None:
            key_mask = self._block_key_mask(input_ids, int(block_size), key_positions, key_mask, position_ids, cache,
                                            write_positions, ephemeral)
        elif key_positions is not None:
            raise ValueError("key_positions only has a meaning with block_size (the block-causal mask)")
        return super().forward(input_ids, key_mask=key_mask, position_ids=position_ids, cache=cache,
                               write_positions=write_positions, ephemeral=ephemeral, **kw)

    def _block_key_mask(self, input_ids: Tensor, block_size: int, key_positions: Optional[Tensor],
                        key_mask: Optional[Tensor], position_ids: Optional[Tensor], cache: Optional[KVCache],
                        write_positions: Optional[Tensor], ephemeral: int) -> Tensor:
        """The ``[B, T, S(+E)]`` key mask of a block-causal forward (see :func:`block_causal_mask`)."""
        B, T = input_ids.shape
        queries = position_ids if position_ids is not None else (
            write_positions if cache is not None else torch.arange(T, device=input_ids.device).expand(B, T))
        if queries is None:
            raise ValueError("with a cache, write_positions must be a [B, T] LongTensor of slots")
        if key_positions is None:
            key_positions = (queries if cache is None
                             else torch.arange(cache.length, device=input_ids.device).expand(B, -1))
        if ephemeral:
            key_positions = torch.cat([key_positions, queries[:, T - ephemeral:]], dim=1)
        if key_positions.shape[0] != B:
            raise ValueError(f"key_positions must be [B, S] with B = {B}, got {tuple(key_positions.shape)}")
        return block_causal_mask(queries, key_positions.to(queries.device), block_size, key_mask)

    def new_cache(self, batch_size: int, length: int, *, dtype: Optional[torch.dtype] = None,
                  device: "torch.device | str | None" = None) -> KVCache:
        """An empty (zero) :class:`KVCache` of ``length`` slots for the exact block cache (module docstring)."""
        shape = (int(batch_size), self.config.num_key_value_heads, int(length), self.head_dim)
        dtype, device = dtype or self.dtype, device or self.device
        n = len(self.layers)
        return KVCache([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)],
                       [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)])

    @staticmethod
    def checkpoint_name(name: str) -> str:
        for pattern, repl in _TO_CKPT:
            new, n = re.subn(pattern, repl, name)
            if n:
                return new
        raise KeyError(f"no LLaDA2-MoE checkpoint name for parameter {name!r}")
