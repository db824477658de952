"""The framework's own LLaDA and Dream implementations (pure torch, no remote code).

``load_architecture(folder, dtype=None, device=None)`` reads a checkpoint folder (``config.json``
+ safetensors, sharded safetensors, or ``pytorch_model.bin``), picks :class:`LLaDAModel` or
:class:`DreamModel` from the config and loads the weights. Both models share one forward
(:meth:`layers.MaskedDiffusionLM.forward`): SDPA with a key padding mask, RoPE at explicit
positions, and an in-place :class:`KVCache` for Fast-dLLM-style prefix and dual caching.
"""

from .checkpoint import detect_architecture, read_config
from .dream import DreamArchConfig, DreamModel, dream_query_window, dream_shift, dream_window_logits
from .errors import CheckpointFormatError, MissingCheckpointError, UnsupportedArchitectureError
from .layers import KVCache, MaskedDiffusionLM
from .llada import LLADA_MASK_TOKEN_ID, LLaDAArchConfig, LLaDAModel
from .loading import load_architecture

__all__ = [
    "CheckpointFormatError",
    "DreamArchConfig",
    "DreamModel",
    "KVCache",
    "LLADA_MASK_TOKEN_ID",
    "LLaDAArchConfig",
    "LLaDAModel",
    "MaskedDiffusionLM",
    "MissingCheckpointError",
    "UnsupportedArchitectureError",
    "detect_architecture",
    "dream_query_window",
    "dream_shift",
    "dream_window_logits",
    "load_architecture",
    "read_config",
]
