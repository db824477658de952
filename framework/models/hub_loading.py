"""Loading Hugging Face checkpoints: local folders or cached hub names (never a download), the
tokenizer wrapper, adapter detection and :func:`load_hub_model`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from framework.models.hub_adapters import (
    HUB_ADAPTERS,
    HubDenoiser,
    HubModelError,
    ModelNotCachedError,
)
from framework.models.protocol import LoadedModel


# ---------------------------------------------------------------------------------- tokenizer
class HFTokenizer:
    """A transformers tokenizer behind the :class:`framework.models.protocol.Tokenizer` protocol.

    Args:
        tokenizer: a ``PreTrainedTokenizerBase``.
        mask_token_id, eos_token_id, pad_token_id, vocab_size: the denoiser's ids (they win over
            the tokenizer's: LLaDA's mask is fixed, DiffusionGemma's is a sentinel).
        chat: wrap each prompt in the tokenizer's chat template as one user turn with the
            generation prompt (instruct models), as LLaDA's and Dream's examples do.
        add_special_tokens: passed to the tokenizer when ``chat`` is off (the template already
            holds its special tokens).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        mask_token_id: int,
        eos_token_id: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        vocab_size: Optional[int] = None,
        chat: bool = False,
        add_special_tokens: bool = True,
    ) -> None:
        if chat and not getattr(tokenizer, "chat_template", None):
            raise HubModelError(
                f"chat=True but {type(tokenizer).__name__} has no chat template; use chat=False for a "
                f"base model or a tokenizer with chat_template"
            )
        self.tokenizer = tokenizer
        self.mask_token_id = int(mask_token_id)
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.vocab_size = int(vocab_size if vocab_size is not None else len(tokenizer))
        self.chat = chat
        self.add_special_tokens = add_special_tokens

    def encode(self, text: str) -> list[int]:
        if self.chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def decode(self, ids: "Sequence[int] | torch.Tensor", stop_at_eos: bool = True) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if stop_at_eos and self.eos_token_id is not None and self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        n = len(self.tokenizer)
        ids = [i for i in ids if 0 <= i < n and i != self.mask_token_id]
        return self.tokenizer.decode(ids, skip_special_tokens=True)


# ---------------------------------------------------------------------------------- loading
def resolve_model_path(name_or_path: str) -> Path:
    """A local folder as given, or the cached snapshot of a hub name (never downloads)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or path.exists()
    if looks_local:
        raise HubModelError(f"{name_or_path!r} is not a folder holding a Hugging Face model (config.json)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=name_or_path, local_files_only=True))
    except HFValidationError as exc:
        raise HubModelError(f"{name_or_path!r} is neither a local folder nor a hub name: {exc}") from None
    except LocalEntryNotFoundError:
        from huggingface_hub import constants

        raise ModelNotCachedError(
            f"hub model {name_or_path!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) "
            f"and nothing is downloaded at run time. Download it first, e.g. "
            f"`huggingface-cli download {name_or_path}` (or `hf download {name_or_path}`) on a machine with "
            f"network access, or pass the path of a local folder"
        ) from None


def read_config(path: Path) -> dict:
    cfg = path / "config.json"
    if not cfg.is_file():
        raise HubModelError(f"{str(path)!r} has no config.json, so it is not a Hugging Face model folder")
    with open(cfg, encoding="utf-8") as fh:
        return json.load(fh)


def detect_kind(config: dict) -> str:
    """The adapter name for a ``config.json`` dict (the highest-priority adapter that claims it)."""
    ranked = sorted(HUB_ADAPTERS.items(), key=lambda kv: -kv[1].detect_priority)
    for name, cls in ranked:
        if cls.matches(config):
            return name
    raise HubModelError(
        f"no hub adapter claims model_type={config.get('model_type')!r}, "
        f"architectures={config.get('architectures')}; pass kind= one of {', '.join(HUB_ADAPTERS.names())}"
    )


def _dtype_kwargs(dtype: Any) -> dict:
    if dtype is None:
        return {}
    if isinstance(dtype, str) and dtype != "auto":
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise HubModelError(f"dtype={dtype!r} is not a torch dtype; allowed: float32, bfloat16, float16, auto")
        dtype = getattr(torch, dtype)
    return {"dtype": dtype}


def _model_class(cls: type[HubDenoiser], config: dict, trust_remote_code: bool) -> Any:
    import transformers

    auto_map = config.get("auto_map") or {}
    if auto_map and not trust_remote_code:
        raise HubModelError(
            f"this checkpoint ships its own modeling code (auto_map: {', '.join(auto_map)}); loading it "
            f"needs trust_remote_code=True"
        )
    for name in cls.auto_classes:
        if name in auto_map:
            return getattr(transformers, name)
    return getattr(transformers, cls.auto_classes[0])


def load_hub_model(
    name_or_path: str,
    device: "str | torch.device" = "cpu",
    dtype: Any = None,
    trust_remote_code: bool = True,
    kind: Optional[str] = None,
    *,
    chat: bool = False,
) -> LoadedModel:
    """Load a hub model (local folder or cached hub name) as a denoiser with its tokenizer.

    Args:
        name_or_path: a local folder with ``config.json``, or a hub name already in the cache.
        device: where to put the model.
        dtype: ``None`` (transformers' default), ``"auto"``, a name like ``"bfloat16"`` or a
            ``torch.dtype``.
        trust_remote_code: allow the checkpoint's own modeling code (LLaDA, Dream need it).
        kind: adapter name (``masked_lm``, ``llada``, ``dream``, ``diffusion_gemma`` or a plugin's);
            ``None`` = detect from ``config.json``.
        chat: apply the tokenizer's chat template to each prompt (instruct models).
    """
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    config = read_config(path)
    kind = kind or detect_kind(config)
    cls = HUB_ADAPTERS.get(kind)
    model_cls = _model_class(cls, config, trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise HubModelError(f"cannot load the tokenizer of {str(path)!r}: {exc}") from None
    model = model_cls.from_pretrained(
        path, local_files_only=True, trust_remote_code=trust_remote_code, **_dtype_kwargs(dtype)
    )
    denoiser = cls.from_model(model.to(device), tokenizer)
    tok = HFTokenizer(
        tokenizer,
        mask_token_id=denoiser.mask_token_id,
        eos_token_id=denoiser.eos_token_id,
        pad_token_id=denoiser.pad_token_id,
        vocab_size=denoiser.vocab_size,
        chat=chat,
        add_special_tokens=not chat,
    )
    info = {
        "kind": kind,
        "path": str(path),
        "class": type(model).__name__,
        "model_type": config.get("model_type"),
        "mask_token_id": denoiser.mask_token_id,
        "vocab_size": denoiser.vocab_size,
    }
    return LoadedModel(denoiser=denoiser, tokenizer=tok, name=name_or_path, task=None, info=info)

