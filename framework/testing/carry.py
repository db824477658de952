"""``CarryAdder``: a designed denoiser for 2-digit addition with exact, known behaviour (no training),
on which accuracy and NFE really trade off against each other:

* an answer digit that receives no carry is predicted right with p = 0.97 (EOS padding too);
* a digit that receives a carry is predicted right with p = 0.90 once every less significant
  digit is decided, and otherwise *wrong* (the no-carry digit, p = 0.55; the right one 0.40).

So one-token-per-step decoding is always right, ``fast_dllm`` is right for any threshold in
[0.55, 0.90) with NFE = 1 + carries (the designed minimum), and below 0.55 it commits wrong digits.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from adaptive_decoding.framework.models.protocol import LoadedModel
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.tasks.vocab import get_tokenizer

P_EASY, P_AFTER, P_WRONG, P_RIGHT_WHEN_WRONG = 0.97, 0.90, 0.55, 0.40


class CarryAdder(nn.Module):
    """Designed denoiser for ``a+b=`` prompts (see the module docstring)."""

    def __init__(self, task: object, delay: float = 0.0, fail_elsewhere: bool = False) -> None:
        super().__init__()
        self.delay = delay
        self.home_pid = os.getpid() if fail_elsewhere else None  # fail in any other process (a spawned worker)
        self.gen_length = task.gen_length
        self.width = task.digits + 1 if getattr(task, "zero_pad", False) else 0  # the task's format
        tok = get_tokenizer()
        self.tok = tok
        self.vocab_size = tok.vocab_size
        self.mask_token_id = tok.mask_token_id
        self.eos_token_id = tok.eos_token_id
        self.pad_token_id = tok.pad_token_id
        self.eq_id = tok.encode("=")[0]
        self.digit_ids = tok.encode("0123456789")
        self.calls = 0

    def _dist(self, token: int, p: float, second: int | None = None, q: float = 0.0) -> torch.Tensor:
        probs = torch.full((self.vocab_size,), (1.0 - p - q) / (self.vocab_size - 3))
        probs[self.mask_token_id] = 1e-9
        if second is not None:
            probs[second] = q
        probs[token] = p
        return probs.log()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        self.calls += 1
        if self.home_pid is not None and os.getpid() != self.home_pid:
            raise RuntimeError(f"designed failure: CarryAdder called in process {os.getpid()}, built in {self.home_pid}")
        if self.delay:
            time.sleep(self.delay)  # a slower model, so that parallel workers overlap
        b, l = input_ids.shape  # noqa: E741
        out = torch.full((b, l, self.vocab_size), -30.0)
        out.scatter_(2, input_ids.unsqueeze(-1), 0.0)  # decided positions predict themselves
        for r in range(b):
            row = input_ids[r].tolist()
            eq = row.index(self.eq_id)
            a, c = (int(x) for x in self.tok.decode(row[:eq]).split("+"))
            digits = [self.digit_ids[int(ch)] for ch in str(a + c).zfill(self.width)]
            s, start = len(digits), eq + 1
            masked = [row[start + i] == self.mask_token_id for i in range(self.gen_length)]
            for i in range(self.gen_length):
                if not masked[i]:
                    continue
                if i >= s:
                    out[r, start + i] = self._dist(self.eos_token_id, P_EASY)
                    continue
                place = s - 1 - i
                carry_in = place > 0 and (a % 10**place + c % 10**place) >= 10**place
                if not carry_in:
                    out[r, start + i] = self._dist(digits[i], P_EASY)
                elif not any(masked[i + 1 : s]):
                    out[r, start + i] = self._dist(digits[i], P_AFTER)
                else:
                    wrong = self.digit_ids[(self.digit_ids.index(digits[i]) - 1) % 10]
                    out[r, start + i] = self._dist(wrong, P_WRONG, digits[i], P_RIGHT_WHEN_WRONG)
        return out


def carry_model(delay: float = 0.0, fail_elsewhere: bool = False) -> LoadedModel:
    """The designed adder; ``fail_elsewhere`` makes it raise in any process but the one that built it."""
    task = get_task("addition", digits=2)
    return LoadedModel(denoiser=CarryAdder(task, delay, fail_elsewhere), tokenizer=get_tokenizer(), name="carry-adder", task="addition")
