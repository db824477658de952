"""The masked-diffusion decoding loop: batched, ragged by masks, semi-autoregressive blocks.

Layout of one row: ``[prompt_b, MASK × gen_length, PAD …]`` (right padded to the longest prompt,
with an attention mask over the padding). Per sample the loop keeps the current block
``[block_start, block_end)`` of the generation, its step counters and its NFE. Each step is a
pipeline of stages (:mod:`adaptive_decoding.framework.engine.step`):

1. **gather the window**: the unfinished rows, each one's current block as ``[b, W]`` canvas
   columns (rows may be in different blocks and blocks may differ in length; slots past a row's
   block are never eligible);
2. **forward**: one forward pass over those rows (1 NFE each), through the KV cache policy
   (:class:`adaptive_decoding.framework.engine.denoise.CacheSession`), giving logits of the window only; rows whose
   forward the previous step's lookahead already ran on this very canvas reuse it (a ``Handoff``
   the step returns and the next one takes). A controller that
   ``verifies`` gets ``features.verify_prob``: each revocable slot's token probability with the
   slot hidden (WINO's shadow block in the step's own forward, cached or not, where the model has
   one; else exact probes, one counted forward each);
3. **features**: :func:`adaptive_decoding.framework.engine.features.compute_features` on the window;
4. **decide**: ``controller.decide`` -> :class:`adaptive_decoding.framework.engine.controller.Decision`, with the
   call's typed :class:`~adaptive_decoding.framework.engine.context.DecodeContext` in ``state.context``;
5. **refine**: optional lookahead (:mod:`adaptive_decoding.framework.engine.lookahead`) replaces tokens at uncertain positions;
6. **commit**: never outside ``eligible``; at least one token per unfinished row, so no stall;
   optional end-of-text fill (after a confident EOS, later masked positions become EOS); revocable
   decoding: decided positions the controller names in ``Decision.remask`` return to the mask. Only
   positions this decode committed (``features.revocable``), each at most ``remask_per_position``
   times, at most ``remask_budget`` per sample; since every step commits at least one masked
   position, a sample ends within ``gen_length + remask_budget`` steps;
7. **trace**: with ``trace=True``, one record per step.

NFE is counted once per step (:func:`adaptive_decoding.framework.engine.step.charge`): the forward and refine stages
return the forwards they ran (their ``Cost``), per sample, and nothing else adds to the counts.

A block finishes when none of its positions is masked; the next starts where it ended, with the
controller's ``next_block_length`` if it gave one (CadLLM-style adaptive blocks). Multi-block
decoding (d3LLM; ``block_add_threshold``): the next block also opens while the last active one is
still being decoded, once it is that fraction decided, and the window spans every active block,
from the first with a masked position; ``features.block_of`` says which block a slot is in. The
KV cache works unchanged on that window: ``prefix`` refreshes when the first active block changes
and then runs the window and everything after it, ``dual`` the window only, ``block`` (block-causal
models) re-runs every block since the last window's first one, so it stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.measure import answer_lengths, synced_clock
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import Controller, DecodeState, stay_limit_of
from adaptive_decoding.framework.engine.denoise import CacheSession, supports_shadow
from adaptive_decoding.framework.engine.layout import config_for_model, first_block_ends
from adaptive_decoding.framework.engine.step import Canvas, Counters, Handoff, Run, gather_window, step


@dataclass
class DecodeResult:
    """Output of :func:`decode`.

    ``tokens`` is the whole ``[B, L]`` canvas, ``generated`` the ``[B, G]`` generation,
    ``nfe`` forward passes per sample (rollouts included), ``steps`` decoding steps per sample
    (with the rollout steps a lookahead committed, ``Lookahead.advance``),
    ``lookahead_nfe`` the rollout part of ``nfe``, ``forced`` how many steps the loop had to add
    a token because the controller committed none, ``cache_refreshes`` the full forwards that
    refreshed the KV cache (part of ``nfe``; ``None`` counts as 0 with ``cache='none'``),
    ``remasks`` the decided tokens returned to the mask per sample (revocable decoding),
    ``edits`` the decided tokens rewritten per sample (token-to-token editing, ``Decision.edit``),
    ``escalations`` the lookahead steps whose winner was an escalation candidate (``Lookahead.escalate``),
    ``answer_tokens`` the answer's positions per sample: up to and including the first end-of-text
    (the context's ``eos_token_ids``), all G where none occurs (what tokens per forward counts,
    :func:`adaptive_decoding.framework.core.measure.tokens_per_forward`).
    """

    tokens: torch.Tensor
    generated: torch.Tensor
    gen_start: torch.Tensor
    nfe: torch.Tensor
    steps: torch.Tensor
    lookahead_nfe: torch.Tensor
    forced: torch.Tensor
    remasks: torch.Tensor | None = None
    edits: torch.Tensor | None = None
    forward_seconds: float = 0.0
    total_seconds: float = 0.0
    fallbacks: torch.Tensor | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)
    cache_refreshes: torch.Tensor | None = None
    escalations: torch.Tensor | None = None
    answer_tokens: torch.Tensor | None = None

    @property
    def tokens_per_forward(self) -> torch.Tensor:
        """Answer tokens per forward pass, per sample (``answer_tokens / NFE``; G / NFE without them)."""
        answers = self.answer_tokens if self.answer_tokens is not None else self.generated.shape[1]
        return answers / self.nfe.clamp(min=1).float()


def layout(
    prompts: Sequence[Sequence[int]], gen_length: int, mask_token_id: int, pad_token_id: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded canvas ``[B, L]``, attention mask ``[B, L]`` and generation starts ``[B]``."""
    if len(prompts) == 0:
        raise ValueError("decode() needs at least one prompt")
    lengths = [len(p) for p in prompts]
    total = max(lengths) + gen_length
    x = torch.full((len(prompts), total), pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), total), dtype=torch.long)
    for b, p in enumerate(prompts):  # building the canvas, once; the loop itself is batched
        n = len(p)
        if n:
            x[b, :n] = torch.as_tensor(list(p), dtype=torch.long)
        x[b, n : n + gen_length] = mask_token_id
        attn[b, : n + gen_length] = 1
    return x.to(device), attn.to(device), torch.as_tensor(lengths, dtype=torch.long, device=device)


def sample_seeds(seeds: Any, batch: int, base: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``decode``'s per-sample seeds ``[batch]``: ``seeds`` (an int or one per sample), else ``base`` for all."""
    if seeds is None:
        return torch.full((batch,), int(base), dtype=torch.long, device=device)
    t = torch.as_tensor(seeds, dtype=torch.long, device=device).reshape(-1)
    if t.numel() == 1:
        t = t.expand(batch).clone()
    if t.numel() != batch:
        raise ValueError(f"seeds has {t.numel()} entries for a batch of {batch}")
    return t


@torch.no_grad()
def decode(
    model: Any,
    prompts: Sequence[Sequence[int]],
    controller: Controller,
    config: DecodeConfig | None = None,
    *,
    seeds: Any = None,
    lookahead: Any = None,
    trace: bool = False,
    context: DecodeContext | None = None,
    initial: Any = None,
) -> DecodeResult:
    """Decode a batch of prompts with ``controller``.

    Args:
        model: a denoiser (:mod:`adaptive_decoding.framework.engine.denoise`): ``model(input_ids, attention_mask)
            -> logits [B, L, V]``, or a windowed one with a KV cache; with ``mask_token_id`` (and
            ideally ``eos_token_id``, ``pad_token_id``).
        prompts: token-id lists, ragged.
        controller: any registered :class:`Controller`.
        config: :class:`DecodeConfig` (validated here; ``cache`` needs a windowed model).
        seeds: per-sample seeds (int or ``[B]``); default ``config.seed`` for every row. Results of
            row ``b`` depend only on its prompt and seed, never on the rest of the batch.
        lookahead: a :class:`adaptive_decoding.framework.engine.lookahead.Lookahead` (scorers + rollout policy) or ``None``.
        trace: record per-step commit counts, the commit mask in canvas columns and the decision's
            ``info`` tensors.
        context: per-call facts for controllers and the lookahead (:class:`DecodeContext`: ``tokenizer``,
            ``prompt_text`` / ``meta`` lists, a ``span_mask`` ``[B, G]``, ``reference_tokens``); not
            modified. The loop's copy in ``state.context`` gets ``prompt_ids`` (default the prompts),
            ``sample_index`` ``[B]``, ``eos_token_ids`` (default the model's), and every step the rows'
            ``canvas`` ``[b, W]`` and ``generation`` ``[b, G]``.
        initial: long ``[B, G]``, a partly decided generation to continue from (the mask id where
            undecided; e.g. a state another decode visited); default all masked. Steps and NFE
            count from this call; block boundaries are the configuration's, the first block with
            a masked position is where decoding starts.
    """
    config = config_for_model(config or DecodeConfig(), model)
    run = start_run(model, prompts, controller, config, CallInputs(seeds=seeds, lookahead=lookahead, trace=trace,
                                                                  context=context, initial=initial))
    # ≥ 1 commit a step, ≤ budget re-masks, ≤ stay_limit steps without a mask in each block
    max_steps = (config.gen_length + 1) * (1 + stay_limit_of(controller)) + config.effective_remask_budget
    handoff = Handoff()  # forwards the last step's lookahead ran on the canvas the next step decodes
    for _ in range(max_steps):
        window = gather_window(run)
        if window is None:
            break
        handoff = step(run, window, handoff)
    return finish(run)


@dataclass
class CallInputs:
    """What one :func:`decode` call brings besides the model, prompts, controller and config: the rows'
    ``seeds``, the ``lookahead``, whether to ``trace``, the call's ``context`` and the ``initial``
    generation (each as :func:`decode` documents it; ``None``: its default)."""

    seeds: Any = None
    lookahead: Any = None
    trace: bool = False
    context: Optional[DecodeContext] = None
    initial: Any = None


def start_run(model: Any, prompts: Sequence[Sequence[int]], controller: Controller, config: DecodeConfig,
              call: CallInputs) -> Run:
    """Lay out the canvas, build the state (with the ``call``'s context) and reset the controller."""
    seeds, lookahead, trace, context, initial = call.seeds, call.lookahead, call.trace, call.context, call.initial
    device = model_device(model)
    t_start = synced_clock(device)
    mask_id = int(model.mask_token_id)
    eos_id = getattr(model, "eos_token_id", None)
    pad_id = getattr(model, "pad_token_id", None)
    pad_id = int(pad_id) if pad_id is not None else (int(eos_id) if eos_id is not None else mask_id)
    canvas = make_canvas(prompts, config.gen_length, mask_id, pad_id, device, initial)
    B = canvas.x.shape[0]
    state = DecodeState(config=config, seeds=sample_seeds(seeds, B, config.seed, device), mask_token_id=mask_id,
                        eos_token_id=eos_id, pad_token_id=pad_id,
                        context=call_context(context, prompts, model, device))
    controller.reset(state)
    first_end = (first_block_ends(canvas.gen_start, config.effective_block_length, config.gen_length)
                 if config.block_causal else None)
    counters = Counters.start(B, config.effective_block_length, config.gen_length, device, first_end)
    c, rel = counters, canvas.rel
    c.block_masked_at_start = ((canvas.x == mask_id) & canvas.in_gen & (rel < c.block_end[:, None])).sum(1)
    verifies = bool(getattr(controller, "verifies", False))
    return Run(model=model, controller=controller, config=config, lookahead=lookahead,
               session=CacheSession(model, config.cache, config.cache_refresh, B, device,
                                    config.effective_block_length if config.block_causal else None,
                                    config.sub_block_cache), state=state,
               canvas=canvas, counters=counters, verifies=verifies,
               shadow_step=verifies and config.verification == "shadow" and supports_shadow(model),
               trace=trace, t_start=t_start, block_add=block_add_threshold(config, controller))


def block_add_threshold(config: DecodeConfig, controller: Controller) -> Optional[float]:
    """Multi-block decoding's threshold: ``config.block_add_threshold``, else the controller's
    ``default_block_add_threshold`` (``None``: one block at a time; 1.0 decodes the same)."""
    default = getattr(controller, "default_block_add_threshold", None)
    value = config.block_add_threshold if config.block_add_threshold is not None else default
    if value is not None and value < 1.0 and config.sub_block_cache is not None:
        raise ParameterError(
            f"sub_block_cache={config.sub_block_cache} freezes one block's keys while multi-block decoding "
            f"(block_add_threshold={value}{'' if config.block_add_threshold is not None else ', the default of ' + controller.display_name()}) "
            f"keeps several blocks open; allowed: one of them (block_add_threshold=1.0, or sub_block_cache=null)")
    return None if value is None else float(value)


def make_canvas(prompts: Sequence[Sequence[int]], gen_length: int, mask_id: int, pad_id: int,
                device: torch.device, initial: Any = None) -> Canvas:
    """The batch's :class:`Canvas`: :func:`layout`, with ``initial`` ``[B, G]`` written into the generation."""
    x, attn, gen_start = layout(prompts, gen_length, mask_id, pad_id, device)
    B, L = x.shape
    gen_index = gen_start[:, None] + torch.arange(gen_length, device=device)[None, :]
    if initial is not None:
        init = torch.as_tensor(initial, dtype=torch.long, device=device)
        if tuple(init.shape) != (B, gen_length):
            raise ValueError(f"initial has shape {tuple(init.shape)}; expected (batch, gen_length) = "
                             f"({B}, {gen_length})")
        x.scatter_(1, gen_index, init)
    rel = torch.arange(L, device=device)[None, :] - gen_start[:, None]
    return Canvas(x=x, attn=attn, gen_start=gen_start, gen_index=gen_index, rel=rel,
                  in_gen=(rel >= 0) & (rel < gen_length), lengths=gen_start + gen_length,
                  revocable=torch.zeros_like(x, dtype=torch.bool), remask_count=torch.zeros_like(x))


def call_context(context: DecodeContext | None, prompts: Sequence[Sequence[int]], model: Any,
                 device: torch.device) -> DecodeContext:
    """The loop's copy of the caller's context: ``prompt_ids`` (default the prompts), ``sample_index``
    ``[B]``, ``eos_token_ids`` (default the model's ``eos_token_id`` and ``eos_token_ids``), its
    row-aligned tensors on ``device`` (checked to have one row per prompt), no per-step views yet."""
    ctx = replace(context) if context is not None else DecodeContext()
    B = len(prompts)
    for name in ("span_mask", "reference_tokens"):
        t = getattr(ctx, name)
        if t is None:
            continue
        t = torch.as_tensor(t, device=device)
        if t.dim() != 2 or t.shape[0] != B:
            raise ValueError(f"context.{name} has shape {tuple(t.shape)}; expected [batch, gen_length] "
                             f"with batch = {B} (one row per prompt)")
        setattr(ctx, name, t)
    if ctx.prompt_ids is None:
        ctx.prompt_ids = [list(p) for p in prompts]
    if not ctx.eos_token_ids:
        ctx.eos_token_ids = model_end_ids(model)
    ctx.sample_index = torch.arange(B, device=device)
    ctx.canvas = ctx.generation = None
    return ctx


def model_end_ids(model: Any) -> tuple[int, ...]:
    """Every end-of-text id a model names: its ``eos_token_id`` and then its ``eos_token_ids``."""
    ids: list[int] = []
    for i in [getattr(model, "eos_token_id", None), *(getattr(model, "eos_token_ids", None) or ())]:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    return tuple(ids)


def finish(run: Run) -> DecodeResult:
    """The call's :class:`DecodeResult`."""
    cv, c = run.canvas, run.counters
    generated = cv.x.gather(1, cv.gen_index)
    return DecodeResult(
        tokens=cv.x, generated=generated, gen_start=cv.gen_start, nfe=c.nfe, steps=c.steps,
        lookahead_nfe=c.lookahead_nfe, forced=c.forced, remasks=c.remasks, edits=c.edits, forward_seconds=run.forward_seconds,
        total_seconds=synced_clock(cv.x.device) - run.t_start, fallbacks=c.fallbacks, trace=run.records,
        cache_refreshes=c.cache_refreshes, escalations=c.escalations,
        answer_tokens=answer_lengths(generated, run.state.context.eos_token_ids),
    )


def model_device(model: Any) -> torch.device:
    """The device of a denoiser: its ``device`` attribute, else its first parameter's, else CPU."""
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")
