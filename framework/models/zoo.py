"""Every kind of model name resolved and loaded in one place: :func:`load_model`.

A saved tiny denoiser is a folder (loadable with torch and json alone, no Lightning)::

    config.json    {"format": "adaptive-decoding.tiny-denoiser", "format_version": 1,
                    "model": TinyConfig fields, "task": ..., "task_params": ..., "vocab": [...],
                    "recipe": the training recipe}
    model.pt       the state dict (torch.save; loaded with weights_only=True)
    metrics.json   test exact match with one-token-per-step decoding, steps, seconds

Built-in names come from the tasks: a task class that declares ``model_name`` (``tiny-addition``,
``tiny-sorting`` ...) adds a :class:`ModelSpec` to :data:`MODELS`. They live in
``default_cache_dir()/models/<name>``. ``tiny-sudoku9`` ships with the package
(``framework/models/weights/tiny-sudoku9``, with the command that reproduces it); a folder of that
name in the cache takes precedence. A folder holding a Hugging Face ``config.json``, or a hub name
``org/name`` found in the local Hugging Face cache, is delegated to
:func:`adaptive_decoding.framework.models.hub_loading.load_hub_model`. Nothing here downloads or deletes a file.

Training a missing built-in model is not loading: the training layer registers a builder
(:func:`register_missing_builder`, done by ``import adaptive_decoding.framework.training``) that :func:`load_model`
calls when ``train_if_missing``; without one, a missing model is a :class:`CheckpointError` that says
how to train it. Loading a real checkpoint never imports ``adaptive_decoding.framework.training``.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from adaptive_decoding.framework.core.registry import Registry, UnknownNameError
from adaptive_decoding.framework.models.protocol import LoadedModel
from adaptive_decoding.framework.models.saved import (
    CONFIG_FILE,
    CheckpointError,
    default_cache_dir,
    is_saved_model,
    load_pretrained,
    looks_like_path,
    model_dir,
    read_json,
)
from adaptive_decoding.framework.models.tiny import MODEL_SIZES, TinyConfig, TinyDenoiser
from adaptive_decoding.framework.tasks.text import (
    TEXT_MODEL,  # the character-level English model (its own tokenizer)
)


@dataclass(frozen=True)
class ModelSpec:
    """A built-in model: which task it is trained on, with which recipe overrides; a block size
    (block diffusion) and a built-in model to warm-start from, for a task's model variants."""

    task: str
    description: str = ""
    size: Optional[str] = None
    seed: int = 0
    block_size: Optional[int] = None
    init_from: Optional[str] = None
    overrides: tuple[tuple[str, Any], ...] = ()

    def recipe(self) -> dict[str, Any]:
        """The task's declared recipe (``Task.recipe``) with this model's size, seed and overrides;
        with a block size, ``size`` becomes the preset's fields plus ``block_size``."""
        from adaptive_decoding.framework.tasks.base import recipe_for

        r = recipe_for(self.task).to_dict()
        if self.size is not None:
            r["size"] = self.size
        r.update(dict(self.overrides))
        if self.block_size is not None:
            preset = r["size"] if isinstance(r["size"], dict) else MODEL_SIZES[r["size"]]
            r["size"] = dict(preset, block_size=self.block_size)
        r["seed"] = self.seed
        return r

    def training_overrides(self) -> dict[str, Any]:
        """What ``train_denoiser`` is given for this model beyond the task's recipe (flat names)."""
        r = self.recipe()
        out = {k: r[k] for k, _ in self.overrides}
        out.update(model_size=r["size"], seed=self.seed, init_from=self.init_from)
        return out


class ModelRegistry(Registry[ModelSpec]):
    """:class:`Registry` of built-in model names that also lists, on every lookup, the model each
    registered task declares (``Task.model_name``, and its ``Task.model_variants``), so a new task
    needs no line here."""

    def sync_tasks(self) -> None:
        from adaptive_decoding.framework.tasks.base import builtin_model_variants, builtin_models

        for model, task, description in builtin_models():
            if not Registry.__contains__(self, model):
                self.add(model, ModelSpec(task, description))
        for task, v in builtin_model_variants():
            if not Registry.__contains__(self, v.name):
                self.add(v.name, ModelSpec(task, v.description, block_size=v.block_size, init_from=v.init_from,
                                           overrides=tuple(v.recipe)))

    def get(self, name: str) -> ModelSpec:
        self.sync_tasks()
        return super().get(name)

    def names(self) -> list[str]:
        self.sync_tasks()
        return super().names()

    def __contains__(self, name: str) -> bool:
        self.sync_tasks()
        return super().__contains__(name)


MODELS: ModelRegistry = ModelRegistry("model", entry_point_group="adaptive_decoding.models")

#: built-in models whose weights ship inside the package (framework/models/weights/<name>), so the
#: README's main job runs without training; each folder's recipe.md says how to reproduce it
PACKAGED_WEIGHTS = Path(__file__).resolve().parent / "weights"

#: what trains a missing built-in model into its folder: ``builder(name, folder, progress)``;
#: ``"denoiser"`` for the names of :data:`MODELS`, ``"text"`` for ``tiny-text``
MissingBuilder = Callable[[str, Path, bool], None]
MISSING_BUILDERS: dict[str, MissingBuilder] = {}


def register_missing_builder(kind: str, builder: MissingBuilder) -> None:
    """Let :func:`load_model` train a missing built-in model of ``kind`` (``denoiser`` or ``text``)."""
    if kind not in ("denoiser", "text"):
        raise ValueError(f"missing-model builder kind {kind!r}; allowed: denoiser, text")
    MISSING_BUILDERS[kind] = builder


def packaged_dir(name: str) -> Path:
    """Folder of a built-in model's packaged weights (it may not exist)."""
    return PACKAGED_WEIGHTS / name


def text_model_dir() -> Path:
    """Cache folder of ``tiny-text``."""
    return default_cache_dir() / "models" / TEXT_MODEL


# ---------------------------------------------------------------------- the entry point
def load_model(name_or_path: str, device: str = "cpu", train_if_missing: bool = True,
               progress: bool = True, *, dtype: Any = None, trust_remote_code: bool = False,
               chat: Optional[bool] = None, query_chunk: Optional[int] = None) -> LoadedModel:
    """A ready :class:`LoadedModel` from a folder, a built-in name or a cached hub name.

    Tried in this order:

    * a folder in this project's format: loaded directly;
    * a folder with a Hugging Face ``config.json``: :func:`adaptive_decoding.framework.models.hub_loading.load_hub_model`;
    * a built-in name (``tiny-addition`` ..., ``tiny-text``): loaded from the cache (or the package);
      a missing one is trained first when ``train_if_missing`` and the training layer registered a
      builder (``import adaptive_decoding.framework.training``), else :class:`CheckpointError` naming the missing file;
    * a hub name ``org/name``: its snapshot in the local Hugging Face cache (``HF_HUB_CACHE`` /
      ``HF_HOME``), never downloaded; a missing one raises
      :class:`adaptive_decoding.framework.models.hub_adapters.ModelNotCachedError` with the command that fetches it.

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
    from adaptive_decoding.framework.models.hub_loading import resolve_device, resolve_dtype

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)  # validates the name before any work
    hub = dict(device=device, dtype=dtype, trust_remote_code=trust_remote_code, chat=chat, query_chunk=query_chunk)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _load_folder(path, name_or_path, hub, torch_dtype)
    if name_or_path != TEXT_MODEL and name_or_path not in MODELS:
        return _load_hub_name(name_or_path, path, hub)
    _no_query_chunk(query_chunk, name_or_path)
    if name_or_path == TEXT_MODEL:  # the character-level English model has its own tokenizer
        loaded = load_text_model(device=device, train_if_missing=train_if_missing, progress=progress)
    else:
        loaded = load_builtin(name_or_path, device=device, train_if_missing=train_if_missing, progress=progress)
    return cast_dtype(loaded, dtype, torch_dtype)


def builtin_model_of(task_cls: type, task_name: str) -> Optional[str]:
    """The built-in model of a task class: its own ``Task.model_name``, else ``tiny-<task>``, when that
    is a built-in name; ``None`` for a task without one (``data``, ``lm_eval``: the researcher's model)."""
    name = vars(task_cls).get("model_name") or f"tiny-{task_name}"
    return name if name in MODELS or name == TEXT_MODEL else None


def default_model_name(task: Any) -> str:
    """The model a workflow runs ``task`` on when none is named (:func:`builtin_model_of`); a task
    without a built-in model fails naming ``--model``."""
    name = builtin_model_of(type(task), task.name)
    if name is None:
        from adaptive_decoding.framework.core.params import ParameterError

        raise ParameterError(
            f"task {task.name!r} has no built-in model; name one with --model (or model: in an experiment "
            f"file): a checkpoint folder, a built-in name ({', '.join(MODELS.names())}) or a hub name "
            f"org/name from the local Hugging Face cache")
    return name


def load_model_for_task(task: Any, model: Optional[str] = None, **options: Any) -> tuple[LoadedModel, str]:
    """``(loaded model, its name)`` for a workflow on ``task``: ``model`` (a folder, a built-in or a hub
    name; default :func:`default_model_name`) loaded by :func:`load_model` with ``options`` (``device``,
    ``dtype``, ``trust_remote_code``, ``query_chunk``, ``chat`` ...). ``chat=None`` takes the task's own
    wish (``task.model_chat()``, the ``data`` task's ``chat`` parameter) where it has one."""
    name = model or default_model_name(task)
    if options.get("chat") is None and callable(getattr(task, "model_chat", None)):
        options["chat"] = task.model_chat()
    return load_model(name, **options), name


def _load_folder(path: Path, name: str, hub: dict, torch_dtype: Any) -> LoadedModel:
    """A folder: this project's format, else a Hugging Face checkpoint."""
    if is_saved_model(path):
        _no_query_chunk(hub["query_chunk"], name)
        return cast_dtype(load_pretrained(path, device=hub["device"]), hub["dtype"], torch_dtype)
    cfg = path / CONFIG_FILE
    if not cfg.is_file():
        raise CheckpointError(f"{cfg}: file not found (a model folder needs a config.json: this "
                              f"project's format or a Hugging Face model)")
    read_json(cfg)  # a corrupt config.json is reported here, naming the file
    from adaptive_decoding.framework.models.hub_loading import load_hub_model

    return load_hub_model(str(path), **hub)


def _load_hub_name(name: str, path: Path, hub: dict) -> LoadedModel:
    """A hub name ``org/name`` from the local cache; anything else fails listing what was tried."""
    from adaptive_decoding.framework.models.hub_loading import looks_like_hub_name

    if looks_like_hub_name(name) and not path.exists():
        from adaptive_decoding.framework.models.hub_adapters import ModelNotCachedError
        from adaptive_decoding.framework.models.hub_loading import load_hub_model

        try:
            return load_hub_model(name, **hub)
        except ModelNotCachedError as exc:  # it says how to fetch the model; add what else was tried
            raise ModelNotCachedError(
                f"{exc}. Also tried: a folder {path.resolve()} (does not exist); a built-in model name "
                f"(known: {', '.join(MODELS.names())}, {TEXT_MODEL})") from None
    tried = _tried(name, path)
    if looks_like_path(name) or path.exists():
        raise CheckpointError(f"{path}: no such model folder. Tried: {tried}")
    raise UnknownNameError(f"unknown model {name!r} (and no such folder). Tried: {tried}")


def load_builtin(name: str, device: str = "cpu", train_if_missing: bool = True, progress: bool = True) -> LoadedModel:
    """A built-in model of :data:`MODELS` from the cache, else the package, else trained by the
    registered ``denoiser`` builder when ``train_if_missing``."""
    spec: ModelSpec = MODELS.get(name)
    folder = model_dir(name)
    shipped = packaged_dir(name)
    if not (folder / CONFIG_FILE).exists() and (shipped / CONFIG_FILE).exists():
        folder = shipped  # weights that ship with the package; a trained copy in the cache wins
    if not (folder / CONFIG_FILE).exists():
        _build_missing("denoiser", name, folder, train_if_missing, progress,
                       f"{folder / CONFIG_FILE}: file not found (model {name!r} is not trained yet; run "
                       f"'adec train-denoiser --task {spec.task} --out {folder}'")
    loaded = load_pretrained(folder, device=device, name=name)
    want = spec.recipe()
    have = loaded.info.get("recipe") or {}
    if have and any(have.get(k) != v for k, v in want.items()):
        warnings.warn(
            f"{folder}: trained with an older recipe than the current default of {name!r}; "
            f"it is used as is (move the folder away to retrain)", UserWarning, stacklevel=3,
        )
    return loaded


def _build_missing(kind: str, name: str, folder: Path, train_if_missing: bool, progress: bool, missing: str) -> None:
    builder = MISSING_BUILDERS.get(kind)
    if not train_if_missing:
        raise CheckpointError(f"{missing} or load it with train_if_missing=True)")
    if builder is None:
        raise CheckpointError(f"{missing}, or import adaptive_decoding.framework.training first so that load_model can train it)")
    builder(name, folder, progress)


def _tried(name: str, path: Path) -> str:
    """What :func:`load_model` looked for, for its error message."""
    from adaptive_decoding.framework.models.hub_loading import hub_cache_dir, looks_like_hub_name

    folder = f"a folder {path.resolve()} ({'exists but is not a directory' if path.exists() else 'does not exist'})"
    known = f"a built-in model name (known: {', '.join(MODELS.names())}, {TEXT_MODEL})"
    if looks_like_hub_name(name):
        hub = f"a hub name in the local Hugging Face cache {hub_cache_dir()} (skipped: a file of that name exists)"
    else:
        hub = f"a hub name (not tried: {name!r} is not of the form org/name)"
    return f"{folder}; {known}; {hub}"


def _no_query_chunk(query_chunk: Optional[int], name: str) -> None:
    if query_chunk is not None:
        from adaptive_decoding.framework.models.hub_adapters import HubModelError

        raise HubModelError(f"query_chunk={query_chunk} (--query-chunk) applies to the framework's own LLaDA and Dream "
                            f"implementations (a Hugging Face checkpoint folder or a cached hub name); {name!r} is a "
                            f"model of this project's own format")


def cast_dtype(loaded: LoadedModel, dtype: Any, torch_dtype: Any) -> LoadedModel:
    """The tiny models keep float32 unless a dtype is named explicitly (``auto`` leaves them)."""
    if dtype not in (None, "auto") and torch_dtype is not None:
        loaded.denoiser.to(torch_dtype)
        loaded.info["dtype"] = str(torch_dtype)
    return loaded


# ---------------------------------------------------------------------- tiny-text
def load_text_folder(folder: "str | os.PathLike", device: str = "cpu", name: Optional[str] = None) -> LoadedModel:
    """A :class:`LoadedModel` of a folder written by ``adaptive_decoding.framework.training.text_model.train_text_model``
    (``config.json``, ``model.pt``, ``text.json`` with the vocabulary and the corpus fingerprint)."""
    from adaptive_decoding.framework.tasks.text import TextTask, corpus_fingerprint

    folder = Path(folder)
    for f in ("config.json", "model.pt", "text.json"):
        if not (folder / f).is_file():
            raise CheckpointError(f"{folder / f}: file not found (not a tiny-text model folder)")
    meta = json.loads((folder / "text.json").read_text())
    task = TextTask(**meta.get("task_params", {}))
    tok = task.tokenizer
    if list(meta["vocab"]) != list(tok.vocab):
        raise CheckpointError(
            f"{folder / 'text.json'}: vocabulary differs from this machine's corpus (fingerprint "
            f"{meta.get('corpus_fingerprint')} vs {corpus_fingerprint()}: another Python or scikit-learn "
            f"version?); move the folder away to retrain")
    cfg = json.loads((folder / "config.json").read_text())
    den = TinyDenoiser(TinyConfig(**cfg["model"]))
    den.load_state_dict(torch.load(folder / "model.pt", map_location="cpu", weights_only=True))
    metrics = json.loads((folder / "metrics.json").read_text()) if (folder / "metrics.json").is_file() else {}
    return LoadedModel(denoiser=den.to(device).eval(), tokenizer=tok, name=name or str(folder), task="text",
                       info={"path": str(folder), "task_params": task.get_params(), "metrics": metrics,
                             "corpus_fingerprint": meta.get("corpus_fingerprint")})


def load_text_model(device: str = "cpu", train_if_missing: bool = True, progress: bool = True) -> LoadedModel:
    """The cached ``tiny-text`` model; a missing one is trained by the registered ``text`` builder."""
    folder = text_model_dir()
    if not (folder / "text.json").is_file():
        _build_missing("text", TEXT_MODEL, folder, train_if_missing, progress,
                       f"{folder / 'text.json'}: file not found (tiny-text is not trained yet")
    return load_text_folder(folder, device=device, name=TEXT_MODEL)
