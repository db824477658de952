"""The denoiser protocol and the built-in tiny bidirectional masked denoiser.

Protocol (duck-typed): ``logits = denoiser(input_ids, attention_mask=None)`` with shape
``[B, L, V]``, attributes ``mask_token_id``, ``vocab_size`` and, where the model has them,
``eos_token_id`` and ``pad_token_id``. Hub models are wrapped by the adapters in
:mod:`framework.hub` so that the loop never sees their quirks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Denoiser(Protocol):
    mask_token_id: int
    vocab_size: int

    def __call__(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor: ...


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


@runtime_checkable
class Tokenizer(Protocol):
    """What the framework needs of a tokenizer (the task vocabulary or a Hugging Face one)."""

    mask_token_id: int
    eos_token_id: Optional[int]
    pad_token_id: Optional[int]
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: "list[int] | torch.Tensor", stop_at_eos: bool = True) -> str: ...


@dataclass
class LoadedModel:
    """A denoiser ready for decoding, with its tokenizer and provenance.

    Attributes:
        denoiser: follows the :class:`Denoiser` protocol.
        tokenizer: follows the :class:`Tokenizer` protocol.
        name: registered name or path it was loaded from.
        task: the task it was trained for (built-in tiny models), else ``None``.
        info: free-form provenance (checkpoint path, training accuracy, hub class, ...).
    """

    denoiser: object
    tokenizer: object
    name: str
    task: Optional[str] = None
    info: dict = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.info is None:
            self.info = {}
