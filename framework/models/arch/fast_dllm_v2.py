"""Fast-dLLM v2 (NVlabs, Wu et al. 2025, "Fast-dLLM v2: Efficient Block-Diffusion LLM"), the framework's own implementation.

Fast-dLLM v2 is Qwen2.5 (1.5B / 7B Instruct) fine-tuned as a block-diffusion model; its hub code
is ``modeling.py`` + ``configuration.py`` of ``Efficient-Large-Model/Fast_dLLM_v2_{1.5B,7B}``
(copies in forks of ``NVlabs/Fast-dLLM``, e.g. ``v2/modeling_ori.py``; the sampler
``v2/generation_functions.py`` is in NVlabs/Fast-dLLM itself). Qwen2 body: q/k/v WITH bias (hard-
coded ``bias=True``), ``o_proj`` without, GQA, no query/key norm, full RoPE, SwiGLU, RMS norm;
``lm_head`` tied to the embedding when ``tie_word_embeddings`` (1.5B, as Qwen2.5-1.5B). ``config.json``:
``model_type "Fast_dLLM_Qwen"``, ``architectures ["Fast_dLLM_QwenForCausalLM"]``, ``bd_size`` (the
training block, 32); the mask id 151665 is not in the config (the sampler's default
``mask_id=151665``, the tokenizer's ``|<MASK>|``).

**Token shift**: hidden state ``i`` predicts token ``i + 1`` (the AR base is kept): the sampler
takes ``logits = cat([logits[:, :1], logits[:, :-1]], 1)`` over the current block's window, and
the first token of every block is the argmax of the last row of the forward that stored the
previous block. :class:`FastDLLMv2Model` returns UNSHIFTED logits and says so with
``logits_shift = 1``, exactly like :class:`~.dream.DreamModel`, so the engine's shift (the logits
of column ``c`` come from hidden row ``c - 1``) applies unchanged. Under the block cache, query
``[s - 1, e)`` with ``write_valid`` False at ``s - 1`` to get block ``[s, e)``'s shifted logits
(see :mod:`.block_causal`).

Attention at inference: ``Fast_dLLM_QwenModel.eval_mask`` — query ``i`` (at ``cache_len + i``)
sees key ``j`` iff ``j // block_size <= (cache_len + i) // block_size``, positions ``arange``,
no padding support; completed blocks are appended to a ``DynamicCache``
(``update_past_key_values=True``). :class:`FastDLLMv2Model` is a
:class:`~.block_causal.BlockCausalLM` with ``block_size = bd_size`` (mask, padding and the exact
completed-block cache there; cache modes ``"none"`` and ``"block"``). Fast-dLLM v2's sub-block
cache (``use_block_cache``: a sub-block run alone against the block's keys/values frozen at the last
whole-block forward) is an approximation: not a cache mode of the model, but the loop option
``sub_block_cache`` on top of ``"block"``, off by default (:mod:`adaptive_decoding.framework.engine.denoise`). Checkpoint names are Qwen2's (see :mod:`.sdar`'s
table, without ``q_norm``/``k_norm``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .block_causal import BlockCausalLM
from .checkpoint import first_id
from .layers import SwiGLU
from .sdar import QWEN_TO_CKPT, map_name, require, rope_theta_of
from .variants import HeadAttention, VariantBlock, build_variant_lm

FAST_DLLM_V2_MASK_TOKEN_ID = 151665


@dataclass(frozen=True)
class FastDLLMv2ArchConfig:
    """The subset of Fast-dLLM v2's ``config.json`` that determines the forward pass."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    bd_size: int = 32
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    head_dim: Optional[int] = None
    mask_token_id: int = FAST_DLLM_V2_MASK_TOKEN_ID
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "FastDLLMv2ArchConfig":
        """Validate and convert a parsed Fast-dLLM v2 ``config.json`` (``bd_size`` defaults to 32, as
        ``Fast_dLLM_QwenConfig`` does)."""
        require(config, "Fast-dLLM v2", ("hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "vocab_size"))
        heads = int(config["num_attention_heads"])
        mask = first_id(config.get("mask_token_id"))
        return cls(hidden_size=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]),
                   num_hidden_layers=int(config["num_hidden_layers"]), num_attention_heads=heads,
                   num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                   vocab_size=int(config["vocab_size"]), bd_size=int(config.get("bd_size") or 32),
                   rope_theta=rope_theta_of(config, "Fast-dLLM v2", 10000.0),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   head_dim=None if config.get("head_dim") is None else int(config["head_dim"]),
                   mask_token_id=FAST_DLLM_V2_MASK_TOKEN_ID if mask is None else mask,
                   eos_token_id=first_id(config.get("eos_token_id")), pad_token_id=first_id(config.get("pad_token_id")))


class FastDLLMv2Model(BlockCausalLM):
    """Fast-dLLM v2's forward over our modules (see the module docstring). Attributes: ``config``,
    ``block_size`` (= ``bd_size``), ``mask_token_id`` (151665), ``eos_token_id``, ``pad_token_id``;
    ``logits_shift = 1`` (row ``i`` predicts token ``i + 1``)."""

    arch_key = "fast_dllm_qwen"
    arch_name = "Fast-dLLM v2"
    config_class = FastDLLMv2ArchConfig
    logits_shift = 1

    def __init__(self, config: FastDLLMv2ArchConfig) -> None:
        super().__init__()
        self.config = config
        self.block_size = config.bd_size
        self.mask_token_id = config.mask_token_id
        self.eos_token_id = config.eos_token_id
        self.pad_token_id = config.pad_token_id
        c = config
        head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
        blocks = [VariantBlock(c.hidden_size, HeadAttention(
            c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim, qkv_bias=True, out_bias=False,
            qk_norm=False, eps=c.rms_norm_eps), SwiGLU(c.hidden_size, c.intermediate_size), c.rms_norm_eps)
            for _ in range(c.num_hidden_layers)]
        build_variant_lm(self, vocab_size=c.vocab_size, d_model=c.hidden_size, blocks=blocks, eps=c.rms_norm_eps,
                         rope_theta=c.rope_theta, rotary_dim=head_dim, tie=c.tie_word_embeddings)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        return map_name(name, QWEN_TO_CKPT, "Fast-dLLM v2")
