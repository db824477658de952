"""The built-in tiny bidirectional masked denoiser (MDLM/LLaDA-style Transformer encoder) and its
size presets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from adaptive_decoding.framework.models.arch.layers import KVCache, check_ephemeral
from adaptive_decoding.framework.models.structure import structure_mask
from adaptive_decoding.framework.models.windowed import WindowedDenoiser

#: architecture presets of :class:`TinyDenoiser` (``adec train-denoiser --size``)
MODEL_SIZES: dict[str, dict] = {
    "tiny": dict(d_model=32, n_layers=2, n_heads=2, d_ff=64),  # tests: trains in seconds
    "small": dict(d_model=96, n_layers=4, n_heads=4, d_ff=384),  # the built-in models (~0.45M)
    "medium": dict(d_model=128, n_layers=4, n_heads=4, d_ff=512),  # ~0.83M, 9x9 Sudoku
    "base": dict(d_model=192, n_layers=6, n_heads=6, d_ff=768),  # ~2.7M, for harder task variants
}


@dataclass
class TinyConfig:
    """Size of :class:`TinyDenoiser` (an MDLM/LLaDA-style bidirectional Transformer encoder)."""

    vocab_size: int
    mask_token_id: int
    pad_token_id: int
    eos_token_id: Optional[int] = None
    max_len: int = 64
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.0
    #: structured attention (:mod:`adaptive_decoding.framework.models.structure`), ``None`` = full attention
    structure: Optional[dict] = None
    #: block diffusion (LLaDA2.x / SDAR layout): canvas blocks ``[i·b, (i+1)·b)`` attend to blocks ``≤ i``;
    #: ``None`` = bidirectional over the whole canvas
    block_size: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)


class TinyDenoiser(WindowedDenoiser, nn.Module):
    """A small bidirectional Transformer that predicts every position's token (no time input,
    as in LLaDA: the masks themselves tell the model how far decoding has come). With
    ``config.block_size`` b it is a block-diffusion model: block-causal over canvas blocks of b
    (:meth:`WindowedDenoiser.key_mask`), decoded one block at a time like LLaDA2.x and SDAR."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id = config.mask_token_id
        self.pad_token_id = config.pad_token_id
        self.eos_token_id = config.eos_token_id
        self.vocab_size = config.vocab_size
        if config.block_size is not None and int(config.block_size) < 1:
            raise ValueError(f"TinyConfig.block_size={config.block_size!r}; allowed: a positive block size or None")
        self.block_size = None if config.block_size is None else int(config.block_size)
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_len, config.d_model)
        layer = nn.TransformerEncoderLayer(
            config.d_model, config.n_heads, config.d_ff, config.dropout,
            batch_first=True, norm_first=True, activation="gelu",
        )
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)
        allowed = structure_mask(config.structure, config.max_len)
        self.register_buffer("allowed", allowed, persistent=False)  # not in the state dict
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits ``[B, L, V]`` of every position (``attention_mask`` 1 = real token, 0 = padding)."""
        return self.full_logits(input_ids, attention_mask)

    def _attention_mask(self, b: int, position_ids: torch.Tensor, key_mask: Optional[torch.Tensor],
                        cache: Optional[KVCache], e: int) -> Optional[torch.Tensor]:
        """The boolean attention mask ``[B, 1, T, S]`` (or ``None``: attend everywhere): ``key_mask``
        (``[B, S]``, or ``[B, T, S]`` per query for the shadow block) and the structured attention
        of the canvas positions of query and key, when the model has one."""
        t = position_ids.shape[1]
        mask = None
        if key_mask is not None:
            km = key_mask.bool()
            km = km | ~km.any(-1, keepdim=True)  # a query with no real key stays finite
            mask = km[:, None, None, :] if km.dim() == 2 else km[:, None]
        if self.allowed is not None:  # structured attention, by canvas position of query and key
            n_keys = cache.length if cache is not None else t
            key_pos = (torch.arange(n_keys, device=position_ids.device).expand(b, n_keys) if cache is not None
                       else position_ids)
            if e:
                key_pos = torch.cat([key_pos, position_ids[:, t - e:]], dim=1)
            allowed = self.allowed[position_ids[:, :, None], key_pos[:, None, :]][:, None]  # [B, 1, T, S]
            mask = allowed if mask is None else mask & allowed
        return mask

    def core(self, input_ids: torch.Tensor, *, position_ids: Optional[torch.Tensor] = None,
             key_mask: Optional[torch.Tensor] = None, cache: Optional[KVCache] = None,
             write_positions: Optional[torch.Tensor] = None, write_valid: Optional[torch.Tensor] = None,
             output_positions: Optional[torch.Tensor] = None, use_cache: bool = False, ephemeral: int = 0,
             ) -> tuple[torch.Tensor, Optional[KVCache]]:
        """The encoder as :class:`~adaptive_decoding.framework.models.windowed.WindowedDenoiser` needs it.

        The same parameters and arithmetic as ``nn.TransformerEncoderLayer(norm_first=True,
        activation="gelu")`` (so saved models load unchanged), written out so that keys and values
        can come from a :class:`KVCache`: queries ``input_ids`` ``[B, T]`` at ``position_ids``; with
        ``cache`` their keys/values are written at ``write_positions`` and they attend over all
        cached columns masked by ``key_mask``; the head runs only at ``output_positions``. The last
        ``ephemeral`` queries are keys of this forward only (see the LLaDA/Dream core's ``forward``).
        """
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = (write_positions if cache is not None
                            else torch.arange(t, device=input_ids.device).expand(b, t))
        if int(position_ids.max()) >= self.config.max_len:
            raise ValueError(
                f"sequence of {int(position_ids.max()) + 1} tokens is longer than the model's context "
                f"max_len={self.config.max_len}"
            )
        e = check_ephemeral(ephemeral, cache, write_valid, t)
        mask = self._attention_mask(b, position_ids, key_mask, cache, e)
        write_rows = None
        if cache is not None and write_valid is not None:
            write_rows = write_valid.bool().nonzero(as_tuple=True)
            write_positions = write_positions[write_rows]
        h = self.tok(input_ids) + self.pos(position_ids)
        keys, values = [], []
        nh = self.config.n_heads
        for i, layer in enumerate(self.encoder.layers):
            attn = layer.self_attn
            q, k, v = F.linear(layer.norm1(h), attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
            q, k, v = (z.view(b, t, nh, -1).transpose(1, 2) for z in (q, k, v))
            if cache is not None:
                k, v = cache.write(i, k, v, write_positions, write_rows, e)
            elif use_cache:
                keys.append(k)
                values.append(v)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               dropout_p=attn.dropout if self.training else 0.0)
            h = h + layer.dropout1(attn.out_proj(a.transpose(1, 2).reshape(b, t, -1)))
            h = h + layer._ff_block(layer.norm2(h))
        if output_positions is not None:
            h = h.gather(1, output_positions[..., None].expand(-1, -1, h.shape[-1]))
        logits = self.head(self.norm(h))
        if cache is not None:
            return logits, cache
        return logits, (KVCache(keys, values) if use_cache else None)
