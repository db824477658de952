"""Loading Hugging Face checkpoints: local folders or cached hub names (never a download), the
tokenizer wrapper, adapter detection, dtype and device choice, and :func:`load_hub_model`.

Where the weights' code comes from, in order:

1. this framework's own implementation of the architecture (``adaptive_decoding.framework.models.arch``, when that
   package exists and :func:`own_architecture` says it covers the checkpoint): no remote code;
2. transformers' own classes (BERT-style masked LMs, DiffusionGemma);
3. the checkpoint's own modeling files (``auto_map`` in ``config.json``: LLaDA / Dream relatives the
   framework does not implement, test fixtures), only with ``trust_remote_code=True``
   (``--trust-remote-code``): without it the load is refused before any weight is read.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.models.hub_adapters import (
    HUB_ADAPTERS,
    HubDenoiser,
    HubModelError,
    ModelNotCachedError,
)

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = "auto, cpu, cuda, cuda:N, mps"
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
from adaptive_decoding.framework.models.protocol import LoadedModel  # noqa: E402


# ---------------------------------------------------------------------------------- tokenizer
class HFTokenizer:
    """A transformers tokenizer behind the :class:`adaptive_decoding.framework.models.protocol.Tokenizer` protocol.

    Args:
        tokenizer: a ``PreTrainedTokenizerBase``.
        mask_token_id, eos_token_id, pad_token_id, vocab_size: the denoiser's ids (they win over
            the tokenizer's: LLaDA's mask is fixed, DiffusionGemma's is a sentinel).
        eos_token_ids: every id that ends the text (``decode`` stops at the first of them);
            default ``(eos_token_id,)``.
        chat: wrap each prompt in the tokenizer's chat template as one user turn with the
            generation prompt (instruct models), as LLaDA's and Dream's examples do; ``None`` = do
            so when the tokenizer has a ``chat_template``.
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
        chat: Optional[bool] = False,
        add_special_tokens: bool = True,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        if chat is None:
            chat = bool(getattr(tokenizer, "chat_template", None))
        if chat and not getattr(tokenizer, "chat_template", None):
            raise HubModelError(
                f"chat=True but {type(tokenizer).__name__} has no chat template; use chat=False for a "
                f"base model or a tokenizer with chat_template"
            )
        self.tokenizer = tokenizer
        self.mask_token_id = int(mask_token_id)
        self.eos_token_id = eos_token_id
        ends = [] if eos_token_id is None else [int(eos_token_id)]
        self.eos_token_ids = tuple(ends + [int(i) for i in eos_token_ids if int(i) not in ends])
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
        if stop_at_eos:
            ends = [ids.index(e) for e in self.eos_token_ids if e in ids]
            ids = ids[: min(ends)] if ends else ids
        n = len(self.tokenizer)
        ids = [i for i in ids if 0 <= i < n and i != self.mask_token_id]
        return self.tokenizer.decode(ids, skip_special_tokens=True)


# ---------------------------------------------------------------------------------- resolution
def looks_like_hub_name(name: str) -> bool:
    """``org/name`` (one slash, no leading ``.``, ``/`` or ``~``): what a hub repository id looks like."""
    return bool(HUB_NAME.match(name)) and ".." not in name


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (so a changed ``HF_HUB_CACHE`` counts):
    ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(xdg).expanduser() / "huggingface" / "hub"


def download_hint(name: str) -> str:
    return (f"`huggingface-cli download {name}` (or `hf download {name}`) on a machine with network access, "
            f"with HF_HUB_CACHE (or HF_HOME) pointing at the same cache")


def cached_snapshot(name: str, cache_dir: "Path | None" = None) -> Optional[Path]:
    """The snapshot folder of hub repository ``name`` in the local cache, or ``None``.

    The cache layout is ``models--ORG--NAME/snapshots/<commit>/`` with ``refs/main`` naming the
    commit; without ``refs/main`` the newest snapshot holding a ``config.json`` is taken.
    """
    root = (cache_dir or hub_cache_dir()) / ("models--" + name.replace("/", "--"))
    snaps = root / "snapshots"
    if not snaps.is_dir():
        return None
    ref = root / "refs" / "main"
    if ref.is_file():
        snap = snaps / ref.read_text().strip()
        if snap.is_dir():
            return snap
    found = [p for p in snaps.iterdir() if p.is_dir()]
    found.sort(key=lambda p: ((p / "config.json").is_file(), p.stat().st_mtime), reverse=True)
    return found[0] if found else None


def resolve_model_path(name_or_path: str) -> Path:
    """A local folder as given, or the cached snapshot of a hub name ``org/name`` (never downloads)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if not looks_like_hub_name(name_or_path):
        raise HubModelError(
            f"{name_or_path!r} is not a folder holding a Hugging Face model (config.json), and not a hub "
            f"name of the form org/name"
        )
    cache = hub_cache_dir()
    snap = cached_snapshot(name_or_path, cache)
    if snap is None:
        raise ModelNotCachedError(
            f"hub model {name_or_path!r} is not in the local Hugging Face cache ({cache}) and nothing is "
            f"downloaded at run time. Download it first: {download_hint(name_or_path)}; or pass the path "
            f"of a local folder"
        )
    if not (snap / "config.json").is_file():
        raise ModelNotCachedError(
            f"hub model {name_or_path!r} is in the cache ({snap}) but has no config.json (an interrupted "
            f"download?). Fetch it again: {download_hint(name_or_path)}"
        )
    return snap


# ---------------------------------------------------------------------------------- dtype, device
def resolve_device(device: "str | torch.device | None") -> str:
    """``auto`` (CUDA when ``torch.cuda.is_available()``, else CPU), ``cpu``, ``cuda``, ``cuda:N`` or
    ``mps``; anything else, or a device this machine lacks, raises :class:`HubModelError`."""
    text = "auto" if device is None else str(device)
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return text
    if text == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise HubModelError("device 'mps': torch.backends.mps.is_available() is False on this machine")
        return text
    m = re.fullmatch(r"cuda(?::(\d+))?", text)
    if not m:
        raise HubModelError(f"device {text!r} is not supported; allowed: {DEVICES}")
    if not torch.cuda.is_available():
        raise HubModelError(f"device {text!r}: torch.cuda.is_available() is False on this machine; "
                            f"use cpu or auto")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise HubModelError(f"device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                            f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    return text


def resolve_dtype(dtype: Any, device: "str | torch.device" = "cpu") -> Optional[torch.dtype]:
    """A ``torch.dtype`` from ``auto`` (bfloat16 on a GPU, float32 on CPU), a name in :data:`DTYPES`,
    a ``torch.dtype``, or ``None`` (left to the loader)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise HubModelError(f"dtype {dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    return getattr(torch, dtype)


# ---------------------------------------------------------------------------------- architectures
def own_architecture(config: dict) -> bool:
    """Whether this framework's own implementation (``adaptive_decoding.framework.models.arch``) loads the checkpoint.

    The one place where the built-in LLaDA / Dream / LLaDA2-MoE implementations plug in. The package is optional
    (``ImportError``: no). It claims a ``config.json`` when ``arch.detect_architecture`` recognises
    it *and* the classes the checkpoint declares (``architectures``, ``auto_map`` targets), if it
    declares any, include the reference class that package re-implements (``LLaDAModelLM``,
    ``DreamModel``, ``LLaDA2MoeModelLM``): a relative with other classes (an MoE variant, a test fixture) keeps its own
    code. A claimed checkpoint is loaded with ``arch.load_architecture(folder, dtype=..., device=...)``
    and needs no remote code.
    """
    try:
        from adaptive_decoding.framework.models.arch import detect_architecture
        from adaptive_decoding.framework.models.arch.errors import UnsupportedArchitectureError
    except ImportError:
        return False
    try:
        found = detect_architecture(config)
    except UnsupportedArchitectureError:
        return False
    declared = {"architectures": config.get("architectures") or [], "auto_map": config.get("auto_map") or {}}
    if not (declared["architectures"] or declared["auto_map"]):
        return True
    try:  # the same detection from the declared class names alone
        return detect_architecture(declared) == found
    except UnsupportedArchitectureError:
        return False


def _load_own(cls: type[HubDenoiser], path: Path, config: dict, tokenizer: Any, dtype: Any, device: Any) -> Any:
    """The framework's own model of a claimed checkpoint, as a denoiser with the adapter's special ids."""
    from types import SimpleNamespace

    from adaptive_decoding.framework.models.arch import load_architecture
    from adaptive_decoding.framework.models.arch.errors import CheckpointFormatError
    from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

    try:
        model = load_architecture(path, dtype=dtype, device=device)
    except CheckpointFormatError as exc:
        raise HubModelError(f"the framework's own {cls.kind} implementation cannot load {str(path)!r}: {exc}") from None
    ids = cls.special_ids(SimpleNamespace(**config), tokenizer)
    return model, OwnArchitectureDenoiser(model, **ids)


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


def _model_class(cls: type[HubDenoiser], config: dict, trust_remote_code: bool) -> Any:
    import transformers

    auto_map = config.get("auto_map") or {}
    if auto_map and not trust_remote_code:
        arch = ", ".join(config.get("architectures") or []) or config.get("model_type")
        raise HubModelError(
            f"this checkpoint's architecture ({arch}) needs its own modeling code (auto_map: "
            f"{', '.join(auto_map)}), which runs Python shipped with the checkpoint; pass "
            f"--trust-remote-code (trust_remote_code=True) if you trust it"
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
    chat: Optional[bool] = False,
    query_chunk: Optional[int] = None,
) -> LoadedModel:
    """Load a hub model (local folder or cached hub name) as a denoiser with its tokenizer.

    Args:
        name_or_path: a local folder with ``config.json``, or a hub name already in the cache.
        device: where to put the model (``auto``, ``cpu``, ``cuda``, ``cuda:N`` or a ``torch.device``).
        dtype: ``None`` (transformers' default), ``"auto"`` (bfloat16 on a GPU, float32 on CPU), a
            name in :data:`DTYPES` or a ``torch.dtype``.
        trust_remote_code: allow the checkpoint's own modeling code (LLaDA, Dream need it unless
            :func:`own_architecture` covers them). The command line passes ``False`` unless
            ``--trust-remote-code`` is given.
        kind: adapter name (``masked_lm``, ``llada``, ``dream``, ``diffusion_gemma`` or a plugin's);
            ``None`` = detect from ``config.json``.
        chat: apply the tokenizer's chat template to each prompt (instruct models); ``None`` = when
            the tokenizer has one.
        query_chunk: queries per chunk of a full forward (:attr:`MaskedDiffusionLM.query_chunk`);
            only for the framework's own LLaDA / Dream (a remote-code model is refused with it).
    """
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    config = read_config(path)
    kind = kind or detect_kind(config)
    cls = HUB_ADAPTERS.get(kind)
    if not isinstance(device, torch.device):
        device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    own = own_architecture(config)
    _check_query_chunk(query_chunk, own, path, kind)
    model_cls = None if own else _model_class(cls, config, trust_remote_code)  # refused here, before any read
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise HubModelError(f"cannot load the tokenizer of {str(path)!r}: {exc}") from None
    if own:
        model, denoiser = _load_own(cls, path, config, tokenizer, torch_dtype, device)
        model.query_chunk = query_chunk
    else:
        extra = {} if torch_dtype is None else {"dtype": torch_dtype}
        model = model_cls.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code, **extra)
        denoiser = cls.from_model(model.to(device), tokenizer)
    tok = HFTokenizer(
        tokenizer, mask_token_id=denoiser.mask_token_id, eos_token_id=denoiser.eos_token_id,
        pad_token_id=denoiser.pad_token_id, vocab_size=denoiser.vocab_size,
        eos_token_ids=getattr(denoiser, "eos_token_ids", ()), chat=chat,
    )
    tok.add_special_tokens = not tok.chat  # the template already holds its special tokens
    info = _hub_info(kind, path, config, model, denoiser, tok, torch_dtype, device, own, query_chunk)
    return LoadedModel(denoiser=denoiser, tokenizer=tok, name=name_or_path, task=None, info=info)


def _check_query_chunk(query_chunk: Optional[int], own: bool, path: Path, kind: str) -> None:
    if query_chunk is not None and (not own or int(query_chunk) < 1):
        raise HubModelError(
            f"query_chunk={query_chunk} (--query-chunk): allowed is an integer ≥ 1, and only for the framework's own "
            f"LLaDA and Dream implementations" + ("" if own else f"; {str(path)!r} is a {kind} checkpoint run by "
                                                   f"its own modeling code"))


def _hub_info(kind: str, path: Path, config: dict, model: Any, denoiser: Any, tok: HFTokenizer, torch_dtype: Any,
              device: Any, own: bool, query_chunk: Optional[int]) -> dict[str, Any]:
    """``LoadedModel.info`` of a hub model: adapter, path, class, special ids, dtype and device."""
    return {
        "kind": kind,
        "path": str(path),
        "class": type(model).__name__,
        "model_type": config.get("model_type"),
        "mask_token_id": denoiser.mask_token_id,
        "vocab_size": denoiser.vocab_size,
        "eos_token_ids": list(getattr(denoiser, "eos_token_ids", ())),
        "dtype": str(next((p.dtype for p in model.parameters()), torch_dtype)),
        "device": str(device),
        "chat_template": tok.chat,
        "own_architecture": own,
        "query_chunk": query_chunk,
    }

