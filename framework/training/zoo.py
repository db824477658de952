"""Built-in model names, the saved-model folder format, and :func:`load_model`.

A saved tiny denoiser is a folder (loadable with torch and json alone, no Lightning)::

    config.json    {"format": "adaptive-decoding.tiny-denoiser", "format_version": 1,
                    "model": TinyConfig fields, "task": ..., "task_params": ..., "vocab": [...],
                    "recipe": the training recipe}
    model.pt       the state dict (torch.save; loaded with weights_only=True)
    metrics.json   test exact match with one-token-per-step decoding, steps, seconds

Built-in names (``tiny-addition``, ``tiny-sorting``, ``tiny-sudoku``, ``tiny-pairs``) live in
``default_cache_dir()/models/<name>``; :func:`load_model` trains them on first use (about 10 CPU
minutes each) and reuses them afterwards. ``tiny-sudoku9`` ships with the package
(``framework/models/weights/tiny-sudoku9``, about 3.4 MB, with the command that reproduces it), so
it needs no training; a folder of that name in the cache takes precedence. A folder holding a Hugging Face ``config.json``, or a
hub name ``org/name`` found in the local Hugging Face cache, is delegated to
:func:`framework.models.hub_loading.load_hub_model`. Nothing here ever downloads or deletes a file.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from framework.core.registry import Registry, UnknownNameError
from framework.models.protocol import LoadedModel
from framework.models.saved import (
    CONFIG_FILE,
    CheckpointError,
    folder_lock,
    looks_like_path,
    read_json,
    is_saved_model,
    load_pretrained,
    model_dir,
)


@dataclass(frozen=True)
class ModelSpec:
    """A built-in model: which task it is trained on, with which recipe overrides."""

    task: str
    description: str = ""
    size: Optional[str] = None
    seed: int = 0

    def recipe(self) -> dict[str, Any]:
        from framework.training.masked_diffusion import recipe_for

        r = recipe_for(self.task).to_dict()
        if self.size is not None:
            r["size"] = self.size
        r["seed"] = self.seed
        return r


MODELS: Registry[ModelSpec] = Registry("model", entry_point_group="adaptive_decoding.models")
MODELS.add("tiny-addition", ModelSpec("addition", "3-digit addition, tiny bidirectional Transformer"))
MODELS.add("tiny-sorting", ModelSpec("sorting", "sort 4-8 digits, tiny bidirectional Transformer"))
MODELS.add("tiny-sudoku", ModelSpec("sudoku", "4x4 Sudoku, tiny bidirectional Transformer"))
MODELS.add("tiny-sudoku9", ModelSpec("sudoku9", "9x9 Sudoku, Transformer with row/column/box attention"))
MODELS.add("tiny-phrases", ModelSpec("phrases", "pairs at scale: up to 42 phrase slots in 128 tokens"))
MODELS.add("tiny-pairs", ModelSpec("pairs", "paired phrases (New York / San Francisco), tiny Transformer"))


def _no_query_chunk(query_chunk: Optional[int], name: str) -> None:
    if query_chunk is not None:
        from framework.models.hub_adapters import HubModelError

        raise HubModelError(f"query_chunk={query_chunk} (--query-chunk) applies to the framework's own LLaDA and Dream "
                         f"implementations (a Hugging Face checkpoint folder or a cached hub name); {name!r} is a "
                         f"model of this project's own format")


def load_model(name_or_path: str, device: str = "cpu", train_if_missing: bool = True,
               progress: bool = True, *, dtype: Any = None, trust_remote_code: bool = False,
               chat: Optional[bool] = None, query_chunk: Optional[int] = None) -> LoadedModel:
    """A ready :class:`LoadedModel` from a folder, a built-in name or a cached hub name.

    Tried in this order:

    * a folder in this project's format: loaded directly;
    * a folder with a Hugging Face ``config.json``: :func:`framework.models.hub_loading.load_hub_model`;
    * a built-in name (``tiny-addition`` ...): loaded from the cache, trained first if missing and
      ``train_if_missing`` (else :class:`CheckpointError` naming the missing file);
    * a hub name ``org/name``: its snapshot in the local Hugging Face cache (``HF_HUB_CACHE`` /
      ``HF_HOME``), never downloaded; a missing one raises
      :class:`framework.models.hub_adapters.ModelNotCachedError` with the command that fetches it.

    Args:
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:N``.
        dtype: for Hugging Face checkpoints ``auto`` = bfloat16 on a GPU, float32 on CPU; the tiny
            models stay in float32 unless a dtype is named (``float32``, ``bfloat16``, ``float16``).
        trust_remote_code: let a checkpoint run its own modeling code (off: such a checkpoint is
            refused with a message naming ``--trust-remote-code``).
        chat: wrap prompts in the tokenizer's chat template; ``None`` = when it has one.
        query_chunk: the framework's own LLaDA / Dream only: queries per chunk of a full forward
            (``MaskedDiffusionLM.query_chunk``, for memory); refused for any other model.

    A missing or corrupt file raises :class:`CheckpointError` naming it; nothing is deleted.
    A name that is none of these raises an error listing what was tried.
    """
    from framework.models.hub_loading import looks_like_hub_name, resolve_device, resolve_dtype

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)  # validates the name before any work
    hub = dict(device=device, dtype=dtype, trust_remote_code=trust_remote_code, chat=chat, query_chunk=query_chunk)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if is_saved_model(path):
            _no_query_chunk(query_chunk, name_or_path)
            return _cast(load_pretrained(path, device=device), dtype, torch_dtype)
        cfg = path / CONFIG_FILE
        if not cfg.is_file():
            raise CheckpointError(f"{cfg}: file not found (a model folder needs a config.json: this "
                                  f"project's format or a Hugging Face model)")
        read_json(cfg)  # a corrupt config.json is reported here, naming the file
        from framework.models.hub_loading import load_hub_model

        return load_hub_model(str(path), **hub)
    if name_or_path == "tiny-text":  # the character-level English model has its own tokenizer
        _no_query_chunk(query_chunk, name_or_path)
        from framework.training.text_model import load_text_model

        loaded = load_text_model(device=device, train_if_missing=train_if_missing, progress=progress)
        return _cast(loaded, dtype, torch_dtype)
    if name_or_path not in MODELS:
        if looks_like_hub_name(name_or_path) and not path.exists():
            from framework.models.hub_adapters import ModelNotCachedError
            from framework.models.hub_loading import load_hub_model

            try:
                return load_hub_model(name_or_path, **hub)
            except ModelNotCachedError as exc:  # it says how to fetch the model; add what else was tried
                raise ModelNotCachedError(
                    f"{exc}. Also tried: a folder {path.resolve()} (does not exist); a built-in model name "
                    f"(known: {', '.join(MODELS.names())}, tiny-text)") from None
        tried = _tried(name_or_path, path)
        if looks_like_path(name_or_path) or path.exists():
            raise CheckpointError(f"{path}: no such model folder. Tried: {tried}")
        raise UnknownNameError(f"unknown model {name_or_path!r} (and no such folder). Tried: {tried}")
    _no_query_chunk(query_chunk, name_or_path)
    spec: ModelSpec = MODELS.get(name_or_path)
    folder = model_dir(name_or_path)
    shipped = packaged_dir(name_or_path)
    if not (folder / CONFIG_FILE).exists() and (shipped / CONFIG_FILE).exists():
        folder = shipped  # weights that ship with the package; a trained copy in the cache wins
    if not (folder / CONFIG_FILE).exists():
        if not train_if_missing:
            raise CheckpointError(
                f"{folder / CONFIG_FILE}: file not found (model {name_or_path!r} is not trained yet; "
                f"run 'adec train-denoiser --task {spec.task} --out {folder}' or load it with "
                f"train_if_missing=True)"
            )
        _train_builtin(name_or_path, spec, folder, progress=progress)
    loaded = load_pretrained(folder, device=device, name=name_or_path)
    want = spec.recipe()
    have = loaded.info.get("recipe") or {}
    if have and any(have.get(k) != v for k, v in want.items()):
        warnings.warn(
            f"{folder}: trained with an older recipe than the current default of {name_or_path!r}; "
            f"it is used as is (move the folder away to retrain)", UserWarning, stacklevel=2,
        )
    return _cast(loaded, dtype, torch_dtype)


#: built-in models whose weights ship inside the package (framework/models/weights/<name>), so the
#: README's main job runs without training; each folder's recipe.md says how to reproduce it
PACKAGED_WEIGHTS = Path(__file__).resolve().parent.parent / "models" / "weights"


def packaged_dir(name: str) -> Path:
    """Folder of a built-in model's packaged weights (it may not exist)."""
    return PACKAGED_WEIGHTS / name


def _tried(name: str, path: Path) -> str:
    """What :func:`load_model` looked for, for its error message."""
    from framework.models.hub_loading import hub_cache_dir, looks_like_hub_name

    folder = f"a folder {path.resolve()} ({'exists but is not a directory' if path.exists() else 'does not exist'})"
    known = f"a built-in model name (known: {', '.join(MODELS.names())}, tiny-text)"
    if looks_like_hub_name(name):
        hub = f"a hub name in the local Hugging Face cache {hub_cache_dir()} (skipped: a file of that name exists)"
    else:
        hub = f"a hub name (not tried: {name!r} is not of the form org/name)"
    return f"{folder}; {known}; {hub}"


def _cast(loaded: LoadedModel, dtype: Any, torch_dtype: Any) -> LoadedModel:
    """The tiny models keep float32 unless a dtype is named explicitly (``auto`` leaves them)."""
    if dtype not in (None, "auto") and torch_dtype is not None:
        loaded.denoiser.to(torch_dtype)
        loaded.info["dtype"] = str(torch_dtype)
    return loaded


def _train_builtin(name: str, spec: ModelSpec, folder: Path, progress: bool) -> None:
    from framework.training.masked_diffusion import train_denoiser

    with folder_lock(folder.parent / f".{name}.lock"):
        if (folder / CONFIG_FILE).exists():  # another process finished it meanwhile
            return
        if folder.exists() and any(folder.iterdir()):
            raise CheckpointError(
                f"{folder / CONFIG_FILE}: file not found, but {folder} holds other files (an interrupted "
                f"run?); move the folder away to retrain, nothing was deleted"
            )
        recipe = spec.recipe()
        print(f"adec: model {name!r} is not in the cache; training it on task {spec.task!r} "
              f"(about {recipe['max_minutes']:g} min on CPU) into {folder}", file=sys.stderr, flush=True)
        staging = folder.parent / f".{name}.partial-{os.getpid()}"
        mode = os.environ.get("WANDB_MODE", "offline")
        result = train_denoiser(spec.task, out_dir=staging, seed=spec.seed, model_size=spec.size,
                                progress=progress, wandb_mode=mode if mode in ("online", "disabled") else "offline")
        if folder.exists():
            folder.rmdir()  # empty (checked above)
        os.replace(staging, folder)
        print(f"adec: {result.summary().replace(str(staging), str(folder))}", file=sys.stderr, flush=True)
