"""``pc_sampler``: position-aware calibrated confidence (NEUIR/PC-Sampler, ``src/generate.py``).

LLaDA's fixed schedule, but the k committed positions are those of largest score
``exp(−λ·j) · min(α, −p(x0)·log f(x0))``: an early position of the block (j its index there) and a
token that is rare in a reference corpus (``f`` its frequency) go first, so frequent, trivial
tokens (spaces, punctuation, end-of-text) are not committed early just because they are likely.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Optional

import torch

from adaptive_decoding.controllers.baselines import SCHEDULE_STEPS, llada_schedule
from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk

#: PC-Sampler's ε inside log f
FREQ_EPS = 1e-9


@lru_cache(maxsize=4)
def load_frequencies(path: str) -> tuple[torch.Tensor, float]:
    """Token frequencies from a count file in PC-Sampler's format (``{"num_token": N,
    "p_baseline_dict": {"id": count, ...}}``): ``(f [max id + 1], 1/N)``, unseen tokens at 1/N."""
    try:
        doc = json.loads(Path(path).read_text())
        total, counts = float(doc["num_token"]), {int(k): float(c) for k, c in doc["p_baseline_dict"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ParameterError(f"pc_sampler.frequencies={path!r} is not a readable token-count file "
                             f"({type(exc).__name__}: {exc}); allowed: a JSON file "
                             '{"num_token": N, "p_baseline_dict": {"id": count}}') from exc
    table = torch.full((max(counts, default=0) + 1,), 1.0 / total)
    if counts:
        table[torch.tensor(list(counts))] = torch.tensor(list(counts.values())) / total
    return table, 1.0 / total


def frequency_of(tokens: torch.Tensor, vocab_size: int, path: Optional[str]) -> torch.Tensor:
    """f(token) ``[B, W]``: from the count file, or 1/V for every token without one."""
    if path is None:
        return torch.full(tokens.shape, 1.0 / vocab_size, device=tokens.device)
    table, unseen = load_frequencies(path)
    table = table.to(tokens.device)
    inside = tokens < table.numel()
    return torch.where(inside, table[tokens.clamp(max=table.numel() - 1)], torch.full_like(table[:1], unseen))


@CONTROLLERS.register("pc_sampler", aliases=("uncode",))
class PCSampler(Controller):
    """PC-Sampler: LLaDA's top-k by exp(−λ·j)·min(α, −p(x0)·log f(x0)), j the index in the block.

    The score weighs the confidence p(x0), calibrated by the token's background frequency f
    (``frequencies``: a count file in PC-Sampler's format; null = uniform 1/V, no calibration), by
    the position-aware factor ``exp(−λ j)``; each step commits LLaDA's k (``steps`` over all blocks,
    null = gen_length: one a step) highest scores.
    """

    kind = "baseline"
    params = {
        "lambd": Param(float, low=0.0, doc="λ: position decay exp(−λ·j) over the block index j", tune=(0.0, 1.0)),
        "alpha": Param(float, low=0.0, low_exclusive=True, doc="α: clip of the calibrated confidence", tune=(1.0, 20.0)),
        "steps": SCHEDULE_STEPS,
        "frequencies": Param(str, nullable=True, doc="token-count JSON in PC-Sampler's format (num_token, "
                             "p_baseline_dict); null = uniform, no calibration"),
    }
    differences = """
    PC-Sampler calibrates with the token counts of a reference corpus for LLaDA's tokenizer
    (data/baseline/reference_corpus_llada.json, not shipped here): pass such a file as
    frequencies. Without it every token has f = 1/V, so the rule is exp(−λ j)·min(α, p(x0)·log V),
    position-weighted confidence without the calibration. The framework has no corpus counts to
    offer: counting the call's prompts with the tokenizer in state.context would make a row's
    decisions depend on the rest of its batch.

    Defaults are the published scripts' (λ = 0.25, α = 10, steps = gen_length); generate.py's own
    defaults are λ = 1, α = 1. Where the schedule gives a step k = 0 (more steps than tokens)
    PC-Sampler commits nothing; here a step commits at least one token and the block's last
    scheduled step all that remain. Its table is a fixed 126464 ids; here ids past the file's
    largest count as unseen (1/N).
    """

    def __init__(self, lambd: float = 0.25, alpha: float = 10.0, steps: Optional[int] = None,
                 frequencies: Optional[str] = None) -> None:
        self.lambd = lambd
        self.alpha = alpha
        self.steps = steps
        self.frequencies = frequencies

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        if self.frequencies is not None:
            load_frequencies(self.frequencies)

    def scores(self, f: StepFeatures, vocab_size: int) -> torch.Tensor:
        j = (f.position - f.block_start[:, None]).float()
        freq = frequency_of(f.x0, vocab_size, self.frequencies)
        calibrated = (-f.confidence.float() * torch.log(freq + FREQ_EPS)).clamp(max=self.alpha)
        return torch.exp(-self.lambd * j) * calibrated

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        if f.logits is None and self.frequencies is None:
            raise RuntimeError("pc_sampler without frequencies needs the vocabulary size from features.logits")
        vocab = f.logits.shape[-1] if f.logits is not None else 0
        k = llada_schedule(self, self.steps, f, state)
        return Decision(commit=select_topk(self.scores(f, vocab), f.eligible, k), info={"k": k})
