"""The saved tiny-denoiser folder format (``config.json`` + ``model.pt``) and the model cache folder.

A folder stores the vocabulary its model was trained with (``config.json``'s ``vocab``) and is loaded
with a tokenizer of that vocabulary, so a task added later, or a word added to a task, never
invalidates it; a folder written before vocabularies were stored is read with
:data:`adaptive_decoding.framework.tasks.vocab.LEGACY_VOCAB`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from adaptive_decoding.framework.models.protocol import LoadedModel
from adaptive_decoding.framework.models.tiny import TinyConfig, TinyDenoiser

FORMAT = "adaptive-decoding.tiny-denoiser"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE = "config.json", "model.pt", "metrics.json"


class CheckpointError(FileNotFoundError):
    """A missing or unreadable model folder; the message names the file and why."""


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
    """Write ``config.json``, ``model.pt`` and ``metrics.json`` of a trained tiny denoiser (with the
    vocabulary of ``task.tokenizer``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "model": denoiser.config.to_dict(),
        "task": task.name, "task_params": task.get_params(), "vocab": list(task.tokenizer.vocab),
        "recipe": recipe,
    }
    state = {k: v.detach().cpu() for k, v in denoiser.state_dict().items()}
    torch.save(state, folder / WEIGHTS_FILE)
    (folder / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")  # last: marks completeness
    return folder


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; a missing, unreadable or non-object file raises :class:`CheckpointError` naming it."""
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
        return read_json(Path(folder) / CONFIG_FILE).get("format") == FORMAT
    except CheckpointError:
        return False


def load_pretrained(folder: "str | os.PathLike", device: str = "cpu", name: Optional[str] = None) -> LoadedModel:
    """Load a folder written by :func:`save_pretrained` (torch and json only)."""
    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    cfg = read_json(cfg_path)
    if cfg.get("format") != FORMAT:
        raise CheckpointError(f"{cfg_path}: format {cfg.get('format')!r} is not {FORMAT!r}")
    if int(cfg.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(f"{cfg_path}: format_version {cfg.get('format_version')} is newer than "
                              f"this code understands ({FORMAT_VERSION}); upgrade adaptive-decoding")
    tok = saved_tokenizer(cfg, cfg_path)
    denoiser = _read_weights(cfg, cfg_path, w_path)
    if denoiser.config.vocab_size != tok.vocab_size:
        raise CheckpointError(f"{cfg_path}: its vocabulary has {tok.vocab_size} tokens but its model "
                              f"{denoiser.config.vocab_size}")
    denoiser.to(device).eval()
    metrics: dict = {}
    with contextlib.suppress(CheckpointError):
        metrics = read_json(folder / METRICS_FILE)
    return LoadedModel(
        denoiser=denoiser, tokenizer=tok, name=name or str(folder), task=cfg.get("task"),
        info={"path": str(folder), "format": FORMAT, "task_params": cfg.get("task_params", {}),
              "recipe": cfg.get("recipe", {}), "metrics": metrics},
    )


def saved_tokenizer(cfg: dict, cfg_path: Path) -> Any:
    """The tokenizer of the vocabulary stored in a saved ``config.json`` (``vocab``); a folder
    without one was trained with :data:`~adaptive_decoding.framework.tasks.vocab.LEGACY_VOCAB`."""
    from adaptive_decoding.framework.tasks.vocab import LEGACY_VOCAB, tokenizer_for

    vocab = cfg.get("vocab")
    try:
        return tokenizer_for(LEGACY_VOCAB if vocab is None else tuple(vocab))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{cfg_path}: bad 'vocab' ({exc})") from None


def _read_weights(cfg: dict, cfg_path: Path, w_path: Path) -> TinyDenoiser:
    """The :class:`TinyDenoiser` of ``cfg['model']`` with the state dict in ``w_path``."""
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
    return denoiser


# ---------------------------------------------------------------------- helpers of the loaders
@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive file lock (so two processes do not train the same built-in model at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        yield


def looks_like_path(text: str) -> bool:
    """Whether a model name is written as a path (has a separator, or starts with ``.`` or ``~``)."""
    return os.sep in text or text.startswith((".", "~")) or (os.altsep is not None and os.altsep in text)


