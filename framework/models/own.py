"""A LLaDA or Dream checkpoint run by the framework's own implementation, as a denoiser.

:class:`OwnArchitectureDenoiser` wraps a :class:`~adaptive_decoding.framework.models.arch.layers.MaskedDiffusionLM`
(loaded by :func:`adaptive_decoding.framework.models.arch.load_architecture`, no remote code) with the special ids
the hub adapters work out (LLaDA's fixed mask id 126336, Dream's from its config or tokenizer,
every end-of-text id), and gives the loop both calls of
:class:`~adaptive_decoding.framework.models.windowed.WindowedDenoiser`: the plain ``[B, L, V]`` logits and the
windowed, cached ones (Fast-dLLM's prefix and dual caches). Dream's shift (hidden state ``i``
predicts token ``i + 1``) comes from the model's ``logits_shift``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn

from adaptive_decoding.framework.models.arch.layers import MaskedDiffusionLM
from adaptive_decoding.framework.models.windowed import WindowedDenoiser


class OwnArchitectureDenoiser(WindowedDenoiser, nn.Module):
    """The framework's own LLaDA / Dream model behind the denoiser protocol.

    Args:
        model: the loaded architecture (eval mode, frozen).
        mask_token_id: the id the loop writes at undecided positions.
        vocab_size: V, the width of the returned logits.
        eos_token_id, pad_token_id: where the model has them.
        eos_token_ids: every id that ends the text (LLaDA-Instruct: ``<|endoftext|>`` and ``<|eot_id|>``).
        max_length: the model's context length (longer canvases fail with a clear error).
    """

    def __init__(
        self, model: MaskedDiffusionLM, *, mask_token_id: int, vocab_size: int, eos_token_id: Optional[int] = None,
        pad_token_id: Optional[int] = None, eos_token_ids: Sequence[int] = (), max_length: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.model = model.eval()
        self.logits_shift = int(getattr(model, "logits_shift", 0))
        self.mask_token_id = int(mask_token_id)
        self.vocab_size = int(vocab_size)
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.pad_token_id = None if pad_token_id is None else int(pad_token_id)
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids) or (
            () if self.eos_token_id is None else (self.eos_token_id,))
        self.max_length = max_length
        if getattr(model, "block_causal", False):  # LLaDA2.x, SDAR, Fast-dLLM v2: the loop aligns blocks to it
            self.block_size = int(model.block_size)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def core(self, input_ids: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, Any]:
        if self.max_length is not None:
            cols = kw.get("position_ids")
            width = int(cols.max()) + 1 if cols is not None else input_ids.shape[1]
            if width > self.max_length:
                raise ValueError(f"a canvas of {width} tokens is longer than the model's context "
                                 f"({self.max_length}); use a shorter prompt or gen_length")
        return self.model(input_ids, **kw)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits ``[B, L, V]`` (Dream's already shifted), as the remote code's adapters return them."""
        return self.full_logits(input_ids, attention_mask)
