"""The framework's own LLaDA, Dream, LLaDA2-MoE, SDAR, Fast-dLLM v2 and LLaDA-MoE implementations
(pure torch, no remote code; SDAR's and Fast-dLLM v2's block-causal base in :mod:`.block_causal`).

``load_architecture(folder, dtype=None, device=None)`` reads a checkpoint folder (``config.json``
+ safetensors, sharded safetensors, or ``pytorch_model.bin``), picks :class:`LLaDAModel`,
:class:`DreamModel` or :class:`LLaDA2MoeModel` from the config and loads the weights. They share one
forward (:meth:`layers.MaskedDiffusionLM.forward`): SDPA with a key padding mask, RoPE at explicit
positions, and an in-place :class:`KVCache` for Fast-dLLM-style prefix and dual caching; LLaDA2-MoE
adds the block-causal mask (``block_size=``) and the exact block cache (:mod:`.llada2`).
"""

from .block_causal import BlockCausalLM, block_columns, block_key_mask
from .checkpoint import detect_architecture, read_config
from .dream import DreamArchConfig, DreamModel, dream_query_window, dream_shift, dream_window_logits
from .errors import CheckpointFormatError, MissingCheckpointError, UnsupportedArchitectureError
from .fast_dllm_v2 import FAST_DLLM_V2_MASK_TOKEN_ID, FastDLLMv2ArchConfig, FastDLLMv2Model
from .layers import KVCache, MaskedDiffusionLM
from .llada import LLADA_MASK_TOKEN_ID, LLaDAArchConfig, LLaDAModel
from .llada2 import (
    LLADA2_BLOCK_SIZE,
    LLADA2_EOS_TOKEN_ID,
    LLADA2_MASK_TOKEN_ID,
    LLADA2_VOCAB_SIZE,
    LLaDA2ArchConfig,
    LLaDA2MoeModel,
    block_causal_mask,
    moe_route,
)
from .llada_moe import LLADA_MOE_MASK_TOKEN_ID, LLaDAMoEArchConfig, LLaDAMoEModel
from .loading import load_architecture
from .sdar import SDAR_MASK_TOKEN_ID, SDARArchConfig, SDARModel

__all__ = [
    "BlockCausalLM",
    "FAST_DLLM_V2_MASK_TOKEN_ID",
    "FastDLLMv2ArchConfig",
    "FastDLLMv2Model",
    "LLADA_MOE_MASK_TOKEN_ID",
    "LLaDAMoEArchConfig",
    "LLaDAMoEModel",
    "SDAR_MASK_TOKEN_ID",
    "SDARArchConfig",
    "SDARModel",
    "block_columns",
    "block_key_mask",
    "CheckpointFormatError",
    "DreamArchConfig",
    "DreamModel",
    "KVCache",
    "LLADA2_BLOCK_SIZE",
    "LLADA2_EOS_TOKEN_ID",
    "LLADA2_MASK_TOKEN_ID",
    "LLADA2_VOCAB_SIZE",
    "LLADA_MASK_TOKEN_ID",
    "LLaDA2ArchConfig",
    "LLaDA2MoeModel",
    "LLaDAArchConfig",
    "LLaDAModel",
    "MaskedDiffusionLM",
    "MissingCheckpointError",
    "UnsupportedArchitectureError",
    "block_causal_mask",
    "detect_architecture",
    "dream_query_window",
    "dream_shift",
    "dream_window_logits",
    "load_architecture",
    "moe_route",
    "read_config",
]
