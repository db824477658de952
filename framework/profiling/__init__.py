"""``adec profile``: the cost of a decoding step at real shapes, side by side with a bare loop.

The model is the framework's own LLaDA architecture built from a config with LLaDA's real
vocabulary (126,464 ids, mask 126,336) and a small body (random weights: what is measured is
time and memory, not text). Each run decodes ``batch`` prompts of ``prompt_length`` tokens into
``gen_length`` positions in blocks of ``block_length`` with LLaDA's fixed-step rule
(``steps`` in all, so every run has the same NFE), once through :func:`framework.decode` and once
through a **bare loop**: the same forwards and cache policy, then a softmax over the block only
and the top-k commit, nothing else (what a hand-written ``generate.py`` does). For every
``cache = none | prefix | dual`` and temperature the table gives per-step milliseconds split into
the forward and the rest, milliseconds per generated token, and memory from PyTorch's allocator
(every allocation and free replayed, :class:`adaptive_decoding.framework.core.measure.AllocatedPeak`): the peak of
the run above what was allocated before it, and the peak of a step above what was live when the
step began (a step = one forward and everything until the next): the first step apart (it also
allocates the KV cache), then the largest and the median over the later steps, whole and from the
moment the forward has returned (the window's logits plus what the engine allocates on top of them:
statistics, controller, commit).

Times are medians over ``repeats`` runs, all in one process, one after the other.

**Block-causal models** (``adec profile --arch llada2 | sdar | fast_dllm_v2``,
:mod:`adaptive_decoding.framework.profiling.shapes`): the same measurement on LLaDA2-MoE, SDAR or Fast-dLLM v2 built at a
released checkpoint's shapes (layers cut on CPU), in the model's own blocks, with ``cache = none |
block`` (the exact cache of completed blocks) and ``eos_stop`` off, so both modes run the same NFE;
the bare loop is the same forwards and cache policy followed by the softmax and top-k commit, and
the ratios add what the block cache saves per token.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from adaptive_decoding.framework.core.measure import AllocatedPeak, PeakMemory, median, synced_clock
from adaptive_decoding.framework.engine.config import LAYOUT_CACHE_MODES, DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.denoise import CacheSession, suppress_mask_logit
from adaptive_decoding.framework.engine.layout import model_block_size
from adaptive_decoding.framework.engine.loop import decode, layout
from adaptive_decoding.framework.models.arch.llada import LLADA_MASK_TOKEN_ID, LLaDAArchConfig, LLaDAModel
from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser
from adaptive_decoding.framework.profiling.options import LLADA_VOCAB, LOOPS, ProfileArch, ProfileOptions

__all__ = ["LLADA_VOCAB", "LOOPS", "ProfileArch", "ProfileOptions", "ProfileRow", "as_dicts", "bare_loop",
           "default_caches", "markdown_table", "profile_model", "ratios", "run_profile"]



@dataclass
class ProfileRow:
    """One measured configuration (times in milliseconds, memory in MiB)."""

    loop: str
    batch: int
    cache: str
    temperature: float
    nfe: float
    steps: int
    ms_per_step: float
    forward_ms_per_step: float
    rest_ms_per_step: float
    rest_over_forward: float
    ms_per_token: float
    peak_mb: float
    window_logits_mb: float
    first_step_peak_mb: float = float("nan")
    step_peak_mb: float = float("nan")
    median_step_peak_mb: float = float("nan")
    after_forward_peak_mb: float = float("nan")
    median_after_forward_peak_mb: float = float("nan")


def profile_model(arch: Optional[ProfileArch] = None, *, device: "str | torch.device" = "cpu",
                  dtype: torch.dtype = torch.float32) -> OwnArchitectureDenoiser:
    """A LLaDA-architecture denoiser built from ``arch`` (:class:`~adaptive_decoding.framework.profiling.options.ProfileArch`,
    default every default) on ``device`` in ``dtype``: random weights, the real vocabulary; full
    forwards taken ``arch.query_chunk`` query rows at a time when given (``MaskedDiffusionLM.query_chunk``)."""
    a = arch if arch is not None else ProfileArch()
    a.validate()
    vocab_size = a.vocab_size
    torch.manual_seed(a.seed)
    config = LLaDAArchConfig(d_model=a.d_model, n_heads=a.n_heads, n_kv_heads=a.n_heads, n_layers=a.n_layers,
                             mlp_hidden_size=a.mlp_hidden, vocab_size=vocab_size, max_sequence_length=4096,
                             mask_token_id=(LLADA_MASK_TOKEN_ID if vocab_size > LLADA_MASK_TOKEN_ID
                                            else vocab_size - 1),
                             eos_token_id=None, pad_token_id=0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # built where it runs: an 8B-sized body never passes through host memory
            model = LLaDAModel(config)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.02)
    model = model.eval().requires_grad_(False)
    model.query_chunk = a.query_chunk
    return OwnArchitectureDenoiser(model, mask_token_id=config.mask_token_id, vocab_size=vocab_size,
                                   pad_token_id=0)


@torch.no_grad()
def bare_loop(model: Any, prompts: Sequence[Sequence[int]], gen_length: int, block_length: int, steps: int,
              cache: str = "none", temperature: float = 0.0) -> tuple[torch.Tensor, int, float, float]:
    """The same forwards and cache policy as :func:`decode`, then only a softmax over the block and
    LLaDA's top-k commit (the mask id's logit suppressed, as the engine does: a random model with tied
    embeddings would otherwise predict the mask at masked positions): ``(tokens, nfe per row, forward
    seconds, total seconds)``. On a block-causal model the blocks are the model's and every prompt
    must fill whole blocks."""
    device = model.device
    t_start = synced_clock(device)
    x, attn, gen_start = layout(prompts, gen_length, model.mask_token_id, model.pad_token_id or 0, device)
    b = x.shape[0]
    mode, sub = cache_mode(cache)
    session = CacheSession(model, mode, None, b, device, _aligned_block_size(model, gen_start, block_length), sub)
    rows = torch.arange(b, device=device)
    lengths = gen_start + gen_length
    per_block = steps // (gen_length // block_length)
    k = block_length // per_block
    forward_s, nfe = 0.0, 0
    for blk in range(gen_length // block_length):
        cols = gen_start[:, None] + blk * block_length + torch.arange(block_length, device=device)[None, :]
        valid = torch.ones_like(cols, dtype=torch.bool)
        block_id = torch.full((b,), blk, dtype=torch.long, device=device)
        for _ in range(per_block):
            t0 = synced_clock(device)
            logits = suppress_mask_logit(session.serve(x, attn, rows, cols, valid, block_id, lengths).logits,
                                         model.mask_token_id)  # as the engine does: never predict the mask
            forward_s += synced_clock(device) - t0
            nfe += 1
            p = torch.softmax(logits.float(), dim=-1)
            if temperature == 0:
                conf, x0 = p.max(-1)
            else:  # Fast-dLLM's float64 Gumbel-max over the block
                z = logits.double() / temperature - torch.log(-torch.log(torch.rand_like(logits,
                                                                                         dtype=torch.float64)))
                x0 = z.argmax(-1)
                conf = p.gather(-1, x0[..., None]).squeeze(-1)
            still = x.gather(1, cols) == model.mask_token_id
            conf = torch.where(still, conf, torch.full_like(conf, -1.0))
            pick = conf.topk(k, dim=1).indices
            x.scatter_(1, cols.gather(1, pick), x0.gather(1, pick))
    return x, nfe, forward_s, synced_clock(device) - t_start


#: the profile's label for ``cache='block'`` with Fast-dLLM v2's approximate sub-block cache
#: (``sub_block_cache``, sub-blocks of :data:`SUB_BLOCK` positions, Fast-dLLM v2's ``small_block_size``)
SUB_BLOCK_LABEL, SUB_BLOCK = "sub_block", 8


def cache_mode(label: str) -> tuple[str, Optional[int]]:
    """A profiled cache label as ``(DecodeConfig.cache, DecodeConfig.sub_block_cache)``."""
    return ("block", SUB_BLOCK) if label == SUB_BLOCK_LABEL else (label, None)


def _aligned_block_size(model: Any, gen_start: torch.Tensor, block_length: int) -> Optional[int]:
    """A block-causal model's block size (``None`` for a full-attention one), checked against the
    bare loop's layout: blocks of ``block_length`` from the end of the prompt, which are the model's
    blocks only when every prompt fills whole blocks."""
    size = model_block_size(model)
    if size is None:
        return None
    if block_length != size or bool((gen_start % size).any()):
        raise ValueError(f"the bare loop decodes a block-causal model in its own blocks of {size} after prompts of a "
                         f"multiple of {size} tokens; got block_length={block_length}, prompt lengths "
                         f"{sorted(set(gen_start.tolist()))}")
    return size


class _Verifying:
    """LLaDA's rule with ``verifies = True``: the loop then computes WINO's verification every step
    (the shadow block where the model has one), and the controller ignores it, so the row measures
    what verification costs a step at the same NFE."""

    verifies = True

    def __init__(self, controller: Any) -> None:
        self.controller = controller

    def __getattr__(self, name: str) -> Any:
        return getattr(self.controller, name)


@contextmanager
def _marked_forwards(model: Any) -> Iterator[None]:
    """Mark the start of every forward of ``model`` (its ``core``) for :class:`AllocatedPeak`'s spans."""
    core = model.core

    def marked(*args: Any, **kwargs: Any) -> Any:
        with AllocatedPeak.mark():
            out = core(*args, **kwargs)
        with AllocatedPeak.mark("tail"):  # the rest of the step: statistics, controller, commit
            return out

    model.core = marked
    try:
        yield
    finally:
        del model.core


def _measure(fn: Callable[[], tuple[int, float, float]], repeats: int, model: Any
             ) -> tuple[int, float, float, AllocatedPeak]:
    """``(nfe, median forward s, median total s, memory)``: one warm-up call under the allocator
    replay (:class:`AllocatedPeak`, spans = steps), then ``repeats`` timed calls without it (recording
    every allocation slows a call down, so time and memory are never measured in the same call)."""
    device = torch.device(model.device)
    cuda = device.type == "cuda"
    try:
        with _marked_forwards(model), (PeakMemory(device) if cuda
                                       else nullcontext()) as pm, AllocatedPeak(device) as ap:
            fn()
    except Exception as err:  # noqa: BLE001 - the profiler's CUDA memory events: keep the allocator's peak
        if not cuda:
            raise
        warnings.warn(f"per-step memory not measured on {device} ({type(err).__name__}: {err}); "
                      "the run's peak is the allocator's counter")
        ap = AllocatedPeak(device)
        with PeakMemory(device) as pm:
            fn()
    if cuda:  # the allocator's own peak counter is the reference for the whole run
        ap.peak_mb = pm.peak_mb
    fwd, tot, nfe = [], [], 0
    for _ in range(repeats):
        nfe, f, t = fn()
        fwd.append(f)
        tot.append(t)
    return nfe, median(fwd), median(tot), ap


def run_profile(model: Any, options: Optional[ProfileOptions] = None, *,
                progress: Optional[Callable] = None) -> list[ProfileRow]:
    """Measure ``options.sweep.loops`` for every batch size, cache mode and temperature of ``options``
    (:class:`~adaptive_decoding.framework.profiling.options.ProfileOptions`, default every default): ``decode``
    (:func:`decode`), ``bare`` (:func:`bare_loop`) and ``verify`` (:func:`decode` computing WINO's
    verification of the decided tokens every step, the shadow block, at the same NFE).

    ``shapes.steps`` defaults to ``gen_length // 4`` (four tokens per step). ``sweep.caches`` defaults
    to every mode the model's layout has (:func:`default_caches`). ``progress`` is called with a
    description before each configuration (the CLI passes a progress bar's update).
    """
    opts = (options if options is not None else ProfileOptions()).validate()
    shapes, sweep = opts.shapes, opts.sweep
    caches = default_caches(model) if sweep.caches is None else tuple(sweep.caches)
    prompt_length, gen_length, block_length = shapes.prompt_length, shapes.gen_length, shapes.block_length
    steps = shapes.steps or gen_length // 4
    vocab = model.vocab_size
    itemsize = torch.finfo(next(model.parameters()).dtype).bits // 8
    rows: list[ProfileRow] = []
    g = torch.Generator().manual_seed(0)
    for batch in shapes.batches:
        prompts = torch.randint(0, min(vocab, 100000), (batch, prompt_length), generator=g).tolist()
        for cache in caches:
            for temperature in sweep.temperatures:
                fns = _loop_fns(model, prompts, gen_length, block_length, steps, cache, temperature)
                for name, fn in ((name, fns[name]) for name in sweep.loops):
                    if progress:
                        progress(f"{name} batch={batch} cache={cache} T={temperature:g}")
                    nfe, f, t, mem = _measure(fn, sweep.repeats, model)
                    rows.append(_profile_row(name, batch, cache, temperature, nfe, f, t, mem,
                                             window_logits_mb=batch * block_length * vocab * itemsize / 2**20,
                                             gen_length=gen_length))
    return rows


def default_caches(model: Any) -> tuple[str, ...]:
    """Every cache mode with a meaning for ``model``'s canvas layout: ``none``, ``prefix``, ``dual`` on a
    full-attention model; ``none`` and the exact ``block`` cache on a block-causal one."""
    return LAYOUT_CACHE_MODES["full" if model_block_size(model) is None else "block-causal"]


def _loop_fns(model: Any, prompts: list[list[int]], gen_length: int, block_length: int, steps: int,
              cache: str,
              temperature: float) -> dict[str, Callable[[], tuple[int, float, float]]]:
    """Each profiled loop on ``prompts`` as a call returning ``(NFE, forward seconds, total seconds)``."""
    batch = len(prompts)
    block_causal = model_block_size(model) is not None  # eos_stop off: every run decodes every block (same NFE)
    mode, sub = cache_mode(cache)
    config = DecodeConfig(gen_length=gen_length, block_length=block_length, cache=mode, sub_block_cache=sub,
                          temperature=temperature, **({"eos_stop": False} if block_causal else {}))
    controller = build_controller("llada", steps=steps)

    def ours() -> tuple[int, float, float]:
        r = decode(model, prompts, controller, config, seeds=list(range(batch)))
        return int(r.nfe[0]), r.forward_seconds, r.total_seconds

    def bare() -> tuple[int, float, float]:
        _, nfe, f, t = bare_loop(model, prompts, gen_length, block_length, steps, cache, temperature)
        return nfe, f, t

    def verify() -> tuple[int, float, float]:
        r = decode(model, prompts, _Verifying(controller), config, seeds=list(range(batch)))
        return int(r.nfe[0]), r.forward_seconds, r.total_seconds

    return {"decode": ours, "bare": bare, "verify": verify}


def _profile_row(name: str, batch: int, cache: str, temperature: float, nfe: int, f: float, t: float,
                 mem: Any,
                 *, window_logits_mb: float, gen_length: int) -> ProfileRow:
    """One configuration's row from its NFE, forward and total seconds and memory peaks (the step
    peaks are taken after the first step)."""
    steps_mb, tails_mb = mem.span_peaks_mb[1:], mem.tail_peaks_mb[1:]  # after the first step
    ms_step = 1000 * t / max(nfe, 1)
    fwd_step = 1000 * f / max(nfe, 1)
    return ProfileRow(
        loop=name, batch=batch, cache=cache, temperature=temperature, nfe=nfe, steps=nfe,
        ms_per_step=ms_step, forward_ms_per_step=fwd_step, rest_ms_per_step=ms_step - fwd_step,
        rest_over_forward=(ms_step - fwd_step) / max(fwd_step, 1e-9),
        ms_per_token=1000 * t / (batch * gen_length), peak_mb=mem.peak_mb,
        window_logits_mb=window_logits_mb,
        first_step_peak_mb=mem.span_peaks_mb[0] if mem.span_peaks_mb else float("nan"),
        step_peak_mb=max(steps_mb, default=float("nan")), median_step_peak_mb=median(steps_mb),
        after_forward_peak_mb=max(tails_mb, default=float("nan")),
        median_after_forward_peak_mb=median(tails_mb),
    )


def ratios(rows: Sequence[ProfileRow]) -> list[str]:
    """The issue's targets, each as a measured ratio (one line each)."""
    out = []
    idx = {(r.loop, r.batch, r.cache, r.temperature): r for r in rows}
    for (loop, batch, cache, temp), r in sorted(idx.items()):
        if loop != "decode":
            continue
        bare = idx.get(("bare", batch, cache, temp))
        line = f"batch {batch}, cache={cache}, T={temp:g}: rest/forward {r.rest_over_forward:.3f}"
        if bare:
            line += f"; step vs bare loop {r.ms_per_step / bare.ms_per_step:.2f}x"
        greedy = idx.get(("decode", batch, cache, 0.0))
        if temp > 0 and greedy:
            line += f"; step vs greedy {r.ms_per_step / greedy.ms_per_step:.2f}x"
        none = idx.get(("decode", batch, "none", temp))
        if cache != "none" and none:
            line += f"; speed-up per token vs cache=none {none.ms_per_token / r.ms_per_token:.2f}x"
            if cache == "block":
                line += (f" (saves {none.ms_per_token - r.ms_per_token:.2f} ms per token, "
                         f"{1 - r.ms_per_token / none.ms_per_token:.0%})")
        wl = max(r.window_logits_mb, 1e-9)
        line += (f"; peak of a step after the first {r.step_peak_mb:.0f} MiB = {r.step_peak_mb / wl:.2f}x "
                 f"the window's logits (median {r.median_step_peak_mb / wl:.2f}x; once the forward has "
                 f"returned {r.after_forward_peak_mb / wl:.2f}x, median "
                 f"{r.median_after_forward_peak_mb / wl:.2f}x; the first step, which allocates the cache, "
                 f"{r.first_step_peak_mb / wl:.2f}x; whole run {r.peak_mb:.0f} MiB)")
        ver = idx.get(("verify", batch, cache, temp))
        if ver:
            line += f"; step with WINO's verification vs without {ver.ms_per_step / r.ms_per_step:.2f}x"
        out.append(line)
    return out


def markdown_table(rows: Sequence[ProfileRow]) -> str:
    head = ("| loop | batch | cache | T | NFE | ms/step | forward ms | rest ms | rest/forward | ms/token | "
            "run peak MiB | first step MiB | later steps MiB (max / median) | later steps after the forward "
            "MiB (max / median) | window logits MiB |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        lines.append(f"| {r.loop} | {r.batch} | {r.cache} | {r.temperature:g} | {r.nfe:g} | "
                     f"{r.ms_per_step:.1f} | {r.forward_ms_per_step:.1f} | {r.rest_ms_per_step:.1f} | "
                     f"{r.rest_over_forward:.3f} | {r.ms_per_token:.2f} | {r.peak_mb:.0f} | "
                     f"{r.first_step_peak_mb:.0f} | {r.step_peak_mb:.0f} / {r.median_step_peak_mb:.0f} | "
                     f"{r.after_forward_peak_mb:.0f} / {r.median_after_forward_peak_mb:.0f} | "
                     f"{r.window_logits_mb:.0f} |")
    return "\n".join(lines)


def as_dicts(rows: Sequence[ProfileRow]) -> list[dict]:
    return [asdict(r) for r in rows]
