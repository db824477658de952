"""Toy denoisers with designed answers and confidences, for exact tests of commit decisions.

Importable by third-party plugin authors too: ``framework.conformance`` runs its checks on these.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn


class ToyDenoiser(nn.Module):
    """Predicts a fixed answer with designed confidences, independent of context.

    Vocabulary: ``0..V-1`` with ``mask_token_id = V-1``, ``eos_token_id = V-2``, ``pad = V-3``.
    At generation position ``i`` (counted from each row's first generated position, found as the
    first mask or first non-prompt token of the canvas) the distribution puts ``conf[i]`` on
    ``answer[i]``, ``second[i]`` on ``alt[i]`` (default ``(answer[i] + 1) % (V - 3)``) and spreads
    the rest uniformly over the other ordinary tokens. Prompt positions predict themselves.

    Args:
        answer: the target tokens, length G.
        conf: p(answer[i]) per position, length G.
        second: p(alt[i]) per position (default: the remainder's half).
        prompt_length: where generation starts in every row (rows must share it); ``None`` =
            at each row's first mask token at the first call.
    """

    def __init__(
        self,
        answer: Sequence[int],
        conf: Sequence[float],
        vocab_size: int = 16,
        second: Optional[Sequence[float]] = None,
        alt: Optional[Sequence[int]] = None,
        prompt_length: int = 2,
    ) -> None:
        super().__init__()
        g = len(answer)
        if len(conf) != g:
            raise ValueError("answer and conf must have the same length")
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_id = vocab_size - 2
        self.pad_token_id = vocab_size - 3
        self.prompt_length = prompt_length
        n_ord = vocab_size - 3
        self.register_buffer("answer", torch.as_tensor(answer, dtype=torch.long))
        conf_t = torch.as_tensor(conf, dtype=torch.float64)
        alt_t = torch.as_tensor(alt, dtype=torch.long) if alt is not None else (self.answer + 1) % n_ord
        sec_t = torch.as_tensor(second, dtype=torch.float64) if second is not None else (1 - conf_t) / 2
        probs = torch.zeros(g, vocab_size, dtype=torch.float64)
        others = n_ord - 2
        for i in range(g):
            rest = max(0.0, 1.0 - float(conf_t[i]) - float(sec_t[i]))
            probs[i, :n_ord] = rest / others if others > 0 else 0.0
            probs[i, int(alt_t[i])] = float(sec_t[i])
            probs[i, int(self.answer[i])] = float(conf_t[i])
            if self.answer[i] >= n_ord:  # answer may be EOS
                probs[i, int(self.answer[i])] = float(conf_t[i])
        probs = probs / probs.sum(-1, keepdim=True)
        self.register_buffer("gen_logits", probs.clamp(min=1e-12).log().float())
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        self.calls += 1
        b, l = input_ids.shape
        out = torch.full((b, l, self.vocab_size), -30.0)
        out.scatter_(2, input_ids.unsqueeze(-1), 0.0)  # prompt/committed positions predict themselves
        g = self.answer.numel()
        p = self.prompt_length
        out[:, p : p + g] = self.gen_logits[None, : min(g, l - p)]
        return out


class CouplingDenoiser(nn.Module):
    """Two answers that are only right together ("New York" / "San Francisco").

    Positions 0 and 1 of the generation: while both are masked, each is 50/50 between its two
    options (slightly favouring ``a`` at position 0 and ``b`` at position 1, so that committing
    both at once gives the incoherent pair); once one is committed, the other follows it with
    probability ``follow``.
    """

    def __init__(self, vocab_size: int = 8, prompt_length: int = 1, follow: float = 0.99) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_id = vocab_size - 2
        self.pad_token_id = vocab_size - 3
        self.prompt_length = prompt_length
        self.follow = follow
        # pair A = (0, 1) ("New", "York"), pair B = (2, 3) ("San", "Francisco")
        self.pairs = ((0, 1), (2, 3))

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, l = input_ids.shape
        p = self.prompt_length
        probs = torch.full((b, l, self.vocab_size), 1e-6)
        probs.scatter_(2, input_ids.unsqueeze(-1), 1.0)
        first, second = input_ids[:, p], input_ids[:, p + 1]
        m = self.mask_token_id
        both = (first == m) & (second == m)
        f = self.follow
        row0 = torch.zeros(b, self.vocab_size) + 1e-6
        row1 = torch.zeros(b, self.vocab_size) + 1e-6
        # both masked: position 0 prefers pair A's first, position 1 prefers pair B's second
        row0[:, 0], row0[:, 2] = 0.52, 0.48
        row1[:, 1], row1[:, 3] = 0.48, 0.52
        # one committed: the other follows
        a_first = first == 0
        b_first = first == 2
        row1 = torch.where(a_first[:, None], _onehot(b, self.vocab_size, 1, f, 3), row1)
        row1 = torch.where(b_first[:, None], _onehot(b, self.vocab_size, 3, f, 1), row1)
        a_second = second == 1
        b_second = second == 3
        row0 = torch.where(a_second[:, None], _onehot(b, self.vocab_size, 0, f, 2), row0)
        row0 = torch.where(b_second[:, None], _onehot(b, self.vocab_size, 2, f, 0), row0)
        probs[:, p] = torch.where((first == m)[:, None], row0, probs[:, p])
        probs[:, p + 1] = torch.where((second == m)[:, None], row1, probs[:, p + 1])
        del both
        return (probs / probs.sum(-1, keepdim=True)).log()


def _onehot(b: int, v: int, idx: int, p: float, other: int) -> torch.Tensor:
    row = torch.full((b, v), 1e-6)
    row[:, idx] = p
    row[:, other] = 1 - p
    return row
