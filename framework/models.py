"""Built-in model names, the saved-model folder format, and :func:`load_model`.

A saved tiny denoiser is a folder (loadable with torch and json alone, no Lightning)::

    config.json    {"format": "adaptive-decoding.tiny-denoiser", "format_version": 1,
                    "model": TinyConfig fields, "task": ..., "task_params": ..., "vocab": [...],
                    "recipe": the training recipe}
    model.pt       the state dict (torch.save; loaded with weights_only=True)
    metrics.json   test exact match with one-token-per-step decoding, steps, seconds

Built-in names (``tiny-addition``, ``tiny-sorting``, ``tiny-sudoku``, ``tiny-pairs``) live in
``default_cache_dir()/models/<name>``; :func:`load_model` trains them on first use (about 10 CPU
minutes each) and reuses them afterwards. A folder holding a Hugging Face ``config.json`` is
delegated to :func:`framework.hub.load_hub_model`. Nothing here ever deletes a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from .denoiser import LoadedModel, TinyConfig, TinyDenoiser
from .registry import Registry, UnknownNameError

FORMAT = "adaptive-decoding.tiny-denoiser"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE = "config.json", "model.pt", "metrics.json"


class CheckpointError(FileNotFoundError):
    """A missing or unreadable model folder; the message names the file and why."""


@dataclass(frozen=True)
class ModelSpec:
    """A built-in model: which task it is trained on, with which recipe overrides."""

    task: str
    description: str = ""
    size: Optional[str] = None
    seed: int = 0

    def recipe(self) -> dict[str, Any]:
        from .training import recipe_for

        r = recipe_for(self.task).to_dict()
        if self.size is not None:
            r["size"] = self.size
        r["seed"] = self.seed
        return r


MODELS: Registry[ModelSpec] = Registry("model", entry_point_group="adaptive_decoding.models")
MODELS.add("tiny-addition", ModelSpec("addition", "3-digit addition, tiny bidirectional Transformer"))
MODELS.add("tiny-sorting", ModelSpec("sorting", "sort 4-8 digits, tiny bidirectional Transformer"))
MODELS.add("tiny-sudoku", ModelSpec("sudoku", "4x4 Sudoku, tiny bidirectional Transformer"))
MODELS.add("tiny-pairs", ModelSpec("pairs", "paired phrases (New York / San Francisco), tiny Transformer"))


def default_cache_dir() -> Path:
    """``$ADEC_CACHE``, else ``~/.cache/adaptive-decoding``."""
    env = os.environ.get("ADEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "adaptive-decoding"


def model_dir(name: str) -> Path:
    """Cache folder of a built-in model."""
    return default_cache_dir() / "models" / name


# ---------------------------------------------------------------------- save / load one folder
def save_pretrained(folder: "str | os.PathLike", denoiser: TinyDenoiser, *, task: Any, recipe: dict,
                    metrics: dict) -> Path:
    """Write ``config.json``, ``model.pt`` and ``metrics.json`` of a trained tiny denoiser."""
    from .vocab import get_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "model": denoiser.config.to_dict(),
        "task": task.name, "task_params": task.get_params(), "vocab": list(get_tokenizer().vocab),
        "recipe": recipe,
    }
    state = {k: v.detach().cpu() for k, v in denoiser.state_dict().items()}
    torch.save(state, folder / WEIGHTS_FILE)
    (folder / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")  # last: marks completeness
    return folder


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def is_saved_model(folder: "str | os.PathLike") -> bool:
    """Whether ``folder/config.json`` declares this project's format."""
    try:
        return _read_json(Path(folder) / CONFIG_FILE).get("format") == FORMAT
    except CheckpointError:
        return False


def load_pretrained(folder: "str | os.PathLike", device: str = "cpu", name: Optional[str] = None) -> LoadedModel:
    """Load a folder written by :func:`save_pretrained` (torch and json only)."""
    from .vocab import get_tokenizer

    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    cfg = _read_json(cfg_path)
    if cfg.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_path}: format {cfg.get('format')!r} is not {FORMAT!r}")
    if int(cfg.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(f"{cfg_path}: format_version {cfg.get('format_version')} is newer than "
                              f"this code understands ({FORMAT_VERSION}); upgrade adaptive-decoding")
    tok = get_tokenizer()
    if cfg.get("vocab") is not None and list(cfg["vocab"]) != list(tok.vocab):
        raise CheckpointError(f"{cfg_path}: vocabulary differs from the current TaskTokenizer "
                              f"({len(cfg['vocab'])} vs {tok.vocab_size} tokens); retrain the model")
    try:
        config = TinyConfig(**cfg["model"])
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{cfg_path}: bad 'model' section ({exc})") from None
    if not w_path.is_file():
        raise CheckpointError(f"{w_path}: file not found")
    try:
        state = torch.load(w_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a corrupt file
        raise CheckpointError(f"{w_path}: cannot be read as a torch state dict ({type(exc).__name__}: {exc})") from None
    denoiser = TinyDenoiser(config)
    try:
        denoiser.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{w_path}: does not match {cfg_path} ({str(exc).splitlines()[0]})") from None
    denoiser.to(device).eval()
    metrics: dict = {}
    with contextlib.suppress(CheckpointError):
        metrics = _read_json(folder / METRICS_FILE)
    return LoadedModel(
        denoiser=denoiser, tokenizer=tok, name=name or str(folder), task=cfg.get("task"),
        info={"path": str(folder), "format": FORMAT, "task_params": cfg.get("task_params", {}),
              "recipe": cfg.get("recipe", {}), "metrics": metrics},
    )


# ---------------------------------------------------------------------- load by name or path
@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive file lock (so two processes do not train the same built-in model at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        yield


def _looks_like_path(text: str) -> bool:
    return os.sep in text or text.startswith((".", "~")) or (os.altsep is not None and os.altsep in text)


def load_model(name_or_path: str, device: str = "cpu", train_if_missing: bool = True,
               progress: bool = True) -> LoadedModel:
    """A ready :class:`LoadedModel` from a built-in name or a local folder.

    * a built-in name (``tiny-addition`` ...): loaded from the cache, trained first if missing and
      ``train_if_missing`` (else :class:`CheckpointError` naming the missing file);
    * a folder in this project's format: loaded directly;
    * a folder with a Hugging Face ``config.json``: :func:`framework.hub.load_hub_model`.

    A missing or corrupt file raises :class:`CheckpointError` naming it; nothing is deleted.
    Unknown names raise :class:`framework.registry.UnknownNameError` listing the known models.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if is_saved_model(path):
            return load_pretrained(path, device=device)
        cfg = path / CONFIG_FILE
        if not cfg.is_file():
            raise CheckpointError(f"{cfg}: file not found (a model folder needs a config.json: this "
                                  f"project's format or a Hugging Face model)")
        _read_json(cfg)  # a corrupt config.json is reported here, naming the file
        from .hub import load_hub_model

        return load_hub_model(str(path), device=device)
    if name_or_path == "tiny-text":  # the character-level English model has its own tokenizer
        from .text import load_text_model

        return load_text_model(device=device, train_if_missing=train_if_missing, progress=progress)
    if name_or_path not in MODELS:
        if _looks_like_path(name_or_path) or path.exists():
            raise CheckpointError(f"{path}: no such model folder")
        raise UnknownNameError(
            f"unknown model {name_or_path!r} (and no such folder); known models: {', '.join(MODELS.names())}"
        )
    spec: ModelSpec = MODELS.get(name_or_path)
    folder = model_dir(name_or_path)
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
    return loaded


def _train_builtin(name: str, spec: ModelSpec, folder: Path, progress: bool) -> None:
    from .training import train_denoiser

    with _lock(folder.parent / f".{name}.lock"):
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
