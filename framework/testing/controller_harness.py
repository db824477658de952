"""The harness of the controller conformance suite: the toy models, prompts and seeds it runs on,
and the spies that watch a controller.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.config import LAYOUT_CACHE_MODES, DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import (
    CONTROLLERS,
    Controller,
    Decision,
    DecodeState,
    stay_limit_of,
)
from adaptive_decoding.framework.engine.denoise import supports_cache
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.loop import DecodeResult, decode
from adaptive_decoding.framework.engine.reference import with_reference

G = 8
#: the characters of the harness tokenizer (digits first, so number_guard finds digit tokens)
HARNESS_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"
PROMPTS: tuple[tuple[int, ...], ...] = ((1, 2), (3,), (4, 5, 6), (7, 8, 9, 10))
SEEDS: tuple[int, ...] = (11, 12, 13, 14)


class ConformanceError(AssertionError):
    """A controller broke a contract; the message names the controller, the check and the evidence."""


Check = Callable[[Any], None]


# ---------------------------------------------------------------------- plumbing
def resolve_controller(cls_or_name: Any) -> type:
    if isinstance(cls_or_name, str):
        return CONTROLLERS.get(cls_or_name)
    if isinstance(cls_or_name, type) and issubclass(cls_or_name, Controller):
        return cls_or_name
    raise TypeError(f"check_controller expects a controller name or class, got {cls_or_name!r}")


def conformance_params_of(cls: type) -> dict[str, Any]:
    hook = getattr(cls, "conformance_params", None)
    return dict(hook()) if callable(hook) else {}


def make_controller(cls: type, **override: Any) -> Controller:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cls.build(**{**conformance_params_of(cls), **override})
        except Exception as exc:  # noqa: BLE001 - reported with the check's name
            raise ConformanceError(f"building it with {override or 'its conformance params'} raised "
                                   f"{type(exc).__name__}: {exc}") from exc


def fail_check(msg: str) -> None:
    raise ConformanceError(msg)


def context_toy() -> Any:
    from adaptive_decoding.framework.testing.toys import ContextToyDenoiser

    return ContextToyDenoiser(vocab_size=16)


def flat_toys() -> list[tuple[str, Any, list[list[int]]]]:
    from adaptive_decoding.framework.testing.toys import ToyDenoiser

    answer = [3, 1, 4, 1, 5, 9, 2, 6][:G]
    confident = ToyDenoiser(answer, [0.99] * G, vocab_size=16, prompt_length=2)
    unsure = ToyDenoiser(answer, [0.2] * G, vocab_size=16, second=[0.19] * G, prompt_length=2)
    return [("all-confident toy", confident, [[1, 2], [3, 4]]), ("none-confident toy", unsure, [[1, 2], [5, 6]])]


class _Spy:
    """Wraps a controller for :func:`decode`: records every step and every broken field contract."""

    def __init__(self, inner: Controller, vocab_size: int, mask_id: int) -> None:
        self.inner, self.vocab_size, self.mask_id = inner, vocab_size, mask_id
        self.steps: list[dict[str, torch.Tensor]] = []
        self.problems: dict[str, list[str]] = {"fields": [], "subset": [], "progress": []}

    @property
    def verifies(self) -> bool:
        """The watched controller's flag (the loop runs the verification for it)."""
        return bool(getattr(self.inner, "verifies", False))

    def stay_limit(self) -> int:
        """The watched controller's (the loop bounds a block's steps with it)."""
        return stay_limit_of(self.inner)

    def _note(self, kind: str, msg: str) -> None:
        if len(self.problems[kind]) < 3:
            self.problems[kind].append(f"step {len(self.steps)}: {msg}")

    def _memory(self, state: DecodeState, when: str) -> None:
        for key, value in state.memory.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != state.batch_size:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                self._note("fields", f"{when}: state.memory[{key!r}] is {shape}, not a per-sample tensor with "
                                     f"leading dimension B={state.batch_size} (the loop selects rows by it)")

    def reset(self, state: DecodeState) -> None:
        self.inner.reset(state)
        self._memory(state, "after reset")

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        d = self.inner.decide(f, state)
        self._fields(f, d)
        self._memory(state, "after decide")
        if isinstance(d.commit, torch.Tensor) and d.commit.shape == f.eligible.shape:
            commit = d.commit.bool()
            outside = commit & ~f.eligible
            if outside.any():
                r, p = outside.nonzero()[0].tolist()
                self._note("subset", f"row {r} committed position {int(f.position[r, p])} of the generation, "
                                     f"which is not eligible (prompt, already decided, or outside the block); "
                                     f"{int(outside.sum())} such commits")
            stalled = f.eligible.any(1) & ~(commit & f.eligible).any(1)
            if stalled.any():
                r = int(stalled.nonzero()[0])
                self._note("progress", f"row {r} has {int(f.n_eligible[r])} eligible positions (max top-1 "
                                       f"{float(f.top1_prob[r][f.eligible[r]].max()):.3f}) but committed none; "
                                       f"the loop had to force a token")
            self.steps.append({"commit": (commit & f.eligible).clone(), "eligible": f.eligible.clone()})
        return d

    def _fields(self, f: StepFeatures, d: Decision) -> None:
        b, l = f.eligible.shape  # noqa: E741
        if not isinstance(d, Decision):
            self._note("fields", f"decide returned {type(d).__name__}, not a Decision")
            return
        if not isinstance(d.commit, torch.Tensor) or d.commit.shape != (b, l) or d.commit.dtype != torch.bool:
            got = (tuple(d.commit.shape), d.commit.dtype) if isinstance(d.commit, torch.Tensor) else d.commit
            self._note("fields", f"commit must be a bool tensor of shape {(b, l)}, got {got}")
        if d.tokens is not None:
            if d.tokens.shape != (b, l) or d.tokens.dtype != torch.long:
                self._note("fields", f"tokens must be long {(b, l)}, got {tuple(d.tokens.shape)} {d.tokens.dtype}")
            else:
                at = d.tokens[d.commit.bool() & f.eligible] if d.commit.shape == (b, l) else d.tokens
                if ((at < 0) | (at >= self.vocab_size) | (at == self.mask_id)).any():
                    self._note("fields", f"tokens at committed positions must be ids in [0, {self.vocab_size}) "
                                         f"other than the mask {self.mask_id}, got {sorted(set(at.tolist()))}")
        if d.k is not None:
            if d.k.shape != (b, l) or d.k.dtype not in (torch.long, torch.int32):
                self._note("fields", f"k must be an integer tensor {(b, l)}, got {tuple(d.k.shape)} {d.k.dtype}")
            elif (d.k < 1).any() or (d.k[~f.eligible] != 1).any():
                self._note("fields", "k must be ≥ 1 everywhere and 1 at positions that are not eligible")
        for name, low in (("depth", 0), ("next_block_length", 1)):
            v = getattr(d, name)
            if v is not None and (v.shape != (b,) or v.dtype not in (torch.long, torch.int32) or (v < low).any()):
                self._note("fields", f"{name} must be an integer tensor of shape {(b,)} with values ≥ {low}, got "
                                     f"{tuple(v.shape)} {v.dtype} {v.tolist()}")
        if d.remask is not None:
            if not isinstance(d.remask, torch.Tensor) or d.remask.shape != (b, l) or d.remask.dtype != torch.bool:
                self._note("fields", f"remask must be a bool tensor of shape {(b, l)}")
            elif not getattr(self.inner, "revocable", False) and d.remask.any():
                self._note("fields", "returns Decision.remask but does not declare revocable = True")
            elif f.revocable is not None and (d.remask & ~f.revocable).any():
                self._note("subset", "re-masked a position that is not revocable (masked, prompt, or not "
                                     "committed by this decode); only features.revocable slots may be re-masked")
        for key, v in d.info.items():
            if not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != b:
                self._note("fields", f"info[{key!r}] must be a per-sample tensor with leading dimension {b}")


def run_recorded(controller: Controller, model: Any, prompts: Sequence[Sequence[int]], config: DecodeConfig,
         seeds: Optional[Sequence[int]] = None) -> tuple[DecodeResult, _Spy]:
    spy = _Spy(controller, int(model.vocab_size), int(model.mask_token_id))
    # a controller that needs a reference decode (the oracle) gets it from a run the recorder does not see
    unrecorded = _cached(model.model if isinstance(model, Recorder) else model, config)
    model = _cached(model, config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            context = with_reference(harness_context(model, prompts), unrecorded, [list(p) for p in prompts],
                                     controller, config, seeds=seeds)
            result = decode(model, [list(p) for p in prompts], spy, config, seeds=seeds,  # type: ignore[arg-type]
                            context=context)
        except ConformanceError:
            raise
        except Exception as exc:  # noqa: BLE001
            seen = [m for kind in spy.problems.values() for m in kind]
            raise ConformanceError(f"decode({len(prompts)} prompt(s), {config!r}) raised "
                                   f"{type(exc).__name__}: {exc}"
                                   + (f"; before that: {'; '.join(seen)}" if seen else "")) from exc
    return result, spy


def harness_context(model: Any, prompts: Sequence[Sequence[int]]) -> DecodeContext:
    """The full decode context of a harness run (:meth:`DecodeContext.for_batch`), as every workflow
    gives one: a character tokenizer over the toy's ``vocab_size`` (digits first, then letters; its
    last three ids the specials), the prompts as its text."""
    from adaptive_decoding.framework.testing.toys import CharTokenizer

    tok = CharTokenizer(alphabet=HARNESS_CHARS[: max(1, int(model.vocab_size) - 3)])
    return DecodeContext.for_batch(tok, [tok.decode(list(p), stop_at_eos=False) for p in prompts])


def _cached(model: Any, config: DecodeConfig) -> Any:
    """``model``, served through a visible cache when ``config`` has one and a plain toy has none."""
    if config.cache != "none" and not supports_cache(model):
        from adaptive_decoding.framework.testing.toys import CachedToy

        return CachedToy(model)
    return model


def harness_configs(block_length: Optional[int] = None,
                    caches: Sequence[str] = LAYOUT_CACHE_MODES["full"]) -> list[DecodeConfig]:
    """Greedy and sampled decoding, under every KV-cache mode of a full-attention model (the toys are
    served through :class:`adaptive_decoding.framework.testing.toys.CachedToy` when a cache is on)."""
    return [DecodeConfig(gen_length=G, block_length=block_length, cache=cache, temperature=temperature)
            for cache in caches for temperature in (0.0, 0.8)]


def same_row(a: DecodeResult, i: int, b: DecodeResult, j: int) -> bool:
    return (torch.equal(a.generated[i], b.generated[j]) and int(a.nfe[i]) == int(b.nfe[j])
            and int(a.forced[i]) == int(b.forced[j]))


def describe_row(r: DecodeResult, i: int) -> str:
    return f"tokens {r.generated[i].tolist()}, nfe {int(r.nfe[i])}, forced {int(r.forced[i])}"


def bad_values(spec: Param) -> list[Any]:
    if spec.choices is not None:
        return ["<not-a-choice>"] if all(isinstance(c, str) for c in spec.choices) else []
    if spec.kind is bool:
        return ["maybe"]
    if spec.kind not in (int, float):
        return []
    out = []
    if spec.low is not None:
        out.append(spec.kind(spec.low) if spec.low_exclusive else spec.kind(spec.low - 1))
    if spec.high is not None:
        out.append(spec.kind(spec.high + 1))
    return out


class Recorder:
    """A denoiser wrapper that keeps every canvas it is shown (for single-prompt decodes)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.mask_token_id, self.vocab_size = model.mask_token_id, model.vocab_size
        self.eos_token_id, self.pad_token_id = model.eos_token_id, model.pad_token_id
        self.canvases: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        self.canvases.append(input_ids.clone())
        return self.model(input_ids, attention_mask=attention_mask)
