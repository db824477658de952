"""This framework's controllers inside diffusers' ``LLaDA2Pipeline``, through its scheduler contract.

diffusers (>= 0.38) runs LLaDA2.x with ``LLaDA2Pipeline`` and a scheduler: the pipeline owns the
canvas (prompt, then ``gen_length`` masks, in blocks of b aligned from position 0), the block loop
and the forwards; per step it calls ``scheduler.step(block_logits, step_idx, block_tokens, ...)``
and writes ``prev_sample`` where ``transfer_index | editing_transfer_index``; after the step it asks
``check_eos_finished`` and ``check_block_should_continue``. :class:`FrameworkScheduler` honours that
contract with any registered controller (built-in, entry point, ``tuned:PATH``, a learned policy):

* it keeps the framework's own decode state (:func:`adaptive_decoding.framework.engine.loop.start_run`) beside the
  pipeline's canvas, and runs the engine's stages on it (window, features, ``controller.decide``,
  commit with at least one token per row, end-of-text stop, editing, re-masking, NFE counted per
  row exactly as :func:`adaptive_decoding.framework.engine.loop.decode` counts it);
* the logits are the pipeline's: the window's columns of ``model_output``;
* it keeps the pipeline in a block while any row still decodes there (no cap at
  ``num_inference_steps``: the controller's schedule decides, and the framework's progress rule
  bounds it), and reports a row finished once the framework's decode has nothing left for it
  (end-of-text block with ``eos_stop``, or the whole generation decided).

**The attention mask.** The pipeline hands the model a 2-D padding mask ``[B, T]`` (1 = real; 0 at
prompt padding and past ``P + G``) and ``position_ids = arange(T)``; nothing in it is block-causal.
LLaDA2's published modeling code turns a 2-D mask into a *token-causal* one
(``_prepare_4d_causal_attention_mask``; the SDPA path's ``_for_sdpa`` variant returns no mask at all
when the window has no zero, and the hub attention's ``is_causal = False`` then makes it fully
*bidirectional*), so a hub LLaDA2 model under this pipeline attends with a pattern it was not trained
with (docs/models.md, "diffusers"). The documented path is :class:`PipelineDenoiser`: the framework's
own implementation of the checkpoint, called by the pipeline, attending block-causally (block i sees
blocks <= i, bidirectionally inside itself) with the pipeline's mask as the padding mask, and telling
the scheduler which canvas it saw (prompt, columns), which the scheduler contract itself does not.

Differences from the framework's own decode, none of which changes the tokens: the pipeline runs a
batch in lock step by block (a row that finished its block waits, its forwards not charged to it);
it left-pads ragged prompts with position ids that count the pads (refused here: decode such rows one
by one or with :func:`framework.decode`); rows it marks finished keep their masks after the
end-of-text block in ``sequences`` (the scheduler's :meth:`FrameworkScheduler.result` has the
framework's generation, end-of-text filled, with its NFE and steps).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace
from types import SimpleNamespace
from typing import Any, Mapping, Optional, Union

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_block_refinement import BlockRefinementSchedulerOutput
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from torch import nn

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import Controller
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.denoise import suppress_mask_logit, verification_logits, window_logits
from adaptive_decoding.framework.engine.layout import config_for_model, model_block_size
from adaptive_decoding.framework.engine.loop import CallInputs, DecodeResult, finish, model_device, start_run
from adaptive_decoding.framework.engine.step import (
    Cost,
    Forward,
    Run,
    Window,
    charge,
    commit,
    decide,
    features,
    gather_window,
    record,
    refine,
    stop_after_eos_blocks,
)

#: LLaDA2Pipeline's defaults for the step arguments the controller replaces (a value other than these
#: was set by the caller and has no effect here: a warning names the controller parameter to set)
PIPELINE_STEP_DEFAULTS = {"threshold": 0.7, "editing_threshold": 0.5, "minimal_topk": 1}
#: DecodeConfig options the pipeline, not ``decode``, decides
PIPELINE_OWNED = {"gen_length": "FrameworkScheduler(gen_length=...)", "block_length": "the model's block size",
                  "temperature": "the pipeline's temperature= argument"}


@dataclass
class Observation:
    """What the model saw in one pipeline forward: the canvas prefix ``input_ids`` ``[B, T]``, its 2-D
    ``attention_mask`` ``[B, T]`` (1 = real) and the framework denoiser that ran it."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    denoiser: Any

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])


class PipelineDenoiser(nn.Module):
    """The framework's own block-causal model (LLaDA2.x, SDAR, Fast-dLLM v2) as ``LLaDA2Pipeline``'s ``model``.

    ``model(input_ids [B, T], attention_mask [B, T], position_ids [B, T]) -> .logits [B, b, V]``: the
    logits of the window's last b columns (the pipeline's current block, all it reads), from a forward
    whose attention is block-causal (key column k visible to query column q iff ``k // b <= q // b``)
    and excludes the mask's zeros (padding, the tail past ``P + G``). Each call also hands the canvas
    to ``scheduler`` (:meth:`FrameworkScheduler.observe`).

    Args:
        denoiser: a framework denoiser with ``block_causal`` and ``block_size`` (what
            :func:`framework.load_model` returns for a LLaDA2 / SDAR / Fast-dLLM v2 folder).
        scheduler: the :class:`FrameworkScheduler` the same pipeline uses.
    """

    def __init__(self, denoiser: Any, scheduler: "FrameworkScheduler") -> None:
        super().__init__()
        size = model_block_size(denoiser)
        if size is None or not hasattr(denoiser, "window_logits"):
            raise TypeError(f"PipelineDenoiser needs a block-causal framework denoiser (LLaDA2.x, SDAR, Fast-dLLM "
                            f"v2 loaded by framework.load_model); {type(denoiser).__name__} is not one")
        if not isinstance(scheduler, FrameworkScheduler):
            raise TypeError(f"scheduler must be a FrameworkScheduler, got {type(scheduler).__name__}")
        self.denoiser = denoiser
        self.block_size = size
        self.scheduler = scheduler
        self.calls = 0  # forwards the pipeline ran through this model

    @property
    def device(self) -> torch.device:
        """The wrapped denoiser's device (where the pipeline builds its canvas)."""
        return model_device(self.denoiser)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, **_: Any) -> SimpleNamespace:
        """``.logits`` ``[B, b, V]`` of the last b columns of ``input_ids``, block-causal (class docstring)."""
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        arange = torch.arange(T, device=input_ids.device)
        if position_ids is not None and not bool((position_ids == arange).all()):
            raise ValueError("PipelineDenoiser expects LLaDA2Pipeline's position_ids = arange(T) (the canvas "
                             "columns); got others")
        if T % self.block_size:
            raise ValueError(f"the pipeline's window of {T} columns is not a whole number of blocks of "
                             f"{self.block_size}: call the pipeline with block_length={self.block_size}")
        self.scheduler.observe(self.denoiser, input_ids, attention_mask)
        self.calls += 1
        out = arange[T - self.block_size:].expand(B, -1)
        return SimpleNamespace(logits=window_logits(self.denoiser, input_ids, attention_mask.bool(), out))


class FrameworkScheduler(SchedulerMixin, ConfigMixin):
    """A diffusers scheduler that decodes with any of this framework's controllers (module docstring).

    Args:
        controller: a registered controller name (``llada2``, ``fast_dllm``, ``learned``, ...), ``tuned:PATH``
            (a tuned YAML), or a :class:`~adaptive_decoding.framework.engine.controller.Controller` instance.
        controller_params: the controller's parameters (``{"threshold": 0.9}``, ``{"policy": PATH}``),
            validated now; with an instance, leave it empty.
        gen_length: G, the same ``gen_length`` the pipeline is called with (the pipeline does not pass it
            to its scheduler); required.
        block_length: what the pipeline uses when called without ``block_length``: the model's block size.
        decode: other options of :class:`~adaptive_decoding.framework.engine.config.DecodeConfig` (``seed``, ``eos_stop``,
            ``remask_budget``, ``verification``, ...); ``cache`` is ``none`` (the pipeline runs every
            forward itself).

    The pipeline's ``threshold``, ``editing_threshold``, ``minimal_topk``, ``num_inference_steps`` and
    ``max_post_steps`` are the block-refinement scheduler's; here the controller's parameters decide.
    ``temperature`` is honoured (``sampling_method='greedy'`` is temperature 0), sampled as the framework
    samples (counter-based, from ``seed``); ``top_k`` / ``top_p`` are refused.
    """

    order = 1

    @register_to_config
    def __init__(self, controller: Union[str, Controller] = "llada2", controller_params: Optional[dict] = None,
                 gen_length: Optional[int] = None, block_length: int = 32, decode: Optional[dict] = None) -> None:
        self.controller = make_controller(controller, controller_params)
        if isinstance(controller, Controller):  # the config keeps what rebuilds it (and from_config reads it)
            kept = [k for k in self.config.get("_use_default_values", []) if k not in ("controller", "controller_params")]
            self.register_to_config(controller=controller.display_name(), controller_params=controller.get_params(),
                                    _use_default_values=kept)
        self.decode_options = one_block_at_a_time(self.controller, check_decode_options(gen_length, decode))
        self.context: Optional[DecodeContext] = None  # per-call facts some controllers read (oracle's reference)
        self.num_inference_steps = 0
        self.timesteps = torch.zeros(0, dtype=torch.long)
        self._block_length = int(block_length)
        self._reset()

    def _reset(self) -> None:
        self._run: Optional[Run] = None
        self._observed: Optional[Observation] = None
        self._continue = False
        self._finished: Optional[torch.Tensor] = None
        self._temperature: Optional[float] = None

    def set_timesteps(self, num_inference_steps: int, device: Union[str, torch.device, None] = None,
                      block_length: Optional[int] = None) -> None:
        """Start a pipeline call: forget the last one's state (``num_inference_steps`` is the pipeline's
        per-block cap, which the controller's own schedule replaces)."""
        if self.config.gen_length is None:
            raise ParameterError("FrameworkScheduler needs gen_length (the pipeline does not pass it to its "
                                 "scheduler): FrameworkScheduler(..., gen_length=G) with the pipeline's G")
        self.num_inference_steps = int(num_inference_steps)
        self.timesteps = torch.arange(self.num_inference_steps - 1, -1, -1, device=device, dtype=torch.long)
        self._block_length = int(block_length or self.config.block_length)
        self._reset()

    def observe(self, denoiser: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Record the canvas the pipeline's model is about to run (called by :class:`PipelineDenoiser`
        before its forward); a block length other than the model's fails here, before any forward."""
        size = model_block_size(denoiser)
        if self._block_length != size:
            raise ParameterError(f"block_length={self._block_length} is not the block size this block-causal model "
                                 f"was trained with; allowed: {size}")
        self._observed = Observation(input_ids, attention_mask, denoiser)

    def step(self, model_output: torch.Tensor, timestep: Union[int, torch.Tensor], sample: torch.LongTensor, *,
             mask_token_id: Optional[int] = None, temperature: float = 0.0, top_p: Optional[float] = None,
             top_k: Optional[int] = None, sampling_method: str = "auto", generator: Any = None,
             prompt_mask: Optional[torch.Tensor] = None, return_dict: bool = True, **ignored: Any
             ) -> Union[BlockRefinementSchedulerOutput, tuple]:
        """One step of the pipeline's current block ``sample`` ``[B, b]`` with its logits ``model_output``
        ``[B, b, V]``: the framework's step on the rows decoding this block; returns the block after it
        (``prev_sample``), the positions it filled (``transfer_index``) and those it rewrote or re-masked
        (``editing_transfer_index``)."""
        obs = self._take_observation(sample)
        effective = 0.0 if sampling_method == "greedy" else float(temperature)
        if self._run is None:
            self._start(obs, prompt_mask, mask_token_id, effective, top_p, top_k, ignored)
        elif effective != self._temperature:
            raise ValueError(f"temperature changed within a pipeline call ({self._temperature} -> {effective})")
        run, c0 = self._run, obs.width - sample.shape[1]
        self._check_canvas(obs, sample, c0)
        framework_step(run, model_output, c0)
        masked = stop_after_eos_blocks(run, (run.canvas.x == run.mask_id) & run.canvas.in_gen)
        hi = min(c0 + sample.shape[1], masked.shape[1])
        self._continue = bool((masked[:, c0:hi].any(1) | run.counters.stay).any())
        ends = torch.as_tensor(run.state.context.eos_token_ids or (-1,), device=masked.device)
        ended = (torch.isin(run.canvas.x, ends) & run.canvas.in_gen).any(1)
        self._finished = ~masked.any(1) & ~run.counters.stay & ended
        return block_output(run, model_output, sample, c0, return_dict)

    def _take_observation(self, sample: torch.Tensor) -> Observation:
        obs, self._observed = self._observed, None
        if obs is None:
            raise RuntimeError("FrameworkScheduler.step without a forward it saw: the pipeline's model must be "
                               "PipelineDenoiser(denoiser, scheduler) (or call scheduler.observe before each step)")
        if obs.input_ids.shape[0] != sample.shape[0] or obs.width < sample.shape[1]:
            raise RuntimeError(f"the observed canvas {tuple(obs.input_ids.shape)} does not hold the block "
                               f"{tuple(sample.shape)}")
        return obs

    def _start(self, obs: Observation, prompt_mask: Optional[torch.Tensor], mask_token_id: Optional[int],
               temperature: float, top_p: Any, top_k: Any, ignored: Mapping[str, Any]) -> None:
        """The framework's decode state for this call, from the first forward's canvas (checked)."""
        den, b = obs.denoiser, self._block_length
        check_pipeline_call(den, mask_token_id, top_p, top_k, ignored)
        P = obs.width - b + (0 if prompt_mask is None else int(prompt_mask.sum()))
        if not bool(obs.attention_mask[:, :P].bool().all()):
            raise ValueError("the pipeline left-padded the prompts (rows of different lengths): its position ids "
                             "count the pads, so a padded row is not decoded as alone; call it once per prompt "
                             "length, or decode the batch with framework.decode")
        config = DecodeConfig.build(**{**self.decode_options, "gen_length": int(self.config.gen_length),
                                       "temperature": temperature})
        config = config_for_model(config, den)
        prompts = obs.input_ids[:, :P].tolist()
        self._run = start_run(den, prompts, self.controller, config, CallInputs(context=self.context))
        self._temperature = temperature

    def _check_canvas(self, obs: Observation, sample: torch.Tensor, c0: int) -> None:
        """The pipeline's canvas is the framework's: same real columns (its G is ours) and same tokens."""
        cv = self._run.canvas
        L, width = cv.x.shape[1], obs.width
        real = obs.attention_mask.bool()
        if not bool(real[:, : min(L, width)].all()) or bool(real[:, L:width].any()):
            raise ValueError(f"the pipeline's gen_length is not the scheduler's gen_length={self.config.gen_length} "
                             f"(its attention mask ends elsewhere than prompt + {self.config.gen_length}): pass the "
                             f"same G to both")
        n = min(L, c0 + sample.shape[1]) - c0
        live = slice(None) if self._finished is None else ~self._finished  # the pipeline froze the others
        if not torch.equal(sample[live, :n].to(cv.x.device), cv.x[live, c0:c0 + n]):
            raise RuntimeError("the pipeline's block differs from the scheduler's canvas (a callback edited "
                               "block_x?); the scheduler's state is the framework's decode, so it cannot follow")

    def check_eos_finished(self, cur_x: torch.Tensor, sampled_tokens: torch.Tensor, final_transfer: torch.Tensor,
                           finished: torch.Tensor, eos_token_id: int, mask_token_id: int,
                           prompt_length: int) -> torch.Tensor:
        """Rows the framework's decode has finished with an end-of-text (an end-of-text block under
        ``eos_stop``; the pipeline then freezes them and stops once all are). A row decided without one
        is not reported: the pipeline's canvas ends there anyway, unless its gen_length is longer than
        the scheduler's, which its next forward then shows (an error, not a silent cut)."""
        if self._finished is None:
            return finished
        return finished | self._finished.to(finished.device)

    def check_block_should_continue(self, step_idx: int, masks_remaining: bool, editing_enabled: bool,
                                    editing_transfer_index: torch.Tensor, post_steps: int, max_post_steps: int,
                                    finished: torch.Tensor) -> bool:
        """Whether any row still decodes the pipeline's block (a masked position, or the controller keeps
        it open for editing within its ``stay_limit``)."""
        return self._continue and not bool(finished.all())

    def result(self) -> DecodeResult:
        """The framework's :class:`~adaptive_decoding.framework.engine.loop.DecodeResult` of the last pipeline call (the whole
        generation, end-of-text filled, its NFE and steps per row), as :func:`framework.decode` returns it."""
        if self._run is None:
            raise RuntimeError("no pipeline call has run with this scheduler yet")
        out = finish(self._run)
        if bool((out.generated == self._run.mask_id).any()):
            raise RuntimeError(f"the pipeline stopped with positions undecided: was it called with gen_length="
                               f"{self.config.gen_length} (the scheduler's) and eos_early_stop=True?")
        return out


def make_controller(controller: Union[str, Controller], params: Optional[Mapping[str, Any]]) -> Controller:
    """The controller of a spec (name or ``tuned:PATH``) and its parameters, or an instance as given."""
    if isinstance(controller, Controller):
        if params:
            raise ParameterError("controller_params only apply to a controller given by name; set the "
                                 "parameters on the instance")
        controller.validate()
        return controller
    if not isinstance(controller, str):
        raise ParameterError(f"controller={controller!r}: allowed: a registered controller name, 'tuned:PATH' or "
                             f"a Controller instance")
    return build_controller(controller, **dict(params or {}))


def check_decode_options(gen_length: Optional[int], decode: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """``decode`` validated as :class:`DecodeConfig` options (with ``gen_length``), before any work;
    the options the pipeline decides and any cache other than ``none`` are refused, naming why."""
    options = dict(decode or {})
    for key, where in PIPELINE_OWNED.items():
        if key in options:
            raise ParameterError(f"decode={{{key!r}: ...}} is not a scheduler option here: it is {where}")
    if options.get("cache", "none") != "none":
        raise ParameterError(f"decode cache={options['cache']!r}: LLaDA2Pipeline runs every forward over the "
                             f"window itself; allowed: none")
    if options.get("block_add_threshold") not in (None, 1.0):
        raise ParameterError(f"decode block_add_threshold={options['block_add_threshold']!r}: LLaDA2Pipeline "
                             f"decodes one block at a time; allowed: 1.0 or null")
    DecodeConfig.build(gen_length=1 if gen_length is None else gen_length, **options)
    return options


def one_block_at_a_time(controller: Controller, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``block_add_threshold=1.0`` where the controller's default opens several blocks
    (``d3llm``'s multi-block decoding), with a warning: the pipeline's window is its one block."""
    default = getattr(controller, "default_block_add_threshold", None)
    if options.get("block_add_threshold") is None and default is not None and default < 1.0:
        warnings.warn(f"{controller.display_name()} opens several blocks by default (block_add_threshold="
                      f"{default}); LLaDA2Pipeline decodes one block at a time, so it runs with 1.0 here",
                      UserWarning, stacklevel=3)
        return {**options, "block_add_threshold": 1.0}
    return options


def check_pipeline_call(denoiser: Any, mask_token_id: Optional[int], top_p: Any, top_k: Any,
                        ignored: Mapping[str, Any]) -> None:
    """The pipeline's arguments this scheduler cannot honour fail; those it replaces warn (once a call)."""
    if mask_token_id is None or int(mask_token_id) != int(denoiser.mask_token_id):
        raise ParameterError(f"mask_token_id={mask_token_id} is not the model's mask id; allowed: "
                             f"{int(denoiser.mask_token_id)} (pass mask_token_id= to the pipeline)")
    for name, value in (("top_p", top_p), ("top_k", top_k)):
        if value is not None:
            raise ParameterError(f"{name}={value!r}: the framework samples from the whole softmax at the temperature; "
                                 f"allowed: None")
    changed = {k: v for k, v in ignored.items() if k in PIPELINE_STEP_DEFAULTS and v is not None
               and v != PIPELINE_STEP_DEFAULTS[k]}
    if changed:
        warnings.warn(f"{', '.join(f'{k}={v!r}' for k, v in changed.items())} has no effect with FrameworkScheduler: "
                      f"the controller's parameters decide (controller_params=...)", UserWarning, stacklevel=4)


def framework_step(run: Run, model_output: torch.Tensor, c0: int) -> None:
    """The engine's step (:func:`adaptive_decoding.framework.engine.step.step`) on the rows whose window is in the pipeline's
    block ``[c0, c0 + b)``, its forward being the pipeline's ``model_output`` ``[B, b, V]``: features,
    decision, commit, then the forwards charged (1 each, and a verifying controller's exact probes)."""
    w = gather_window(run)
    if w is None:
        return
    b = model_output.shape[1]
    first = w.cols[:, 0]
    if bool((first < c0).any()):
        raise RuntimeError("the pipeline left a block some row had not finished (check_block_should_continue "
                           "was overridden?)")
    here = first < c0 + b
    if not bool(here.any()):
        return
    if not bool(here.all()):
        w = sub_window(w, here)
    cols = (w.cols - c0).clamp(0, b - 1)
    logits = model_output[w.rows.to(model_output.device)].gather(
        1, cols.to(model_output.device)[:, :, None].expand(-1, -1, model_output.shape[-1])).to(run.canvas.x.device)
    cost = Cost.zero(w)
    cost.forward = torch.ones_like(cost.forward)
    shadow = None
    if run.verifies:  # block-causal models have no shadow block: exact probes, one forward each
        shadow, cost.verification = verification_logits(run.model, w.canvas, w.sub(run.canvas.attn), w.cols,
                                                        w.revocable, exact=run.config.verification == "probe")
    fwd = Forward(logits=suppress_mask_logit(logits, run.mask_id), shadow=shadow, cost=cost)
    feats = features(run, w, fwd)
    decision, view = decide(run, w, feats)
    check_blocks(decision, w, c0 + b, b)
    refined = refine(run, w, feats, decision, view)
    outcome = commit(run, w, feats, decision, refined)
    charge(run.counters, w, fwd.cost + refined.cost)
    record(run, w, decision, outcome)


def check_blocks(decision: Any, w: Window, end: int, b: int) -> None:
    """Refuse what the pipeline's fixed blocks cannot follow: a controller that sets another block length
    (``Decision.next_block_length``, CadLLM's adaptive blocks), or a window past the pipeline's block."""
    nbl = decision.next_block_length
    if nbl is not None and bool((nbl != b).any()):
        raise ParameterError(f"the controller sets next_block_length={nbl.tolist()} (adaptive blocks); LLaDA2Pipeline "
                             f"decodes the model's blocks of {b}: use framework.decode for this controller")
    if bool((w.valid & (w.cols >= end)).any()):
        raise RuntimeError(f"a window reaches past the pipeline's block (column {end - 1})")


def sub_window(w: Window, keep: torch.Tensor) -> Window:
    """The rows ``keep`` ``[b]`` of a window (a copy of their canvas rows, so never ``full``)."""
    picked = {f.name: getattr(w, f.name)[keep] for f in fields(w) if f.name != "full"}
    return replace(w, full=False, **picked)


def block_output(run: Run, model_output: torch.Tensor, sample: torch.Tensor, c0: int,
                 return_dict: bool) -> Union[BlockRefinementSchedulerOutput, tuple]:
    """The pipeline's view of the step: the block ``[c0, c0 + b)`` of the framework's canvas, where it
    filled masks, where it changed decided tokens (edits, re-masks), the tokens and their probabilities."""
    x = run.canvas.x.to(sample.device)
    n = min(x.shape[1], c0 + sample.shape[1]) - c0
    prev = sample.clone()
    prev[:, :n] = x[:, c0:c0 + n]
    changed = prev != sample
    transfer = changed & (sample == run.mask_id)
    edited = changed & ~transfer
    probs = torch.softmax(model_output.float(), dim=-1)
    top_p, top_id = probs.max(-1)
    sampled = torch.where(changed, prev, top_id.to(prev.dtype))
    sampled_p = torch.where(changed, probs.gather(-1, prev.clamp(min=0)[..., None])[..., 0], top_p)
    out = (prev, transfer, edited, sampled, sampled_p, model_output)
    return BlockRefinementSchedulerOutput(*out) if return_dict else out
