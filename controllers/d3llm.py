"""``d3llm``: d3LLM's entropy-threshold rule over several active blocks (hao-ai-lab/d3LLM,
``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py``, ``generate_multi_block``).

d3LLM decodes with several blocks active at once: the next block joins when the last active one is
a set fraction decided (``block_add_threshold``, 0.1 in its scripts). That part is the loop's
(:class:`adaptive_decoding.framework.engine.config.DecodeConfig` ``block_add_threshold``; this controller makes 0.1
the default), so any controller can decode that way. What is d3LLM's own is the rule of a step,
over every masked position of every active block (the window): with the entropy
H_i = −Σ_v p_i(v) log p_i(v) of each position's prediction,

* commit the position of lowest entropy, and every other one with ``H_i ≤ τ``;
* if nothing was committed in the first active block (the first with a masked position), commit
  its position of lowest entropy too, so that block always advances.
"""

from __future__ import annotations

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk


def lowest_entropy(entropy: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """bool ``[B, W]``: each row's position of lowest entropy among ``where`` (ties: the first)."""
    return select_topk(-entropy.double(), where, 1)


@CONTROLLERS.register("d3llm", aliases=("d3llm_multi_block",))
class D3LLM(Controller):
    """d3LLM: H ≤ τ across the active blocks, the lowest H always, and one in the first block.

    Over the window's masked positions (every active block under multi-block decoding), commit the
    one of lowest entropy H and every one with ``H ≤ threshold`` (τ); if none of the first active
    block's was committed, also its lowest-entropy one. Multi-block decoding is on by default
    (``block_add_threshold`` 0.1, d3LLM's); ``--set block_add_threshold=1`` decodes one block at a
    time (d3LLM's ``generate`` with its entropy threshold).
    """

    kind = "baseline"
    default_block_add_threshold = 0.1
    params = {
        "threshold": Param(float, low=0.0, doc="entropy τ (nats): commit every position with H ≤ τ",
                           tune=(0.05, 1.5)),
    }
    differences = """
    The loop, not the controller, keeps the active blocks: d3LLM's ``block_add_threshold`` is the
    loop option of that name (0.1 by default with this controller, as in d3LLM's eval scripts and
    chat demos; the function's own default is 0.5), so every controller can decode several blocks at
    once. d3LLM's ``decoded_token_threshold`` (0.95 in its scripts) is left out: it only decides which
    blocks are "fully activated", and the only thing that reads that is the progress rule for the
    first fully activated block with a masked position. That block is always the first block with a
    masked position: every block before it is decided (progress 1 ≥ any threshold ≤ 1), and the
    activation states are updated before every step's decision, so the parameter changes no
    decision. Defaults: τ = 0.5 (d3LLM-LLaDA's scripts; its Dream scripts use 0.4 on GSM8K).

    The entropy here is the exact H in float32 (log-sum-exp less Σ p·z); d3LLM computes
    −Σ p log(p + 1e−12) in float64, a difference of about 1e−6 that matters only at H = τ. The mask
    token is never a prediction here (the framework's rule for every decoder); d3LLM's softmax and
    argmax include it. At temperature > 0 d3LLM
    commits Gumbel samples at the threshold's positions but the plain argmax at the forced one; here
    every committed position takes the step's sample x0. Its ``remasking='random'`` variant (random
    numbers in place of entropies) is not implemented.

    d3LLM's Dream file (``d3llm_dream_generate_util.py``) differs: it commits ``H < τ`` (strict) and
    has no global lowest-entropy commit, only the first block's; this follows the LLaDA file.

    Early stop (``early_stop=True`` in d3LLM's scripts): d3LLM turns every position after the first
    committed end-of-text into end-of-text, decided ones included, and stops. Here the loop's
    ``eos_fill`` with ``eos_fill_threshold=0`` fills the masked positions after it (decided ones in
    later active blocks are kept). Defects in the published code: its early-stop check runs after
    ``nfe += 1``, so a decode that the fill completes counts one forward it never ran; it reads the
    first row's end-of-text position only (batch of one); and a ``max_new_tokens`` that is not a
    multiple of ``block_size`` leaves the tail masked forever (no block covers it) until the 10,000
    NFE guard. Here G must be a multiple of the block length (the loop's check) and nothing is
    counted without a forward.

    KV cache: ``cache=none`` is ``generate_multi_block`` (exact). d3LLM's
    ``generate_multi_block_kv_cache`` caches completed blocks ``cache_delay_iter`` steps after they
    finish (full forwards until then; 10000 in its LLaDA eval, i.e. never, and 2 in its chat demo)
    and runs the rest of the canvas against the cached prefix: approximate, as Fast-dLLM's prefix
    cache is. Here ``cache=prefix`` is that same approximation with Fast-dLLM's timing: one full
    forward when the first active block changes (it refreshes the prefix and serves the step), then
    the window and everything after it against the cached prefix; ``dual`` runs the window only.
    Neither reproduces d3LLM's delay, so cached decodes match it in kind (approximate, prefix keys
    computed while later positions differed), not token for token.
    """

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        entropy = f.entropy.double()
        commit = (f.eligible & (entropy <= self.threshold)) | lowest_entropy(entropy, f.eligible)
        block_of = f.block_of if f.block_of is not None else torch.zeros_like(f.position)
        first = f.eligible & (block_of == 0)
        idle = first.any(1) & ~(commit & first).any(1)
        commit = commit | (lowest_entropy(entropy, first) & idle[:, None])
        return Decision(commit=commit, info={"first_block_forced": idle})
