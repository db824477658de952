"""What the engine and the commands need of a model: the denoiser and tokenizer protocols and
:class:`LoadedModel` (a denoiser with its tokenizer and provenance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, runtime_checkable

import torch


@runtime_checkable
class Denoiser(Protocol):
    mask_token_id: int
    vocab_size: int

    def __call__(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor: ...


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
