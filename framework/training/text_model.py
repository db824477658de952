"""The ``tiny-text`` denoiser: trained on the bundled English corpus, cached, loaded by name.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from framework.tasks.text import SOURCES, TEXT_MODEL, TextTask, corpus_fingerprint


# ====================================================================== the tiny text denoiser
def text_model_dir() -> Path:
    from framework.models.saved import default_cache_dir

    return default_cache_dir() / "models" / TEXT_MODEL


def train_text_model(out_dir: "str | os.PathLike", *, max_minutes: float = 10.0, max_steps: int = 6000,
                     model_size: Any = "small", seed: int = 0, progress: bool = True,
                     wandb_mode: str = "disabled", **overrides: Any) -> Path:
    """Train ``tiny-text`` with :class:`framework.training.MaskedDiffusionLM`; write ``text.json`` too.

    ``text.json`` records the tokenizer vocabulary and the corpus fingerprint, which
    :func:`load_text_model` checks (a different Python version ships different docs).
    """
    from framework.training.masked_diffusion import train_denoiser

    task = TextTask()
    overrides.setdefault("n_test", 200)
    overrides.setdefault("batch_size", 64)
    overrides.setdefault("warmup_steps", 200)
    overrides.setdefault("val_size", 128)
    overrides.setdefault("val_every", 500)
    result = train_denoiser(task, max_minutes=max_minutes, max_steps=max_steps, model_size=model_size,
                            out_dir=out_dir, seed=seed, wandb_mode=wandb_mode, progress=progress, **overrides)
    meta = {"task": "text", "task_params": task.get_params(), "vocab": list(task.tokenizer.vocab),
            "corpus": list(SOURCES), "corpus_fingerprint": corpus_fingerprint()}
    (Path(out_dir) / "text.json").write_text(json.dumps(meta, indent=1) + "\n")
    return result.path


def load_text_folder(folder: "str | os.PathLike", device: str = "cpu", name: Optional[str] = None) -> Any:
    """A :class:`framework.models.protocol.LoadedModel` of a folder written by :func:`train_text_model`."""
    from framework.models.protocol import LoadedModel
    from framework.models.saved import CheckpointError
    from framework.models.tiny import TinyConfig, TinyDenoiser

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


def load_text_model(device: str = "cpu", train_if_missing: bool = True, progress: bool = True) -> Any:
    """The cached ``tiny-text`` model, trained on first use (about 10 CPU minutes)."""
    from framework.models.saved import CheckpointError, folder_lock

    folder = text_model_dir()
    if not (folder / "text.json").is_file():
        if not train_if_missing:
            raise CheckpointError(f"{folder / 'text.json'}: file not found (tiny-text is not trained yet)")
        with folder_lock(folder.parent / f".{TEXT_MODEL}.lock"):
            if not (folder / "text.json").is_file():
                print(f"adec: training {TEXT_MODEL} on the English corpus into {folder}", file=sys.stderr, flush=True)
                staging = folder.parent / f".{TEXT_MODEL}.partial-{os.getpid()}"
                train_text_model(staging, progress=progress,
                                 wandb_mode=os.environ.get("WANDB_MODE", "offline")
                                 if os.environ.get("WANDB_MODE") in ("offline", "online", "disabled") else "offline")
                if folder.exists() and not any(folder.iterdir()):
                    folder.rmdir()
                os.replace(staging, folder)
    return load_text_folder(folder, device=device, name=TEXT_MODEL)
