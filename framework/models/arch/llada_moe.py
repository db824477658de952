"""LLaDA-MoE (inclusionAI, Zhu et al. 2025, "LLaDA-MoE: A Sparse MoE Diffusion Language Model"), the framework's own implementation.

LLaDA-MoE-7B-A1B is an OLMoE-style mixture-of-experts stack trained as a masked diffusion model
like LLaDA: bidirectional attention, no logit shift (hidden ``i`` predicts token ``i``), mask id
156895 (``mask_token_id`` when the config has one). Source: ``modeling_lladamoe.py`` /
``configuration_lladamoe.py`` (``ZHZisZZ/dllm`` ``dllm/pipelines/llada/models/``; the same module
as ``inclusionAI/dInfer`` ``tools/modeling_fused_lladamoe.py`` minus its fused block):

* attention: separate ``q_proj``/``k_proj``/``v_proj``/``o_proj`` (bias = ``attention_bias``, o too),
  ``head_dim = hidden_size / num_attention_heads``; when ``qk_layernorm``, RMS norm over each
  head's ``head_dim`` channels of q and k (weights ``[head_dim]``) BEFORE RoPE; optional
  ``clip_qkv`` clamp of q, k, v; RoPE on the first ``head_dim * partial_rotary_factor`` channels;
* per layer, ``moe_layer_freq[layer] == 0`` -> a dense SwiGLU of ``dense_intermediate_size``
  (``model.layers.N.mlp.{gate,up,down}_proj``), else the sparse block: router
  ``mlp.gate`` (no bias), ``softmax`` over ``num_experts`` in float32 (+ the ``mlp.expert_bias``
  buffer when ``moe_router_enable_expert_bias``), top ``num_experts_per_tok`` probabilities as
  weights, NOT renormalised (the module hard-codes ``norm_topk_prob = False``; the config's
  ``norm_topk_prob``, ``moe_router_score_function`` and ``routed_scaling_factor`` are never read by
  its forward, so they are ignored here too), experts ``mlp.experts.E.{gate,up,down}_proj`` of
  ``expert_intermediate_size``; plus, when ``shared_expert_intermediate_size`` is set, a shared
  expert ``model.layers.N.shared_expert.*`` added to the MoE output (MoE layers only);
* RMS norms ``input_layernorm`` / ``post_attention_layernorm`` / ``model.norm``, ``lm_head``
  (absent when ``tie_word_embeddings``).

``config.json``: the released hub configs say ``model_type "llada"`` with ``architectures
["LLaDAMoEModelLM"]`` (dInfer's config class has ``model_type = "llada"``; dllm asks users to edit
it to ``"lladamoe"``): both are detected as LLaDA-MoE, by the class name or the MoE keys.
dInfer's converted "fused" checkpoints (``mlp.w1`` / ``mlp.w2`` stacked experts) are a different
layout and are refused with the unexpected names. Our parameters: ``layers.N.mlp.shared.*`` ->
``model.layers.N.shared_expert.*``, the rest as in :mod:`.sdar`'s Qwen table.

Cache: LLaDA's (:meth:`.layers.MaskedDiffusionLM.forward`: refresh, Fast-dLLM prefix and dual
cache; cache modes ``"none"``, ``"prefix"``, ``"dual"``). The MoE is exact at any batch size:
routing is per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .checkpoint import first_id
from .errors import CheckpointFormatError, UnsupportedArchitectureError
from .layers import MaskedDiffusionLM, SwiGLU
from .sdar import QWEN_TO_CKPT, map_name, require, rope_theta_of
from .variants import HeadAttention, MoEFeedForward, VariantBlock, build_variant_lm

LLADA_MOE_MASK_TOKEN_ID = 156895
_TO_CKPT = [(r"^layers\.(\d+)\.mlp\.shared\.", r"model.layers.\1.shared_expert.")] + QWEN_TO_CKPT


@dataclass(frozen=True)
class LLaDAMoEArchConfig:
    """The subset of LLaDA-MoE's ``config.json`` that determines the forward pass."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    dense_intermediate_size: int
    expert_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    moe_layer_freq: tuple[int, ...]
    shared_expert_intermediate_size: Optional[int] = None
    qk_layernorm: bool = False
    clip_qkv: Optional[float] = None
    attention_bias: bool = False
    expert_bias: bool = False
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    mask_token_id: int = LLADA_MOE_MASK_TOKEN_ID
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "LLaDAMoEArchConfig":
        """Validate and convert a parsed LLaDA-MoE ``config.json``."""
        require(config, "LLaDA-MoE", ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                                      "expert_intermediate_size", "num_experts", "num_experts_per_tok"))
        layers = int(config["num_hidden_layers"])
        freq = _layer_freq(config.get("moe_layer_freq"), layers)
        dense = config.get("dense_intermediate_size")
        if any(f == 0 for f in freq) and (dense is None or int(dense) <= 0):
            raise CheckpointFormatError("LLaDA-MoE config has dense layers (moe_layer_freq 0) but no "
                                        f"dense_intermediate_size (got {dense!r})")
        factor = float(config.get("partial_rotary_factor") or 1.0)
        if not 0 < factor <= 1:
            raise UnsupportedArchitectureError(f"LLaDA-MoE partial_rotary_factor={factor} must be in (0, 1]")
        shared = config.get("shared_expert_intermediate_size")
        heads = int(config["num_attention_heads"])
        mask = first_id(config.get("mask_token_id"))
        return cls(hidden_size=int(config["hidden_size"]), num_hidden_layers=layers, num_attention_heads=heads,
                   num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                   vocab_size=int(config["vocab_size"]), dense_intermediate_size=int(dense or 0),
                   expert_intermediate_size=int(config["expert_intermediate_size"]),
                   num_experts=int(config["num_experts"]), num_experts_per_tok=int(config["num_experts_per_tok"]),
                   moe_layer_freq=freq, shared_expert_intermediate_size=int(shared) if shared else None,
                   qk_layernorm=bool(config.get("qk_layernorm")),
                   clip_qkv=None if config.get("clip_qkv") is None else float(config["clip_qkv"]),
                   attention_bias=bool(config.get("attention_bias", False)),
                   expert_bias=bool(config.get("moe_router_enable_expert_bias")),
                   rope_theta=rope_theta_of(config, "LLaDA-MoE", 10000.0), partial_rotary_factor=factor,
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
                   max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   mask_token_id=LLADA_MOE_MASK_TOKEN_ID if mask is None else mask,
                   eos_token_id=first_id(config.get("eos_token_id")), pad_token_id=first_id(config.get("pad_token_id")))


def _layer_freq(value: Any, layers: int) -> tuple[int, ...]:
    """``moe_layer_freq`` as one entry per layer (0 = dense, else MoE), as the module indexes it."""
    if not isinstance(value, (list, tuple)) or len(value) != layers:
        raise CheckpointFormatError(f"LLaDA-MoE config moe_layer_freq must list one entry per layer "
                                    f"({layers}; 0 = dense, 1 = MoE), got {value!r}")
    return tuple(int(v) for v in value)


class LLaDAMoEModel(MaskedDiffusionLM):
    """LLaDA-MoE's forward over our modules (see the module docstring and
    :meth:`.layers.MaskedDiffusionLM.forward`). Attributes: ``config``, ``mask_token_id``,
    ``eos_token_id``, ``pad_token_id``; ``logits_shift = 0``."""

    arch_key = "lladamoe"
    arch_name = "LLaDA-MoE"
    config_class = LLaDAMoEArchConfig
    logits_shift = 0
    cache_modes = ("none", "prefix", "dual")

    def __init__(self, config: LLaDAMoEArchConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id = config.mask_token_id
        self.eos_token_id = config.eos_token_id
        self.pad_token_id = config.pad_token_id
        c = config
        head_dim = c.hidden_size // c.num_attention_heads
        if head_dim * c.num_attention_heads != c.hidden_size:
            raise UnsupportedArchitectureError(f"LLaDA-MoE hidden_size={c.hidden_size} must divide into "
                                               f"num_attention_heads={c.num_attention_heads}")
        rotary = int(head_dim * c.partial_rotary_factor)
        blocks = [VariantBlock(c.hidden_size, HeadAttention(
            c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim, qkv_bias=c.attention_bias,
            out_bias=c.attention_bias, qk_norm=c.qk_layernorm, eps=c.rms_norm_eps, rotary_dim=rotary,
            clip_qkv=c.clip_qkv), self._mlp(freq), c.rms_norm_eps) for freq in c.moe_layer_freq]
        build_variant_lm(self, vocab_size=c.vocab_size, d_model=c.hidden_size, blocks=blocks, eps=c.rms_norm_eps,
                         rope_theta=c.rope_theta, rotary_dim=rotary, tie=c.tie_word_embeddings)

    def _mlp(self, freq: int):
        c = self.config
        if freq == 0:
            return SwiGLU(c.hidden_size, c.dense_intermediate_size)
        return MoEFeedForward(c.hidden_size, c.num_experts, c.num_experts_per_tok, c.expert_intermediate_size,
                              c.shared_expert_intermediate_size, c.expert_bias)

    def check_cache_mode(self, mode: str) -> None:
        """Refuse a cache mode other than LLaDA's."""
        if mode not in self.cache_modes:
            raise UnsupportedArchitectureError(f"LLaDA-MoE cache modes are {list(self.cache_modes)}, not {mode!r}")

    @staticmethod
    def checkpoint_name(name: str) -> str:
        return map_name(name, _TO_CKPT, "LLaDA-MoE")

