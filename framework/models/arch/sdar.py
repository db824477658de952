"""SDAR (JetAstra, "SDAR: a synergistic diffusion-autoregression paradigm"), the framework's own implementation.

SDAR is Qwen3 trained as a block-diffusion model (``JetAstra/SDAR``
``training/model/SDAR-4B-Chat/modeling_sdar.py``, "modified based on transformers v4.52.4
modeling_qwen3.py"): q/k/v/o without biases (``attention_bias`` false), an explicit
``head_dim`` (128; SDAR-4B has hidden 2560 = 32 heads x 80, so ``H * D != C``), per-head RMS
norm of queries and keys (``self_attn.q_norm`` / ``k_norm``, weight ``[head_dim]``) before full
RoPE (``rope_theta`` 1e6), SwiGLU, RMS norm, an untied ``lm_head`` (``tie_word_embeddings``
false in the 4B/8B configs; honoured when true). No logit shift: hidden state ``i`` predicts
token ``i`` (the sampler uses ``logits`` as they come). ``config.json``: ``model_type "sdar"``,
``architectures ["SDARForCausalLM"]``, ``block_size`` (4 in the published configs; checkpoints
exist per block size), ``mask_token_id`` 151669 (``<|MASK|>``).

Checkpoint names -> modules: ``model.embed_tokens`` -> ``embed``; ``model.layers.N.input_layernorm``
-> ``layers.N.attn_norm``; ``model.layers.N.self_attn.{q,k,v,o}_proj`` / ``{q,k}_norm`` ->
``layers.N.attn.*``; ``model.layers.N.post_attention_layernorm`` -> ``layers.N.mlp_norm``;
``model.layers.N.mlp.{gate,up,down}_proj`` -> ``layers.N.mlp.*``; ``model.norm`` -> ``norm``;
``lm_head`` -> ``lm_head``.

Attention at inference (``SDARAttention.forward``, not training): ``block_diffusion_generate``
passes a 0/1 ``[1, L, L]`` block-lower-triangular mask, cast to bool for SDPA, positions
``arange``; keys/values go to a ``DynamicCache`` only when ``store_kv=True``, otherwise the
cached ones are concatenated in front of the query block's. :class:`SDARModel` is a
:class:`~.block_causal.BlockCausalLM`: see that module for the mask, padding and the exact cache
of completed blocks (cache modes ``"none"`` and ``"block"``). Numerics: the published RMS norm is
flash-attn's Triton ``rms_norm_fn`` (weight applied in float32, then cast); this module casts
before the weight (Qwen3's torch order, kept as a comment in the file). Equal in float32; in
bfloat16 a last-bit difference per norm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from .block_causal import BlockCausalLM
from .checkpoint import first_id
from .errors import CheckpointFormatError, UnsupportedArchitectureError
from .layers import SwiGLU
from .variants import HeadAttention, VariantBlock, build_variant_lm

SDAR_MASK_TOKEN_ID = 151669


def rope_theta_of(config: dict[str, Any], name: str, default: float) -> float:
    """``rope_theta`` of a Qwen-style config; refuses RoPE scaling (not implemented)."""
    theta = float(config.get("rope_theta", default))
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if rope.get("rope_type", "default") != "default":
            raise UnsupportedArchitectureError(f"{name} config rope_parameters={rope!r}: only the default RoPE")
        theta = float(rope.get("rope_theta", theta))
    if config.get("rope_scaling"):
        raise UnsupportedArchitectureError(
            f"{name} config rope_scaling={config['rope_scaling']!r} is not implemented; only rope_scaling=null")
    return theta


def require(config: dict[str, Any], name: str, keys: tuple[str, ...]) -> None:
    """Raise a :class:`CheckpointFormatError` naming the first of ``keys`` the config lacks."""
    for key in keys:
        if config.get(key) is None:
            raise CheckpointFormatError(f"{name} config.json lacks {key!r} (found keys: {sorted(config)})")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedArchitectureError(f"{name} config hidden_act={act!r} is not implemented; only 'silu'")
    if config.get("use_sliding_window"):
        raise UnsupportedArchitectureError(f"{name} config use_sliding_window=true is not implemented")


@dataclass(frozen=True)
class SDARArchConfig:
    """The subset of SDAR's ``config.json`` that determines the forward pass."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mask_token_id: int = SDAR_MASK_TOKEN_ID
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "SDARArchConfig":
        """Validate and convert a parsed SDAR ``config.json``."""
        require(config, "SDAR", ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "vocab_size", "block_size"))
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        mask = first_id(config.get("mask_token_id"))
        return cls(hidden_size=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]),
                   num_hidden_layers=int(config["num_hidden_layers"]), num_attention_heads=heads,
                   num_key_value_heads=int(config.get("num_key_value_heads") or heads), head_dim=head_dim,
                   vocab_size=int(config["vocab_size"]), block_size=int(config["block_size"]),
                   rope_theta=rope_theta_of(config, "SDAR", 1000000.0),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   attention_bias=bool(config.get("attention_bias", False)),
                   mask_token_id=SDAR_MASK_TOKEN_ID if mask is None else mask,
                   eos_token_id=first_id(config.get("eos_token_id")), pad_token_id=first_id(config.get("pad_token_id")))


QWEN_TO_CKPT = [  # our parameter name -> the Qwen2/Qwen3 checkpoint name (first match)
    (r"^embed\.", "model.embed_tokens."),
    (r"^layers\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^layers\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^layers\.(\d+)\.mlp\.", r"model.layers.\1.mlp."),
    (r"^norm\.", "model.norm."),
    (r"^lm_head\.", "lm_head."),
]


def map_name(name: str, table: list[tuple[str, str]], arch: str) -> str:
    """Our parameter ``name`` renamed by the first matching rule of ``table``."""
    for pattern, repl in table:
        new, n = re.subn(pattern, repl, name)
        if n:
            return new
    raise KeyError(f"no {arch} checkpoint name for parameter {name!r}")


class SDARModel(BlockCausalLM):
    """SDAR's forward over our modules (see the module docstring; the forward and cache protocol
    are :class:`~.block_causal.BlockCausalLM`'s). Attributes: ``config``, ``block_size``,
    ``mask_token_id`` (151669 unless the config says otherwise), ``eos_token_id``,
    ``pad_token_id``; ``logits_shift = 0``."""

    arch_key = "sdar"
    arch_name = "SDAR"
    config_class = SDARArchConfig
    logits_shift = 0

    def __init__(self, config: SDARArchConfig) -> None:
        super().__init__()
        self.config = config
        self.block_size = config.block_size
        self.mask_token_id = config.mask_token_id
        self.eos_token_id = config.eos_token_id
        self.pad_token_id = config.pad_token_id
        c = config
        blocks = [VariantBlock(c.hidden_size, HeadAttention(
            c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, qkv_bias=c.attention_bias,
            out_bias=c.attention_bias, qk_norm=True, eps=c.rms_norm_eps),
            SwiGLU(c.hidden_size, c.intermediate_size), c.rms_norm_eps) for _ in range(c.num_hidden_layers)]
        build_variant_lm(self, vocab_size=c.vocab_size, d_model=c.hidden_size, blocks=blocks, eps=c.rms_norm_eps,
                         rope_theta=c.rope_theta, rotary_dim=c.head_dim, tie=c.tie_word_embeddings)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        return map_name(name, QWEN_TO_CKPT, "SDAR")
