"""Dream (Ye et al. 2025, "Dream 7B: Diffusion Large Language Models"), the framework's own implementation.

Dream-7B is Qwen2.5-7B (q/k/v with bias, ``o_proj`` without, GQA, SwiGLU, RMS norm, RoPE base
``rope_theta`` = 1e6) trained further as a masked diffusion model and run without a causal
mask. Because it starts from an autoregressive model, hidden state ``i`` predicts token ``i + 1``:
Dream's sampler shifts the logits, ``logits = cat([logits[:, :1], logits[:, :-1]], 1)``, so the
prediction for position ``p > 0`` comes from hidden state ``p - 1`` (and position 0 reuses its own).

Checkpoint names (``config.json`` ``model_type: "Dream"``, ``architectures: ["DreamModel"]``) ->
modules of :class:`~.layers.MaskedDiffusionLM`: ``model.embed_tokens`` -> ``embed``;
``model.layers.N.input_layernorm`` -> ``layers.N.attn_norm``; ``model.layers.N.self_attn.{q,k,v,o}
_proj`` -> ``layers.N.attn.{q,k,v,o}_proj``; ``model.layers.N.post_attention_layernorm`` ->
``layers.N.mlp_norm``; ``model.layers.N.mlp.{gate,up,down}_proj`` -> ``layers.N.mlp.*``;
``model.norm`` -> ``norm``; ``lm_head`` -> ``lm_head`` (absent when ``tie_word_embeddings``).

:class:`DreamModel` returns UNSHIFTED logits at its query rows, like the hub model. To get the
(shifted) prediction for a window ``[s, e)`` a caller needs the hidden states at ``[s-1, e-1)``:

* without a cache, run the whole sequence and ask ``output_positions = max(p - 1, 0)`` for ``p`` in
  ``[s, e)`` (no ``[B, L, V]`` tensor is built);
* with a cache, run the queries ``[s-1, e)`` (one extra row) and take rows ``0 .. e-s-1``; the row
  ``s-1`` is a committed token, so it is queried but NOT written back to the cache
  (``write_valid`` False), leaving its cached k/v as the last refresh made them.

:func:`dream_window_logits` does both. Deviation from Fast-dLLM: Fast-dLLM's Dream sampler
(``NVlabs/Fast-dLLM`` ``dream/model/generation_utils_block.py``) queries only ``[s, e)`` with the
cache and shifts inside that window, so its prediction for position ``s`` comes from hidden state
``s`` instead of ``s - 1``; it never uses that value, because its refresh step always commits
position ``s`` from the full, correctly shifted logits. Here the window is exact (one more query
row, no rule that position ``s`` must be committed at refresh); rows ``s+1 .. e-1`` equal
Fast-dLLM's. Fast-dLLM's Dream also ignores ``tok_idx`` when a cache is used (positions ``0..L-1``);
equal for unpadded rows, and for left-padded rows RoPE's relative offsets make it equal too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from .checkpoint import first_id
from .errors import CheckpointFormatError, UnsupportedArchitectureError
from .layers import KVCache, MaskedDiffusionLM


@dataclass(frozen=True)
class DreamArchConfig:
    """The subset of Dream's ``config.json`` that determines the forward pass."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 131072
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    mask_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "DreamArchConfig":
        """Validate and convert a parsed Dream ``config.json``."""
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            if config.get(key) is None:
                raise CheckpointFormatError(f"Dream config.json lacks {key!r} (found keys: {sorted(config)})")
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedArchitectureError(f"Dream config hidden_act={act!r} is not implemented; only 'silu'")
        theta = float(config.get("rope_theta", 1000000.0))
        rope = config.get("rope_parameters")
        if isinstance(rope, dict):  # transformers-5 style
            if rope.get("rope_type", "default") != "default":
                raise UnsupportedArchitectureError(f"Dream config rope_parameters={rope!r}: only the default RoPE")
            theta = float(rope.get("rope_theta", theta))
        if config.get("rope_scaling"):
            raise UnsupportedArchitectureError(
                f"Dream config rope_scaling={config['rope_scaling']!r} is not implemented; only rope_scaling=null")
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = config.get("head_dim")
        if head_dim is not None and int(head_dim) * heads != hidden:
            raise UnsupportedArchitectureError(
                f"Dream config head_dim={head_dim} != hidden_size / num_attention_heads = {hidden // heads}")

        return cls(hidden_size=hidden, intermediate_size=int(config["intermediate_size"]),
                   num_hidden_layers=int(config["num_hidden_layers"]), num_attention_heads=heads,
                   num_key_value_heads=int(config.get("num_key_value_heads") or heads),
                   vocab_size=int(config["vocab_size"]), rope_theta=theta,
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   max_position_embeddings=int(config.get("max_position_embeddings", 131072)),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                   attention_bias=bool(config.get("attention_bias", True)),
                   mask_token_id=first_id(config.get("mask_token_id")), eos_token_id=first_id(config.get("eos_token_id")),
                   pad_token_id=first_id(config.get("pad_token_id")), bos_token_id=first_id(config.get("bos_token_id")))


_TO_CKPT = [  # our parameter name -> Dream's (first match)
    (r"^embed\.", "model.embed_tokens."),
    (r"^layers\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^layers\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
    (r"^layers\.(\d+)\.mlp_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^layers\.(\d+)\.mlp\.", r"model.layers.\1.mlp."),
    (r"^norm\.", "model.norm."),
    (r"^lm_head\.", "lm_head."),
]


class DreamModel(MaskedDiffusionLM):
    """Dream's forward over our modules; see :meth:`MaskedDiffusionLM.forward` for the arguments.

    Attributes: ``config`` (:class:`DreamArchConfig`), ``vocab_size``, ``mask_token_id`` (the
    config's, ``None`` if it has none), ``eos_token_id``, ``pad_token_id``; ``logits_shift = 1``:
    the returned logits are unshifted (row ``i`` predicts token ``i + 1``), see
    :func:`dream_window_logits`.
    """

    arch_key = "dream"
    arch_name = "Dream"
    config_class = DreamArchConfig
    logits_shift = 1

    def __init__(self, config: DreamArchConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id = config.mask_token_id
        self.eos_token_id = config.eos_token_id
        self.pad_token_id = config.pad_token_id
        self._build(vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
                    n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads,
                    mlp_hidden=config.intermediate_size, eps=config.rms_norm_eps, rope_theta=config.rope_theta,
                    rope_full_precision=False, qkv_bias=config.attention_bias, bias=False, norm_bias=False,
                    tie=config.tie_word_embeddings)

    @staticmethod
    def checkpoint_name(name: str) -> str:
        for pattern, repl in _TO_CKPT:
            new, n = re.subn(pattern, repl, name)
            if n:
                return new
        raise KeyError(f"no Dream checkpoint name for parameter {name!r}")


def dream_shift(logits: Tensor) -> Tensor:
    """Dream's shift of full-sequence logits ``[B, L, V]``: ``cat([logits[:, :1], logits[:, :-1]], 1)``."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def dream_query_window(start: int, end: int, query_end: Optional[int] = None) -> tuple[int, int, Tensor]:
    """``(q0, q1, rows)`` for shifted logits of positions ``[start, end)``: run the queries
    ``[q0, q1)`` (``q0 = max(start - 1, 0)``, ``q1 = query_end or end``) and read the rows ``rows``
    (1-D, relative to ``q0``): row of position ``p`` is ``max(p - 1, 0) - q0``."""
    if not 0 <= start < end:
        raise ValueError(f"need 0 <= start < end, got start={start}, end={end}")
    q0 = max(start - 1, 0)
    q1 = end if query_end is None else int(query_end)
    if q1 < end:
        raise ValueError(f"query_end={q1} must be >= end={end}")
    return q0, q1, (torch.arange(start, end) - 1).clamp(min=0) - q0


def dream_window_logits(model: DreamModel, x: Tensor, start: int, end: int, *, position_ids: Optional[Tensor] = None,
                        key_mask: Optional[Tensor] = None, cache: Optional[KVCache] = None,
                        query_end: Optional[int] = None, write_prev: bool = False) -> Tensor:
    """Dream's shifted logits ``[B, end - start, V]`` for positions ``[start, end)`` of ``x`` ``[B, L]``.

    ``position_ids`` and ``key_mask`` are full-length ``[B, L]`` (``L`` = the cache length when a
    cache is given). Without ``cache``: one forward over ``x``, LM head on the ``end - start``
    source rows only. With ``cache`` (``L`` slots, e.g. from a refresh ``model(x, use_cache=True)``):
    queries ``x[:, q0:q1]`` (``q1 = query_end or end``: ``end`` for the dual cache, ``L`` for the
    prefix cache) are written at slots ``q0 .. q1-1``, except slot ``start - 1`` unless
    ``write_prev`` (see the module docstring).
    """
    B = x.shape[0]
    q0, q1, rows = dream_query_window(start, end, query_end)
    rows = rows.to(x.device).expand(B, -1)
    if cache is None:
        logits, _ = model(x, position_ids=position_ids, key_mask=key_mask, output_positions=rows + q0)
        return logits
    slots = torch.arange(q0, q1, device=x.device).expand(B, -1)
    valid = None
    if start > 0 and not write_prev:
        valid = torch.ones(B, q1 - q0, dtype=torch.bool, device=x.device)
        valid[:, 0] = False
    pos = None if position_ids is None else position_ids[:, q0:q1]
    logits, _ = model(x[:, q0:q1], position_ids=pos, key_mask=key_mask, cache=cache, write_positions=slots,
                      write_valid=valid, output_positions=rows)
    return logits
