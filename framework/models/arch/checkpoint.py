"""Read a Hugging Face checkpoint FOLDER for the framework's own LLaDA / Dream modules, without
running the folder's remote code.

A folder holds ``config.json`` and the weights in one of (first match wins):

* ``model.safetensors.index.json`` + the shards it names (``weight_map``: tensor -> file);
* ``model.safetensors``;
* ``pytorch_model.bin.index.json`` + its shards;
* ``pytorch_model.bin`` (loaded with ``torch.load(weights_only=True)``).

The architecture is read from ``config.json`` (``model_type``, ``architectures``, ``auto_map``);
the model is built on the meta device and the tensors are assigned into it (one copy in memory,
cast to ``dtype`` and moved to ``device`` tensor by tensor). Every checkpoint name must map onto a
parameter and every parameter must be present with the shape the config implies; otherwise a
:class:`CheckpointFormatError` names the folder, the offending names and what was expected.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from .errors import CheckpointFormatError, MissingCheckpointError, UnsupportedArchitectureError

PathLike = Union[str, "os.PathLike[str]"]
SAFE_INDEX, SAFE_SINGLE = "model.safetensors.index.json", "model.safetensors"
BIN_INDEX, BIN_SINGLE = "pytorch_model.bin.index.json", "pytorch_model.bin"
SUPPORTED = {
    "llada": "LLaDA (model_type 'llada', architectures ['LLaDAModelLM'], e.g. GSAI-ML/LLaDA-8B-Instruct)",
    "dream": "Dream (model_type 'Dream', architectures ['DreamModel'], e.g. Dream-org/Dream-v0-Instruct-7B)",
    "llada2_moe": "LLaDA2-MoE (model_type 'llada2_moe', architectures ['LLaDA2MoeModelLM'], "
                  "e.g. inclusionAI/LLaDA2.0-mini, inclusionAI/LLaDA2.1-mini)",
    "sdar": "SDAR (model_type 'sdar', architectures ['SDARForCausalLM'], e.g. JetLM/SDAR-4B-Chat)",
    "fast_dllm_qwen": "Fast-dLLM v2 (model_type 'Fast_dLLM_Qwen', architectures ['Fast_dLLM_QwenForCausalLM'], "
                      "e.g. Efficient-Large-Model/Fast_dLLM_v2_1.5B)",
    "lladamoe": "LLaDA-MoE (model_type 'llada' or 'lladamoe', architectures ['LLaDAMoEModelLM'], "
                "e.g. inclusionAI/LLaDA-MoE-7B-A1B-Instruct)",
}


_CLASSES = {"llada": ("LLaDAModelLM",), "dream": ("DreamModel",), "llada2_moe": ("LLaDA2MoeModelLM",),
            "sdar": ("SDARForCausalLM",), "fast_dllm_qwen": ("Fast_dLLM_QwenForCausalLM",),
            "lladamoe": ("LLaDAMoEModelLM",)}


def _list(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    return ", ".join(names[:20]) + (f", ... ({len(names)} files)" if len(names) > 20 else "") if names else "nothing"


def first_id(value: Any) -> Optional[int]:
    """A config's token id: the first of a list (``eos_token_id: [1, 2]``), ``None`` if unset or empty."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def read_config(folder: PathLike) -> dict:
    """The parsed ``config.json`` of a checkpoint folder."""
    folder = Path(folder)
    if not folder.exists():
        raise MissingCheckpointError(f"checkpoint folder {folder} does not exist")
    if not folder.is_dir():
        raise MissingCheckpointError(f"{folder} is a file, not a checkpoint folder (config.json + weights)")
    path = folder / "config.json"
    if not path.is_file():
        raise MissingCheckpointError(f"{path} is missing: a checkpoint folder needs config.json next to its weights "
                                     f"(found: {_list(folder)})")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointFormatError(f"{path} is not readable JSON: {e}") from e
    if not isinstance(config, dict):
        raise CheckpointFormatError(f"{path} must hold a JSON object, not {type(config).__name__}")
    return config


def detect_architecture(config: dict, where: str = "config.json") -> str:
    """``"llada"``, ``"dream"`` or ``"llada2_moe"``: ``model_type`` (case-insensitive), else the class
    names in ``architectures`` / ``auto_map`` (``LLaDAModelLM``, ``DreamModel``, ``LLaDA2MoeModelLM``).
    Relatives with other class names (LLaDA-MoE, dFactory's fused-expert ``llada2_moe_veomni`` ...)
    are refused rather than guessed."""
    model_type = str(config.get("model_type") or "")
    archs = [str(a) for a in (config.get("architectures") or [])]
    auto = config.get("auto_map") or {}
    auto_targets = [str(x) for v in auto.values() for x in (v if isinstance(v, (list, tuple)) else [v])]
    names = set(archs) | {t.rsplit(".", 1)[-1] for t in auto_targets}
    if model_type.lower() == "llada" and ("LLaDAMoEModelLM" in names or config.get("num_experts") is not None):
        return "lladamoe"  # the released LLaDA-MoE configs say model_type 'llada'
    if model_type.lower() in SUPPORTED:
        return model_type.lower()
    hits = sorted(key for key, classes in _CLASSES.items() if names & set(classes))
    if len(hits) == 1:
        return hits[0]
    supported = "; ".join(SUPPORTED.values())
    raise UnsupportedArchitectureError(
        f"{where} describes model_type={model_type!r}, architectures={archs}, auto_map={auto_targets}"
        + (f" (matches several: {hits})" if hits else "")
        + f"; the built-in architectures are: {supported}")


def _weight_index(folder: Path) -> tuple[str, dict[str, Path]]:
    """(format, {tensor name: file}) for the first weight layout present in ``folder``."""
    for index_name, fmt in ((SAFE_INDEX, "safetensors"), (BIN_INDEX, "bin")):
        index = folder / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise CheckpointFormatError(f"{index} is not a shard index with a 'weight_map': {e}") from e
            files = {name: folder / file for name, file in weight_map.items()}
            absent = sorted({str(p.name) for p in files.values() if not p.is_file()})
            if absent:
                raise MissingCheckpointError(f"{index} names shard(s) that are missing from {folder}: {absent}")
            return fmt, files
    single = folder / SAFE_SINGLE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return "safetensors", {name: single for name in f.keys()}
    single = folder / BIN_SINGLE
    if single.is_file():
        return "bin", {name: single for name in _torch_load(single)}
    raise MissingCheckpointError(
        f"no weights in {folder}: expected {SAFE_SINGLE}, {SAFE_INDEX} (+ shards), {BIN_SINGLE} or {BIN_INDEX} "
        f"(+ shards); found: {_list(folder)}")


_BIN_CACHE: dict[Path, dict] = {}


def _torch_load(path: Path) -> dict:
    if path not in _BIN_CACHE:
        try:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # legacy (non-zip) serialisation cannot be memory-mapped
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for corrupt files
            raise CheckpointFormatError(f"{path} could not be read as a torch state dict: {e}") from e
        if not isinstance(state, dict):
            raise CheckpointFormatError(f"{path} holds a {type(state).__name__}, not a state dict")
        _BIN_CACHE.clear()  # keep at most one shard mapped
        _BIN_CACHE[path] = state
    return _BIN_CACHE[path]


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def load_weights(model: nn.Module, folder: PathLike, *, dtype: Optional[torch.dtype] = None,
                 device: "torch.device | str | None" = None) -> None:
    """Assign the folder's tensors into ``model`` (built on any device, e.g. meta).

    ``model`` must provide ``checkpoint_name(param_name)`` and ``ignored_checkpoint_keys``.
    ``dtype=None`` keeps the dtype of the stored embedding for every tensor. Parameters matching a
    regex of the model's optional ``float32_parameters`` (LLaDA2's router) stay float32 whatever
    ``dtype`` is.
    """
    folder = Path(folder)
    fmt, files = _weight_index(folder)
    params = dict(model.state_dict(keep_vars=True))
    expected = {model.checkpoint_name(name): name for name in params}
    ignore = [re.compile(p) for p in model.ignored_checkpoint_keys]
    unexpected = sorted(k for k in files if k not in expected and not any(p.search(k) for p in ignore))
    missing = sorted(k for k in expected if k not in files)
    arch = getattr(model, "arch_name", type(model).__name__)
    if unexpected or missing:
        parts = []
        if missing:
            parts.append(f"missing weights the {arch} config requires: {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected weights the {arch} architecture has no place for: {_names(unexpected)}")
        raise CheckpointFormatError(
            f"the weights in {folder} do not match its config.json ({'; '.join(parts)}); a checkpoint of this "
            f"config has {len(expected)} tensors named like {_names(sorted(expected), 3)}")
    try:
        _assign(model, folder, fmt, files, expected, params, arch, dtype, device)
    finally:
        _BIN_CACHE.clear()


def _assign(model: nn.Module, folder: Path, fmt: str, files: dict, expected: dict, params: dict, arch: str,
            dtype: Optional[torch.dtype], device: "torch.device | str | None") -> None:
    device = torch.device(device) if device is not None else torch.device("cpu")
    by_file: dict[Path, list[str]] = {}
    for key in expected:
        by_file.setdefault(files[key], []).append(key)
    state: dict[str, torch.Tensor] = {}
    keep32 = [re.compile(p) for p in getattr(model, "float32_parameters", ())]
    for path, keys in by_file.items():
        for key, tensor in _read(path, keys, fmt):
            target = params[expected[key]]
            if tuple(tensor.shape) != tuple(target.shape):
                raise CheckpointFormatError(
                    f"{key} in {path.name} has shape {list(tensor.shape)} but the config.json of {folder} implies "
                    f"{list(target.shape)} for the {arch} parameter {expected[key]}")
            if any(p.search(expected[key]) for p in keep32):
                state[expected[key]] = tensor.to(device=device, dtype=torch.float32)
                continue
            if dtype is None:
                dtype = tensor.dtype if tensor.is_floating_point() else torch.float32
            state[expected[key]] = tensor.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)


def _read(path: Path, keys: list[str], fmt: str):
    embeddings = ("wte.weight", "embed_tokens.weight", "word_embeddings.weight")
    keys = sorted(keys, key=lambda k: (not k.endswith(embeddings), k))  # embedding first
    if fmt == "safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                for key in keys:
                    yield key, f.get_tensor(key)
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointFormatError(f"{path} could not be read as safetensors: {e}") from e
    else:
        state = _torch_load(path)
        for key in keys:
            yield key, state[key]


def load_pretrained(cls: Any, folder: PathLike, *, dtype: Optional[torch.dtype] = None,
                    device: "torch.device | str | None" = None) -> nn.Module:
    """Build ``cls`` (a LLaDA, Dream or LLaDA2-MoE module class) from ``folder`` on the meta device and load it."""
    folder = Path(folder)
    config = read_config(folder)
    found = detect_architecture(config, str(folder / "config.json"))
    if found != cls.arch_key:
        raise UnsupportedArchitectureError(
            f"{folder / 'config.json'} describes a {SUPPORTED[found]} checkpoint, not {cls.arch_name}; "
            f"use load_architecture(folder) to pick the class from the config")
    arch_config = cls.config_class.from_hf_config(config)
    with torch.device("meta"):
        model = cls(arch_config)
    load_weights(model, folder, dtype=dtype, device=device)
    model.requires_grad_(False)
    return model.eval()
