"""LLaDA (Nie et al. 2025, "Large Language Diffusion Models"), the framework's own implementation.

LLaDA-8B is an OLMo-style Llama block stack (``block_type="llama"``) trained as a masked
diffusion model, so attention is bidirectional and hidden state ``i`` predicts token ``i`` (no
shift). Its hub code (``modeling_llada.py``: ``LLaDAModelLM`` -> ``.model`` ``LLaDAModel`` ->
``.transformer`` ModuleDict) predates transformers 5 and is not used here; only its checkpoint
is read. Checkpoint names -> modules of :class:`~.layers.MaskedDiffusionLM`:

==============================================  =====================================
``model.transformer.wte``                        ``embed`` (``embedding_size`` rows)
``model.transformer.blocks.N.attn_norm``         ``layers.N.attn_norm`` (RMS)
``model.transformer.blocks.N.{q,k,v}_proj``      ``layers.N.attn.{q,k,v}_proj``
``model.transformer.blocks.N.attn_out``          ``layers.N.attn.o_proj``
``model.transformer.blocks.N.ff_norm``           ``layers.N.mlp_norm``
``model.transformer.blocks.N.ff_proj``           ``layers.N.mlp.gate_proj`` (the SiLU branch)
``model.transformer.blocks.N.up_proj``           ``layers.N.mlp.up_proj``
``model.transformer.blocks.N.ff_out``            ``layers.N.mlp.down_proj``
``model.transformer.ln_f``                       ``norm``
``model.transformer.ff_out``                     ``lm_head`` (absent when ``weight_tying``)
==============================================  =====================================

Numerics follow the hub code: RMS norm in float32, RoPE (``rope_theta``) in float32 when
``rope_full_precision``, SDPA, GQA by repeating kv heads (``n_kv_heads``; ``multi_query_attention``
means one kv head). Config options that LLaDA's code supports but its released checkpoints do not
use (ALiBi, fused ``sequential`` blocks, q/k layer norm, ``scale_logits`` ...) raise
:class:`~.checkpoint.UnsupportedArchitectureError` naming the key.

LLaDA's remote code builds its padding bias from ``attention_mask`` but always uses positions
``0..L-1``; this module takes explicit ``position_ids`` (``attention_mask.cumsum(-1) - 1`` for
left-padded rows). Both give the same attention scores for real tokens because RoPE only sees
relative offsets, which a uniform left shift does not change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from .checkpoint import first_id
from .errors import CheckpointFormatError, UnsupportedArchitectureError
from .layers import MaskedDiffusionLM

LLADA_MASK_TOKEN_ID = 126336

# option -> the only value implemented (the value of GSAI-ML/LLaDA-8B-Base and -Instruct)
_FIXED = {"block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms", "rope": True, "alibi": False,
          "attention_layer_norm": False, "block_group_size": 1, "input_emb_norm": False, "scale_logits": False,
          "layer_norm_with_affine": True}


@dataclass(frozen=True)
class LLaDAArchConfig:
    """The subset of LLaDA's ``config.json`` that determines the forward pass."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    mlp_hidden_size: int
    vocab_size: int  # rows of ``wte`` = columns of the logits (``embedding_size`` or ``vocab_size``)
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    max_sequence_length: int = 4096
    include_bias: bool = False
    include_qkv_bias: bool = False
    bias_for_layer_norm: bool = False
    weight_tying: bool = False
    rope_full_precision: bool = True
    mask_token_id: int = LLADA_MASK_TOKEN_ID
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "LLaDAArchConfig":
        """Validate and convert a parsed LLaDA ``config.json``."""
        for key in ("d_model", "n_heads", "n_layers"):
            if config.get(key) is None:
                raise CheckpointFormatError(f"LLaDA config.json lacks {key!r} (found keys: {sorted(config)})")
        for key, value in _FIXED.items():
            if key in config and config[key] is not None and config[key] != value:
                raise UnsupportedArchitectureError(
                    f"LLaDA config {key}={config[key]!r} is not implemented; only {key}={value!r} "
                    f"(the released LLaDA-8B checkpoints) is supported")
        d_model, n_heads = int(config["d_model"]), int(config["n_heads"])
        if config.get("multi_query_attention"):
            n_kv = 1
        else:
            n_kv = int(config.get("n_kv_heads") or n_heads)
        mlp = config.get("mlp_hidden_size") or int(config.get("mlp_ratio", 4)) * d_model
        vocab = config.get("embedding_size") or config.get("vocab_size")
        if vocab is None:
            raise CheckpointFormatError("LLaDA config.json names neither 'embedding_size' nor 'vocab_size'")
        include_bias = bool(config.get("include_bias", False))
        norm_bias = config.get("bias_for_layer_norm")
        mask = config.get("mask_token_id")
        return cls(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, n_layers=int(config["n_layers"]),
                   mlp_hidden_size=int(mlp), vocab_size=int(vocab),
                   rope_theta=float(config.get("rope_theta", 10000.0)),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
                   max_sequence_length=int(config.get("max_sequence_length", 4096)),
                   include_bias=include_bias, include_qkv_bias=bool(config.get("include_qkv_bias", False)),
                   bias_for_layer_norm=include_bias if norm_bias is None else bool(norm_bias),
                   weight_tying=bool(config.get("weight_tying", False)),
                   rope_full_precision=bool(config.get("rope_full_precision", True)),
                   mask_token_id=LLADA_MASK_TOKEN_ID if mask is None else int(mask),
                   eos_token_id=first_id(config.get("eos_token_id")), pad_token_id=first_id(config.get("pad_token_id")))


_TO_CKPT = [  # our parameter name -> LLaDA's, applied in order (first match)
    (r"^embed\.", "model.transformer.wte."),
    (r"^layers\.(\d+)\.attn_norm\.", r"model.transformer.blocks.\1.attn_norm."),
    (r"^layers\.(\d+)\.attn\.([qkv])_proj\.", r"model.transformer.blocks.\1.\2_proj."),
    (r"^layers\.(\d+)\.attn\.o_proj\.", r"model.transformer.blocks.\1.attn_out."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"model.transformer.blocks.\1.ff_norm."),
    (r"^layers\.(\d+)\.mlp\.gate_proj\.", r"model.transformer.blocks.\1.ff_proj."),
    (r"^layers\.(\d+)\.mlp\.up_proj\.", r"model.transformer.blocks.\1.up_proj."),
    (r"^layers\.(\d+)\.mlp\.down_proj\.", r"model.transformer.blocks.\1.ff_out."),
    (r"^norm\.", "model.transformer.ln_f."),
    (r"^lm_head\.", "model.transformer.ff_out."),
]


class LLaDAModel(MaskedDiffusionLM):
    """LLaDA's forward over our modules; see :meth:`MaskedDiffusionLM.forward` for the arguments.

    Attributes: ``config`` (:class:`LLaDAArchConfig`), ``vocab_size``, ``mask_token_id`` (the
    config's ``mask_token_id``, else LLaDA's fixed 126336), ``eos_token_id``, ``pad_token_id``.
    Logits are unshifted: row ``i`` predicts token ``i``.
    """

    arch_key = "llada"
    arch_name = "LLaDA"
    config_class = LLaDAArchConfig
    logits_shift = 0

    def __init__(self, config: LLaDAArchConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id = config.mask_token_id
        self.eos_token_id = config.eos_token_id
        self.pad_token_id = config.pad_token_id
        self._build(vocab_size=config.vocab_size, d_model=config.d_model, n_layers=config.n_layers,
                    n_heads=config.n_heads, n_kv_heads=config.n_kv_heads, mlp_hidden=config.mlp_hidden_size,
                    eps=config.rms_norm_eps, rope_theta=config.rope_theta,
                    rope_full_precision=config.rope_full_precision,
                    qkv_bias=config.include_bias or config.include_qkv_bias, bias=config.include_bias,
                    norm_bias=config.bias_for_layer_norm, tie=config.weight_tying)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        for pattern, repl in _TO_CKPT:
            new, n = re.subn(pattern, repl, name)
            if n:
                return new
        raise KeyError(f"no LLaDA checkpoint name for parameter {name!r}")
