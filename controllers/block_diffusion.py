"""The block-diffusion models' own decoding rules, as controllers (``kind = "baseline"``).

* ``llada2``: LLaDA2.0's ``generate`` (inclusionAI's hub ``modeling_llada2_moe.py``; docs/models.md
  writes it out step by step). A block of b positions gets ``steps`` forwards at most; step j of
  the block has the scheduled count ``n_j = ⌊b / steps⌋ + [j < b mod steps]`` (the remainder
  first). With ``p_i = p(x0_i)`` at the block's masked positions, the step commits every position
  with ``p_i > τ`` (strict) when at least ``n_j`` of them pass, else the ``min(n_j, m)`` most
  confident of the m masked ones. ``steps`` is capped at ``⌊G / minimal_topk⌋`` as the reference
  does. With the schedule summing to b, every block finishes within ``steps`` forwards.
* ``sdar``: SDAR's ``low_confidence_dynamic`` (JetAstra/SDAR ``generate.py``,
  ``block_diffusion_generate``): the same rule with τ = 0.85 and T = ``steps`` denoising steps per
  block, quotas ``q_j = ⌊b / T⌋ + [j < b mod T]`` and no ``minimal_topk`` cap. The top-k fallback
  picks the ``min(q_j, m)`` most confident **masked** positions (the published one also re-picks
  decided ones, the prompt's included, once fewer than ``q_j`` masks remain).
* ``fast_dllm_v2``: Fast-dLLM v2's ``generate`` (hub ``modeling.py``): the block of b positions is
  decoded in sub-blocks of ``small_block_size`` s, aligned to the block's start; each step works on
  the first sub-block that holds a masked position and commits its masked positions with
  ``p_i > τ`` and the most confident one. At a block's first step its first position (when it starts
  a model block) is committed alone: Fast-dLLM v2 takes it, by its token shift, from the last row of
  the forward that stored the previous block. Where the loop stops at end-of-text blocks
  (``eos_stop``), a block whose first end-of-text has no masked position before it is finished at
  once with end-of-text (the published loop stops there; the answer is the same).

The token shift (Fast-dLLM v2's column i read from the logits of i − 1) is the model adapter's
(``logits_shift = 1``), not the controllers'.

* ``llada21``: LLaDA2.1's joint threshold (the hub ``modeling_llada21_moe.py`` ``generate``; SGLang's
  ``joint_threshold``). Mask to token (M2T): every masked position with ``p_i > τ`` when at least
  ``n`` (``num_to_transfer``) pass, else the ``n`` most confident. Token to token (T2T): every decided
  position of the block whose prediction changed, ``x0_i ≠ y_i``, with ``p_i > τ_edit``, is rewritten
  (also while masks remain; both sets from the step's state, written together). The block ends at a
  step that started with no mask and edited nothing, or after ``max_post_steps`` forwards without
  masks (``Decision.stay`` keeps it open; the loop enforces the limit, so decoding ends).

Each decides on the window the loop gives it, so it runs on a block-causal canvas (where the loop
aligns the blocks to the model's, and ends a row after a block that contains end-of-text) and on
LLaDA-8B's semi-autoregressive blocks alike; b is the configuration's block length, also for a
first block that the prompt's last partial block shortens (as in the reference, whose schedule is
that of a whole block).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk


def scheduled_counts(block_length: int, steps: int) -> torch.Tensor:
    """``n_j`` for j = 0 … steps − 1: ``⌊b / steps⌋`` each, plus one for the first ``b mod steps``."""
    counts = torch.full((steps,), block_length // steps, dtype=torch.long)
    counts[: block_length % steps] += 1
    return counts


@CONTROLLERS.register("llada2", aliases=("llada2_threshold",))
class LLaDA2Threshold(Controller):
    """LLaDA2.0's rule: every masked position with p(x0) > τ when at least the step's scheduled
    count n_j passes, else the n_j most confident (module docstring)."""

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence τ a position must exceed (strictly)",
                           tune=(0.5, 0.99)),
        "steps": Param(int, low=1, nullable=True, doc="forwards per block at most; null = the block length"),
        "minimal_topk": Param(int, low=1, doc="steps is capped at G // minimal_topk (the reference's)"),
    }

    def __init__(self, threshold: float = 0.95, steps: Optional[int] = None, minimal_topk: int = 1) -> None:
        self.threshold = threshold
        self.steps = steps
        self.minimal_topk = minimal_topk

    def block_steps(self, state: DecodeState) -> int:
        """Forwards per block at most: ``steps`` (default b), capped at ``⌊G / minimal_topk⌋``."""
        b = state.config.effective_block_length
        return max(1, min(self.steps or b, state.config.gen_length // self.minimal_topk))

    def scheduled(self, f: StepFeatures, state: DecodeState) -> torch.Tensor:
        """``n_j`` ``[B]`` at each row's step j of its block (every remaining position past the schedule)."""
        counts = scheduled_counts(state.config.effective_block_length, self.block_steps(state))
        counts = counts.to(f.block_step.device)
        j = f.block_step.long()
        return torch.where(j < counts.numel(), counts[j.clamp(max=counts.numel() - 1)], f.n_eligible)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        n = torch.minimum(self.scheduled(f, state), f.n_eligible)
        high = f.eligible & (f.confidence > self.threshold)
        enough = high.sum(1) >= n
        commit = torch.where(enough[:, None], high, select_topk(f.confidence, f.eligible, n))
        return Decision(commit=commit, info={"n_commit": commit.sum(1), "scheduled": n, "fallback": ~enough})


@CONTROLLERS.register("sdar", aliases=("sdar_dynamic",))
class SDARDynamic(LLaDA2Threshold):
    """SDAR's low_confidence_dynamic: masked positions with p(x0) > τ if ≥ q_j pass, else the q_j most confident.

    q_j is step j's quota of the block (module docstring); the fallback picks masked positions only."""

    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence τ a position must exceed (strictly)",
                           tune=(0.5, 0.99)),
        "steps": Param(int, low=1, nullable=True, doc="denoising steps T per block; null = the block length"),
    }
    differences = """
    SDAR's top-k fallback (``topk(confidence, q_j)`` over the block with −inf at decided columns)
    also picks decided columns, the prompt's included, once fewer masks remain than the quota, and
    rewrites them; here it picks masked positions only. Its sampler divides by zero at temperature
    0; here temperature 0 is the argmax. It decodes whole blocks past gen_length; here the canvas
    ends at P + G. It spends one forward per block storing the finished block and one prefilling
    the prompt's whole blocks; here the block cache stores a block in the next block's first
    forward, so NFE = the reference's − blocks − [P ≥ b] (docs/models.md).
    """

    def __init__(self, threshold: float = 0.85, steps: Optional[int] = None) -> None:
        super().__init__(threshold=threshold, steps=steps, minimal_topk=1)

    def block_steps(self, state: DecodeState) -> int:
        """T: ``steps``, default the block length (no cap by G)."""
        return int(self.steps or state.config.effective_block_length)


@CONTROLLERS.register("fast_dllm_v2", aliases=("fast_dllm_v2_subblock",))
class FastDLLMv2SubBlock(Controller):
    """Fast-dLLM v2's sub-block rule: in the first sub-block with masks, p(x0) > τ and the most confident.

    A block's first position is committed alone at its first step (module docstring)."""

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence τ a position must exceed (strictly)",
                           tune=(0.5, 0.99)),
        "small_block_size": Param(int, low=1, doc="sub-block length s (decoded in order inside the block)"),
        "first_token_alone": Param(bool, doc="commit a block's first position alone at its first step "
                                             "(Fast-dLLM v2's token from the previous block's last logits)"),
    }
    differences = """
    Fast-dLLM v2 takes a block's first token from the last row of the forward that stores the
    previous block (one forward a block) and prefills the prompt's whole blocks only when the prompt
    is longer than a block; here the block cache stores a block in the next block's first forward,
    whose first-position logits are those very logits (block-causal attention), so that step commits
    the first position alone. NFE = the reference's − [P > b and P mod b ≠ 0] − [no end-of-text]
    (docs/models.md). The mask id is never a prediction (the published argmax may pick it and then
    loops forever); a prompt of exactly one block is attended (the published code ignores it); the
    block mask is the checkpoint's block size (the published decoding forwards use 32). The
    published loop stops a block whose first end-of-text has no mask before it, leaving the masks
    after it; here (with ``eos_stop``) they are committed as end-of-text in that step: the same
    answer. The approximate sub-block cache (``use_block_cache``) is the loop option ``sub_block_cache``
    (with ``cache=block``; equal to ``small_block_size`` when set), off by default.
    """

    def __init__(self, threshold: float = 0.9, small_block_size: int = 8, first_token_alone: bool = True) -> None:
        self.threshold = threshold
        self.small_block_size = small_block_size
        self.first_token_alone = first_token_alone

    def reset(self, state: DecodeState) -> None:
        """Validate; refuse a ``sub_block_cache`` other than ``small_block_size`` (the cache would run another
        sub-block than the one this rule decodes, whose other slots carry older logits)."""
        super().reset(state)
        sub = getattr(state.config, "sub_block_cache", None)
        if sub is not None and int(sub) != self.small_block_size:
            raise ParameterError(f"sub_block_cache={sub} with fast_dllm_v2.small_block_size={self.small_block_size}: "
                                 f"the sub-block cache runs sub-blocks of {sub} positions, this rule decodes "
                                 f"sub-blocks of {self.small_block_size}; allowed: sub_block_cache="
                                 f"{self.small_block_size} (or null: off)")

    def offset_in_block(self, f: StepFeatures, state: DecodeState) -> torch.Tensor:
        """Each slot's offset in its block ``[B, W]``: from the model's block start (a multiple of b on a
        block-causal canvas, ``window_index`` being the canvas column), else from the window's block."""
        if state.config.block_causal and f.window_index is not None:
            return f.window_index % state.config.effective_block_length
        return f.position - f.block_start[:, None]

    def sub_block_commit(self, f: StepFeatures, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
        """On the first sub-block (in block order) with an eligible slot: the slots above τ, and the most
        confident one (committed with them)."""
        sub = self.offset_in_block(f, state) // self.small_block_size
        none = torch.iinfo(torch.long).max
        current = torch.where(f.eligible, sub, torch.full_like(sub, none)).amin(1)
        here = f.eligible & (sub == current[:, None])
        return here & (f.confidence > self.threshold), select_topk(f.confidence, here, 1)

    def first_of_block(self, f: StepFeatures, state: DecodeState) -> torch.Tensor:
        """``[B, W]``: at a row's first step in a block, its slot at the model block's start (not column 0)."""
        if not (self.first_token_alone and state.config.block_causal and f.window_index is not None):
            return torch.zeros_like(f.eligible)
        start = (f.window_index % state.config.effective_block_length == 0) & (f.window_index > 0)
        return f.eligible & start & (f.block_step == 0)[:, None]

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        first = self.first_of_block(f, state)
        alone = first.any(1, keepdim=True)
        high, best = self.sub_block_commit(f, state)
        commit = torch.where(alone, first, high | best)
        ends = end_ids(state) if state.config.stops_at_eos_block else ()
        fill = finished_by_end(commit, f.x0, f.eligible, state.context.canvas, ends)
        tokens = torch.where(fill, torch.full_like(f.x0, ends[0]), f.x0) if ends else f.x0
        info = {"n_commit": (commit | fill).sum(1), "first_alone": alone[:, 0],
                "above": (high & ~alone).sum(1), "end_fill": fill.sum(1)}
        return Decision(commit=commit | fill, tokens=tokens, info=info)


def end_ids(state: DecodeState) -> tuple[int, ...]:
    """The call's end-of-text ids (the context's, else the model's ``eos_token_id``)."""
    ids = tuple(state.context.eos_token_ids or ())
    return ids or (() if state.eos_token_id is None else (int(state.eos_token_id),))


def finished_by_end(commit: torch.Tensor, x0: torch.Tensor, eligible: torch.Tensor,
                    window: Optional[torch.Tensor], ends: Sequence[int]) -> torch.Tensor:
    """``[B, W]``: the masked slots left after ``commit`` in rows whose window (``window``: its tokens,
    with the committed ``x0`` written) then holds an end-of-text with no masked slot before its first
    one; Fast-dLLM v2 stops such a block (none where ``ends`` is empty)."""
    left = eligible & ~commit
    if not ends or window is None or not left.any():
        return torch.zeros_like(commit)
    after = torch.where(commit, x0, window)
    is_end = torch.isin(after, torch.as_tensor(list(ends), device=after.device))
    slot = torch.arange(after.shape[1], device=after.device).expand_as(after)
    first_end = torch.where(is_end, slot, torch.full_like(slot, after.shape[1])).amin(1)
    clean = ~(left & (slot < first_end[:, None])).any(1)
    return left & (is_end.any(1) & clean)[:, None]


@CONTROLLERS.register("llada21", aliases=("joint_threshold",))
class LLaDA21JointThreshold(Controller):
    """LLaDA2.1's joint threshold: M2T commits above τ (at least n), T2T edits of decided positions whose
    prediction changed with p > τ_edit, the block kept open while it edits (module docstring).

    Editing reads the model's prediction at *visible* positions. LLaDA2.1 is trained to make it (its
    token-to-token objective); a model trained with the masked-diffusion loss alone (LLaDA-8B, Dream,
    MDLM, LLaDA2.0, this project's tiny denoisers) never is, and there the edits rewrite correct
    tokens: measured on tiny-phrases, 160 edits a sample and 9 % of answers valid (100 % without
    edits, as ``llada2``; 3 % on its block-diffusion variant tiny-phrases-bd32). With such a model
    set ``editing_threshold`` to 1.0 (no edits: LLaDA2.0's rule)."""

    kind = "baseline"
    edits = True
    params = {
        "threshold": Param(float, low=0.0, high=1.0, doc="confidence τ a masked position must exceed",
                           tune=(0.5, 0.99)),
        "editing_threshold": Param(float, low=0.0, high=1.0,
                                   doc="confidence τ_edit a changed prediction needs to rewrite a decided token"),
        "max_post_steps": Param(int, low=0, doc="forwards a block may take after its masks are gone"),
        "num_to_transfer": Param(int, low=1, doc="masked positions committed at least each step (n)"),
    }

    def __init__(self, threshold: float = 0.95, editing_threshold: float = 0.9, max_post_steps: int = 16,
                 num_to_transfer: int = 1) -> None:
        self.threshold = threshold
        self.editing_threshold = editing_threshold
        self.max_post_steps = max_post_steps
        self.num_to_transfer = num_to_transfer

    def stay_limit(self) -> int:
        return int(self.max_post_steps)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        n = f.n_eligible.clamp(max=self.num_to_transfer)
        high = f.eligible & (f.confidence > self.threshold)
        commit = torch.where((high.sum(1) >= n)[:, None], high, select_topk(f.confidence, f.eligible, n))
        current = state.context.canvas
        decided = (current != state.mask_token_id) & ~f.eligible
        edit = decided & (f.confidence > self.editing_threshold) & (f.x0 != current)
        stay = f.eligible.any(1) | edit.any(1)
        return Decision(commit=commit, edit=edit, stay=stay,
                        info={"n_commit": commit.sum(1), "n_edit": edit.sum(1)})
