"""Training the ``tiny-text`` denoiser on the bundled English corpus. Its folder is loaded by
:func:`adaptive_decoding.framework.models.zoo.load_text_folder` (re-exported here with :func:`load_text_model` and
:func:`text_model_dir`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from adaptive_decoding.framework.models.saved import file_lock
from adaptive_decoding.framework.models.zoo import load_text_folder, load_text_model, text_model_dir  # noqa: F401 - re-exported
from adaptive_decoding.framework.tasks.text import SOURCES, TEXT_MODEL, TextTask, corpus_fingerprint


def train_text_model(out_dir: "str | os.PathLike", *, max_minutes: float = 10.0, max_steps: int = 6000,
                     model_size: Any = "small", seed: int = 0, progress: bool = True,
                     wandb_mode: str = "disabled", **overrides: Any) -> Path:
    """Train ``tiny-text`` with :class:`adaptive_decoding.framework.training.MaskedDiffusionLM`; write ``text.json`` too.

    ``text.json`` records the tokenizer vocabulary and the corpus fingerprint, which
    :func:`load_text_model` checks (a different Python version ships different docs).
    """
    from adaptive_decoding.framework.training.masked_diffusion import train_denoiser

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


def train_missing_text_model(name: str, folder: Path, progress: bool) -> None:
    """Train ``tiny-text`` into ``folder`` (the builder :func:`adaptive_decoding.framework.models.zoo.load_text_model`
    calls when it is missing), staged and moved in under a file lock."""
    with file_lock(folder.parent / f".{TEXT_MODEL}.lock"):
        if (folder / "text.json").is_file():  # another process finished it meanwhile
            return
        print(f"adec: training {TEXT_MODEL} on the English corpus into {folder}", file=sys.stderr, flush=True)
        staging = folder.parent / f".{TEXT_MODEL}.partial-{os.getpid()}"
        mode = os.environ.get("WANDB_MODE")
        train_text_model(staging, progress=progress,
                         wandb_mode=mode if mode in ("offline", "online", "disabled") else "offline")
        if folder.exists() and not any(folder.iterdir()):
            folder.rmdir()
        os.replace(staging, folder)
