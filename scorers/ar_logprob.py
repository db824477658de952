"""``ar_logprob``: the geometric mean of a candidate's token probabilities under a small causal LM.

The verifier idea of adaptive parallel decoding with an autoregressive model: a left-to-right LM
q_φ trained on the same task data (:mod:`adaptive_decoding.framework.training.causal_lm`) reads ``prompt + candidate`` and
``s = exp((1/|D|) Σ_{i∈D} log q_φ(x_i | x_{<i})) − 1``, D the decided, non-padding positions of
the candidate (undecided positions are fed as ``[MASK]``, which the LM was trained to read).
In [−1, 0]; 0 when nothing is decided.

The LM comes from ``context.resources["causal_lm"]`` if given, else the cached verifier of
``task`` (or of ``context.meta["task"]``), trained on first use.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.scorer import SCORERS, Candidates, Scorer, ScoringContext

from .logprob import geometric_mean_score


@SCORERS.register("ar_logprob", aliases=("causal_logprob", "ar_verifier"))
class ARLogProb(Scorer):
    """Geometric mean token probability of prompt + candidate under the task's small causal LM."""

    params = {
        "task": Param(str, nullable=True, doc="task whose verifier LM is used; null = context meta 'task'"),
        "train_if_missing": Param(bool, doc="train the verifier on first use (a few CPU minutes)"),
        "floor": Param(float, high=0.0, doc="log-probabilities are clamped at this value"),
    }

    def __init__(self, task: Optional[str] = None, train_if_missing: bool = True, floor: float = -30.0) -> None:
        self.task = task
        self.train_if_missing = train_if_missing
        self.floor = floor

    def model(self, context: ScoringContext, source: int = 0) -> Any:
        lm = context.resources.get("causal_lm")
        if lm is not None:
            return lm
        task = self.task or context.meta_for(source).get("task")
        if not task:
            raise ValueError("ar_logprob needs a causal LM: give task=NAME, a 'task' in the scoring context's meta, "
                             "or context.resources['causal_lm']")
        from adaptive_decoding.framework.training.causal_lm import load_causal_lm

        return load_causal_lm(str(task), train_if_missing=bool(self.train_if_missing))

    def _score(self, c: Candidates, context: ScoringContext) -> torch.Tensor:
        lm = self.model(context, int(c.source[0]))
        dev = lm.device
        v = int(lm.vocab_size)
        hi = max(int(c.tokens.max()) if c.tokens.numel() else 0, int(c.prompt_ids.max()) if c.prompt_ids.numel() else 0)
        if hi >= v:
            raise ValueError(f"ar_logprob: token id {hi} is outside the causal LM's vocabulary of {v} tokens "
                             f"(a verifier trained on another vocabulary?)")
        n, g = c.tokens.shape
        plen = c.prompt_mask.sum(1)  # prompts are right-padded: real tokens first
        total = c.prompt_ids.shape[1] + g
        pos = torch.arange(total)[None, :].expand(n, total)
        in_prompt = pos < plen[:, None]
        gpos = (pos - plen[:, None]).clamp(0, max(0, g - 1))
        gen = torch.where(c.decided, c.tokens, torch.full_like(c.tokens, lm.mask_token_id))
        prompt = c.prompt_ids.gather(1, pos.clamp(max=max(0, c.prompt_ids.shape[1] - 1))) if c.prompt_ids.shape[1] \
            else torch.zeros_like(pos)
        in_gen = (pos >= plen[:, None]) & (pos < plen[:, None] + g)
        seq = torch.where(in_prompt, prompt, torch.where(in_gen, gen.gather(1, gpos) if g else pos,
                                                         torch.full_like(pos, lm.pad_token_id)))
        seq = seq[:, : min(total, int(lm.config.max_len))]
        with torch.no_grad():
            lp = _token_logprobs(lm, seq.to(dev)).cpu()
        keep = in_gen[:, : seq.shape[1]] & (seq != lm.pad_token_id) & (seq != lm.mask_token_id)
        keep &= (pos[:, : seq.shape[1]] > 0)
        return geometric_mean_score(lp, keep, self.floor)


def _token_logprobs(lm: Any, ids: torch.Tensor) -> torch.Tensor:
    from adaptive_decoding.framework.training.causal_lm import token_logprobs

    return token_logprobs(lm, ids)
