"""Adapters that make Hugging Face hub models follow the :class:`adaptive_decoding.framework.models.protocol.Denoiser` protocol.

Every adapter is an ``nn.Module`` with ``logits = adapter(input_ids, attention_mask=None)`` of shape
``[B, L, V]`` and the attributes ``mask_token_id``, ``vocab_size``, ``eos_token_id``,
``eos_token_ids`` (every id that ends the text, ``eos_token_id`` first), ``pad_token_id`` and
``device``; it hides its model's quirks so that the decoding loop never sees
them:

* :class:`HFMaskedLMDenoiser` (``masked_lm``): any ``AutoModelForMaskedLM`` (BERT, RoBERTa,
  ModernBERT ...); the mask token is the tokenizer's.
* :class:`LLaDADenoiser` (``llada``): LLaDA-style ``trust_remote_code`` checkpoints, called as
  LLaDA's ``generate.py`` does, ``model(x, attention_mask=...).logits``; bidirectional; the mask
  id is the fixed ``126336`` unless ``config.mask_token_id`` says otherwise; its end tokens
  (``eos_token_ids``) are ``<|endoftext|>`` and, where the tokenizer has it, ``<|eot_id|>``
  (LLaDA-Instruct ends its answers with it).
* :class:`DreamDenoiser` (``dream``): Dream-style checkpoints, called as Dream's
  ``diffusion_generate`` does, ``model(x, attention_mask, tok_idx).logits`` with
  ``attention_mask = "full"`` or a boolean ``[B, 1, L, L]`` mask; Dream predicts position ``i``
  from hidden state ``i − 1``, so the logits are shifted right by one:
  ``cat([logits[:, :1], logits[:, :-1]], dim=1)``.
* :class:`LLaDA2Denoiser` (``llada2``): LLaDA2.0 / LLaDA2.1 MoE checkpoints (``model_type``
  ``llada2_moe``), block-diffusion models run only by the framework's own implementation
  (:mod:`adaptive_decoding.framework.models.arch.llada2`): mask id 156895 and end of text 156892 unless
  ``config.json`` names others.
* :class:`DiffusionGemmaDenoiser` (``diffusion_gemma``): transformers'
  ``DiffusionGemmaForBlockDiffusion``, a *uniform-noise* block-diffusion model (no mask token):
  the prompt goes through its encoder, one canvas of ``canvas_length`` tokens through its
  decoder; the adapter uses an out-of-vocabulary sentinel ``V`` as the loop's mask and feeds
  uniformly random tokens at still-masked canvas positions, as its own sampler re-noises them.

Selection: :func:`load_hub_model` takes ``kind=`` or detects the adapter from the folder's
``config.json`` (``model_type`` / ``architectures`` / ``auto_map``); every adapter states what it
claims in :meth:`HubDenoiser.matches`. Adding an adapter is one decorated class
(``@HUB_ADAPTERS.register("name")``); third-party packages add theirs through the entry-point
group ``adaptive_decoding.hub_adapters``.

Nothing downloads: every ``from_pretrained`` runs with ``local_files_only=True``, and a hub name
that is not in the local cache fails with :class:`ModelNotCachedError` saying how to fetch it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence

import torch
from torch import nn

from adaptive_decoding.framework.core.registry import Registry
from adaptive_decoding.framework.core.rng import mix64, uniform

LLADA_MASK_TOKEN_ID = 126336
LLADA_EOT_TOKEN = "<|eot_id|>"  # LLaDA-Instruct's end of turn (id 126348), besides <|endoftext|> (126081)
NOISE_SALT = 0xD1FF6E


class HubModelError(ValueError):
    """A hub model that cannot be loaded or used as asked (the message says what to change)."""


class ModelNotCachedError(HubModelError, FileNotFoundError):
    """A hub name that is not in the local Hugging Face cache (nothing is downloaded at run time)."""


# ---------------------------------------------------------------------------------- adapters
class HubDenoiser(nn.Module):
    """Base of the hub adapters: wraps ``model`` and fixes the special ids.

    Subclasses set ``auto_classes`` (the transformers classes to load with, first that the
    checkpoint's ``auto_map`` offers, else the first), implement :meth:`compute_logits`, and say
    in :meth:`matches` which ``config.json`` they claim (higher ``detect_priority`` is tried first).

    Args:
        model: the loaded transformers model (put in eval mode here).
        mask_token_id: the id the loop writes at undecided positions.
        vocab_size: V, the width of the returned logits.
        eos_token_id, pad_token_id: where the model has them.
        eos_token_ids: further ids that also end the text (``eos_token_id`` is always the first).
        max_length: the model's context length (longer canvases fail with a clear error).
        suppress_mask: never predict the mask token (its logit set to the dtype's minimum), so a
            committed position is never written back as a mask.
    """

    kind: ClassVar[str] = ""
    auto_classes: ClassVar[tuple[str, ...]] = ("AutoModel",)
    detect_priority: ClassVar[int] = 0

    def __init__(
        self,
        model: nn.Module,
        *,
        mask_token_id: int,
        vocab_size: int,
        eos_token_id: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        max_length: Optional[int] = None,
        suppress_mask: bool = True,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.model = model.eval()
        self.mask_token_id = int(mask_token_id)
        self.vocab_size = int(vocab_size)
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.eos_token_ids = _unique_ids(self.eos_token_id, *eos_token_ids)
        self.pad_token_id = None if pad_token_id is None else int(pad_token_id)
        self.max_length = max_length
        self.suppress_mask = suppress_mask

    @property
    def device(self) -> torch.device:
        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    # --- detection and construction ------------------------------------------------------
    @classmethod
    def matches(cls, config: dict) -> bool:
        """Whether this adapter claims a checkpoint with this ``config.json``."""
        return False

    @classmethod
    def special_ids(cls, config: Any, tokenizer: Any) -> dict:
        """``mask_token_id``, ``vocab_size``, ``eos_token_id``, ``pad_token_id``, ``max_length``."""
        raise NotImplementedError

    @classmethod
    def from_model(cls, model: nn.Module, tokenizer: Any) -> "HubDenoiser":
        return cls(model, **cls.special_ids(model.config, tokenizer))

    # --- the protocol --------------------------------------------------------------------
    def compute_logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.max_length is not None and input_ids.shape[1] > self.max_length:
            raise HubModelError(
                f"a canvas of {input_ids.shape[1]} tokens is longer than the model's context "
                f"({self.max_length}); use a shorter prompt or gen_length"
            )
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # no padding: call the model exactly as its own sampler does
        logits = self.compute_logits(input_ids, attention_mask)
        if self.suppress_mask and 0 <= self.mask_token_id < logits.shape[-1]:
            if torch.is_grad_enabled():
                logits = logits.clone()  # decoding runs under no_grad: no copy of [B, L, V] there
            logits[..., self.mask_token_id] = torch.finfo(logits.dtype).min
        return logits


HUB_ADAPTERS: Registry[HubDenoiser] = Registry(
    "hub adapter", base=HubDenoiser, entry_point_group="adaptive_decoding.hub_adapters",
)


def _get(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def _first_id(*values: Any) -> Optional[int]:
    """The first id that is set (a list of EOS ids counts as its first)."""
    for value in values:
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return None


def _unique_ids(*values: Any) -> tuple[int, ...]:
    """Every id that is set, in order, once (lists are flattened)."""
    out: list[int] = []
    for value in values:
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if v is not None and int(v) not in out:
                out.append(int(v))
    return tuple(out)


def _token_id(tokenizer: Any, token: str) -> Optional[int]:
    """The id of ``token`` when the tokenizer's vocabulary has it (never the unknown token's id)."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    return vocab.get(token)


def _text(config: dict) -> str:
    """``model_type`` + ``architectures`` + ``auto_map`` targets, lower-cased, for matching."""
    parts = [str(config.get("model_type", ""))] + [str(a) for a in config.get("architectures") or []]
    parts += [str(v) for v in (config.get("auto_map") or {}).values()]
    return " ".join(parts).lower()


@HUB_ADAPTERS.register("masked_lm", aliases=("mlm", "bert"))
class HFMaskedLMDenoiser(HubDenoiser):
    """Any transformers ``AutoModelForMaskedLM``; the mask token is the tokenizer's."""

    kind = "masked_lm"
    auto_classes = ("AutoModelForMaskedLM",)
    detect_priority = 0  # the fallback: tried after the diffusion-specific adapters

    @classmethod
    def matches(cls, config: dict) -> bool:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        )

        archs = config.get("architectures") or []
        return any(str(a).endswith("ForMaskedLM") for a in archs) or (
            config.get("model_type") in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        )

    @classmethod
    def special_ids(cls, config: Any, tokenizer: Any) -> dict:
        mask = getattr(tokenizer, "mask_token_id", None)
        if mask is None:
            raise HubModelError(
                f"{type(tokenizer).__name__} has no mask token, so the masked LM cannot be decoded; "
                f"use a tokenizer with a mask token (mask_token=...)"
            )
        return {
            "mask_token_id": mask,
            "vocab_size": config.vocab_size,
            "eos_token_id": _first_id(getattr(tokenizer, "eos_token_id", None),
                                      getattr(tokenizer, "sep_token_id", None)),  # BERT ends on [SEP]
            "pad_token_id": _first_id(getattr(tokenizer, "pad_token_id", None), _get(config, "pad_token_id")),
            "max_length": _get(config, "max_position_embeddings"),
        }

    def compute_logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


@HUB_ADAPTERS.register("llada")
class LLaDADenoiser(HubDenoiser):
    """LLaDA-style remote-code checkpoints: bidirectional, fixed mask id 126336 by default."""

    kind = "llada"
    auto_classes = ("AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM")
    detect_priority = 20

    @classmethod
    def matches(cls, config: dict) -> bool:
        return "llada" in _text(config)

    @classmethod
    def special_ids(cls, config: Any, tokenizer: Any) -> dict:
        mask = _get(config, "mask_token_id")
        eos = _first_id(_get(config, "eos_token_id"), getattr(tokenizer, "eos_token_id", None))
        return {
            "mask_token_id": LLADA_MASK_TOKEN_ID if mask is None else mask,
            "vocab_size": _get(config, "embedding_size", "vocab_size"),
            "eos_token_id": eos,
            "eos_token_ids": _unique_ids(eos, _get(config, "eos_token_id"), getattr(tokenizer, "eos_token_id", None),
                                         _token_id(tokenizer, LLADA_EOT_TOKEN)),
            "pad_token_id": _first_id(getattr(tokenizer, "pad_token_id", None), _get(config, "pad_token_id")),
            "max_length": _get(config, "max_sequence_length", "max_position_embeddings"),
        }

    def compute_logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        if attention_mask is None:
            return self.model(input_ids).logits
        return self.model(input_ids, attention_mask=attention_mask).logits


class OwnOnlyDenoiser(HubDenoiser):
    """A family the framework runs with its own implementation only (LLaDA2-MoE, SDAR, Fast-dLLM v2,
    LLaDA-MoE): claimed by ``model_type`` or class name, its special ids with the family's default
    mask (and end-of-text) id; its remote code is never run (it predates the installed transformers,
    and LLaDA2's forward without a 4-D mask is causal, not the block-causal attention it was trained with)."""

    auto_classes = ("AutoModelForCausalLM", "AutoModel")
    detect_priority = 30  # before ``llada``, whose substring match would claim LLaDA2 and LLaDA-MoE
    model_types: ClassVar[tuple[str, ...]] = ()
    class_names: ClassVar[tuple[str, ...]] = ()
    default_mask: ClassVar[int] = 0
    #: the end-of-text id when the config names none (else the tokenizer's)
    default_eos: ClassVar[Optional[int]] = None
    family: ClassVar[str] = ""
    arch_module: ClassVar[str] = ""

    @classmethod
    def matches(cls, config: dict) -> bool:
        archs = {str(a).lower() for a in config.get("architectures") or []}
        named = bool(archs & {c.lower() for c in cls.class_names})
        return named or (not archs and str(config.get("model_type", "")).lower() in cls.model_types)

    @classmethod
    def special_ids(cls, config: Any, tokenizer: Any) -> dict:
        mask = _get(config, "mask_token_id")
        eos = _first_id(_get(config, "eos_token_id"), cls.default_eos, getattr(tokenizer, "eos_token_id", None))
        return {
            "mask_token_id": cls.default_mask if mask is None else mask,
            "vocab_size": config.vocab_size,
            "eos_token_id": eos,
            "eos_token_ids": _unique_ids(eos, getattr(tokenizer, "eos_token_id", None)),
            "pad_token_id": _first_id(_get(config, "pad_token_id"), getattr(tokenizer, "pad_token_id", None)),
            "max_length": _get(config, "max_position_embeddings"),
        }

    def compute_logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        raise HubModelError(f"{self.family} checkpoints run with the framework's own implementation only "
                            f"({self.arch_module}), which needs no remote code")


@HUB_ADAPTERS.register("llada2", aliases=("llada2_moe",))
class LLaDA2Denoiser(OwnOnlyDenoiser):
    """LLaDA2-MoE (``model_type`` ``llada2_moe``, block-causal): mask id 156895 and end-of-text 156892
    unless the config names others."""

    kind = "llada2"
    model_types = ("llada2_moe",)
    class_names = ("LLaDA2MoeModelLM",)
    default_mask, default_eos = 156895, 156892  # adaptive_decoding.framework.models.arch.llada2's LLADA2_*_TOKEN_ID
    family = "LLaDA2-MoE"
    arch_module = "adaptive_decoding.framework.models.arch.llada2"

    @classmethod
    def matches(cls, config: dict) -> bool:
        archs = [str(a).lower() for a in config.get("architectures") or []]
        return str(config.get("model_type", "")).lower() == "llada2_moe" or "llada2moemodellm" in archs


@HUB_ADAPTERS.register("sdar")
class SDARDenoiser(OwnOnlyDenoiser):
    """SDAR (``model_type`` ``sdar``, block-causal): mask id 151669 unless the config names one."""

    kind = "sdar"
    family = "SDAR"
    model_types = ("sdar",)
    class_names = ("SDARForCausalLM",)
    default_mask = 151669
    arch_module = "adaptive_decoding.framework.models.arch.sdar"


@HUB_ADAPTERS.register("fast_dllm_v2", aliases=("fast_dllm_qwen",))
class FastDLLMv2Denoiser(OwnOnlyDenoiser):
    """Fast-dLLM v2 (``model_type`` ``Fast_dLLM_Qwen``, block-causal, shifted): mask id 151665."""

    kind = "fast_dllm_v2"
    family = "Fast-dLLM v2"
    model_types = ("fast_dllm_qwen",)
    class_names = ("Fast_dLLM_QwenForCausalLM",)
    default_mask = 151665
    arch_module = "adaptive_decoding.framework.models.arch.fast_dllm_v2"


@HUB_ADAPTERS.register("lladamoe", aliases=("llada_moe",))
class LLaDAMoEDenoiser(OwnOnlyDenoiser):
    """LLaDA-MoE (``LLaDAMoEModelLM``, released as ``model_type`` ``llada``): mask id 156895, not LLaDA's."""

    kind = "lladamoe"
    family = "LLaDA-MoE"
    model_types = ("lladamoe",)
    class_names = ("LLaDAMoEModelLM",)
    default_mask = 156895
    arch_module = "adaptive_decoding.framework.models.arch.llada_moe"


@HUB_ADAPTERS.register("dream")
class DreamDenoiser(HubDenoiser):
    """Dream-style remote-code checkpoints: logits shifted right by one (Dream predicts position
    ``i`` from hidden state ``i − 1``), Dream's ``"full"`` / ``[B, 1, L, L]`` attention masks.

    Args:
        shift_logits: apply Dream's shift (``False`` only to show what it is for).
    """

    kind = "dream"
    auto_classes = ("AutoModel", "AutoModelForMaskedLM", "AutoModelForCausalLM")
    detect_priority = 20

    def __init__(self, model: nn.Module, *, shift_logits: bool = True, **ids: Any) -> None:
        super().__init__(model, **ids)
        self.shift_logits = shift_logits

    @classmethod
    def matches(cls, config: dict) -> bool:
        return "dream" in _text(config)

    @classmethod
    def special_ids(cls, config: Any, tokenizer: Any) -> dict:
        mask = _get(config, "mask_token_id")
        if mask is None:
            mask = getattr(tokenizer, "mask_token_id", None)
        if mask is None:
            raise HubModelError(
                "Dream checkpoint without a mask token: neither config.json (mask_token_id) nor the "
                "tokenizer (mask_token) names one"
            )
        return {
            "mask_token_id": mask,
            "vocab_size": config.vocab_size,
            "eos_token_id": _first_id(_get(config, "eos_token_id"), getattr(tokenizer, "eos_token_id", None)),
            "pad_token_id": _first_id(getattr(tokenizer, "pad_token_id", None), _get(config, "pad_token_id")),
            "max_length": _get(config, "max_position_embeddings"),
        }

    def compute_logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        if attention_mask is None:
            logits = self.model(input_ids, "full", None).logits
        else:  # as diffusion_generate: pairwise boolean mask and positions counted over real tokens
            keep = attention_mask.bool()
            pair = keep[:, None, None, :] & keep[:, None, :, None]
            eye = torch.eye(keep.shape[1], dtype=torch.bool, device=keep.device)
            pair = pair | eye  # a padding query sees itself only: no all-masked row, no NaN
            tok_idx = attention_mask.long().cumsum(-1) - 1
            tok_idx = tok_idx.masked_fill(~keep, 1)
            logits = self.model(input_ids, pair, tok_idx).logits
        if self.shift_logits:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits


@HUB_ADAPTERS.register("diffusion_gemma", aliases=("diffusiongemma",))
class DiffusionGemmaDenoiser(HubDenoiser):
    """transformers' ``DiffusionGemmaForBlockDiffusion`` (uniform-noise block diffusion).

    Each row is split into the context (its first ``n_valid − canvas_length`` tokens, to the
    encoder, left-padded) and the canvas (its last ``canvas_length`` real tokens, to the decoder).
    The loop's mask is the sentinel id ``V`` (outside the vocabulary); still-masked canvas
    positions are fed uniformly random tokens drawn from the row's content, so a row's logits
    never depend on the rest of the batch. Decode with ``gen_length == canvas_length`` (one
    canvas per call); self-conditioning logits are not passed (the model then zeroes that signal).
    """

    kind = "diffusion_gemma"
    auto_classes = ("DiffusionGemmaForBlockDiffusion",)
    detect_priority = 30

    def __init__(self, model: nn.Module, *, canvas_length: int, **ids: Any) -> None:
        super().__init__(model, **ids)
        self.canvas_length = int(canvas_length)

    @classmethod
    def matches(cls, config: dict) -> bool:
        return "diffusion_gemma" in _text(config) or "diffusiongemma" in _text(config)

    @classmethod
    def special_ids(cls, config: Any, tokenizer: Any) -> dict:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return {
            "mask_token_id": text.vocab_size,  # the sentinel: no real token has this id
            "vocab_size": text.vocab_size,
            "eos_token_id": _first_id(_get(text, "eos_token_id")),
            "pad_token_id": _first_id(_get(text, "pad_token_id"), 0),
            "max_length": _get(text, "max_position_embeddings"),
        }

    @classmethod
    def from_model(cls, model: nn.Module, tokenizer: Any) -> "HubDenoiser":
        return cls(model, canvas_length=model.config.canvas_length, **cls.special_ids(model.config, tokenizer))

    def compute_logits(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
        b, l = input_ids.shape  # noqa: E741
        c, dev = self.canvas_length, input_ids.device
        valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        ctx_len = valid.sum(1) - c  # [B]; the canvas is the last c real tokens of each row
        masked = input_ids == self.mask_token_id
        pos = torch.arange(l, device=dev)[None, :]
        in_canvas = (pos >= ctx_len[:, None]) & valid
        if bool((ctx_len < 1).any()) or bool((masked & ~in_canvas).any()):
            raise HubModelError(
                f"DiffusionGemma denoises one canvas of canvas_length={c} tokens after a non-empty "
                f"prompt: decode with --set gen_length={c} (and no smaller block_length), or set the "
                f"adapter's canvas_length to your gen_length"
            )
        # encoder input: the context, left-padded to the longest one
        width = int(ctx_len.max())
        j = torch.arange(width, device=dev)[None, :]
        src = j - (width - ctx_len[:, None])
        ctx_mask = src >= 0
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        ctx = torch.where(ctx_mask, input_ids.gather(1, src.clamp(min=0)), torch.full_like(src, pad))
        ctx_pos = (ctx_mask.long().cumsum(1) - 1).clamp(min=0)
        # decoder input: the canvas, masked positions re-noised uniformly
        cidx = ctx_len[:, None] + torch.arange(c, device=dev)[None, :]
        canvas = input_ids.gather(1, cidx)
        noise = (uniform(_row_seeds(input_ids, valid), masked.sum(1), NOISE_SALT, (c,), dev) * self.vocab_size).long()
        canvas = torch.where(canvas == self.mask_token_id, noise.clamp(max=self.vocab_size - 1), canvas)
        out = self.model(
            input_ids=ctx, attention_mask=ctx_mask.long(), position_ids=ctx_pos,
            decoder_input_ids=canvas,
            decoder_attention_mask=torch.cat([ctx_mask.long(), torch.ones_like(canvas)], dim=1),
            decoder_position_ids=ctx_len[:, None] + torch.arange(c, device=dev)[None, :],
        ).logits
        full = out.new_zeros((b, l, out.shape[-1]))  # non-canvas positions are never eligible
        full.scatter_(1, cidx[:, :, None].expand(-1, -1, out.shape[-1]), out)
        return full


def _row_seeds(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A seed per row from its real tokens alone (so a row's noise never depends on the batch)."""
    pos = mix64(torch.arange(1, x.shape[1] + 1, device=x.device, dtype=torch.long))
    return mix64(((x.long() + 1) * pos[None, :] * valid.long()).sum(1))
