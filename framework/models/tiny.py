"""The built-in tiny bidirectional masked denoiser (MDLM/LLaDA-style Transformer encoder) and its
size presets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

#: architecture presets of :class:`TinyDenoiser` (``adec train-denoiser --size``)
MODEL_SIZES: dict[str, dict] = {
    "tiny": dict(d_model=32, n_layers=2, n_heads=2, d_ff=64),  # tests: trains in seconds
    "small": dict(d_model=96, n_layers=4, n_heads=4, d_ff=384),  # the built-in models (~0.45M)
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

    def to_dict(self) -> dict:
        return asdict(self)


class TinyDenoiser(nn.Module):
    """A small bidirectional Transformer that predicts every position's token (no time input,
    as in LLaDA: the masks themselves tell the model how far decoding has come)."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        self.mask_token_id = config.mask_token_id
        self.pad_token_id = config.pad_token_id
        self.eos_token_id = config.eos_token_id
        self.vocab_size = config.vocab_size
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_len, config.d_model)
        layer = nn.TransformerEncoderLayer(
            config.d_model, config.n_heads, config.d_ff, config.dropout,
            batch_first=True, norm_first=True, activation="gelu",
        )
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)
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
        b, l = input_ids.shape
        if l > self.config.max_len:
            raise ValueError(
                f"sequence of {l} tokens is longer than the model's context max_len={self.config.max_len}"
            )
        pos = torch.arange(l, device=input_ids.device)
        h = self.tok(input_ids) + self.pos(pos)[None]
        pad_mask = None if attention_mask is None else attention_mask == 0
        h = self.encoder(h, src_key_padding_mask=pad_mask)
        return self.head(self.norm(h))
