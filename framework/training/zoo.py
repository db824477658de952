"""The training layer's part in loading built-in models: it trains a missing one.

Names, folders and loading live in :mod:`adaptive_decoding.framework.models.zoo` (:func:`load_model`, :data:`MODELS`);
importing this module (or anything in ``adaptive_decoding.framework.training``) registers
:func:`train_missing_builtin` and :func:`adaptive_decoding.framework.training.text_model.train_missing_text_model` as
the builders :func:`load_model` calls for a missing built-in model when ``train_if_missing``. The
names below are re-exported so ``adaptive_decoding.framework.training.zoo.load_model`` keeps working.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from adaptive_decoding.framework.models.saved import CONFIG_FILE, CheckpointError, file_lock
from adaptive_decoding.framework.models.zoo import (  # noqa: F401 - re-exported
    MODELS,
    PACKAGED_WEIGHTS,
    ModelSpec,
    default_model_name,
    load_model,
    load_model_for_task,
    packaged_dir,
    register_missing_builder,
)


def train_missing_builtin(name: str, folder: Path, progress: bool) -> None:
    """Train the built-in model ``name`` on its task's recipe into ``folder`` (staged in a sibling
    folder and moved in at the end, under a file lock so two processes do not train it at once)."""
    from adaptive_decoding.framework.training.masked_diffusion import train_denoiser

    spec: ModelSpec = MODELS.get(name)
    with file_lock(folder.parent / f".{name}.lock"):
        if (folder / CONFIG_FILE).exists():  # another process finished it meanwhile
            return
        if folder.exists() and any(folder.iterdir()):
            raise CheckpointError(
                f"{folder / CONFIG_FILE}: file not found, but {folder} holds other files (an interrupted "
                f"run?); move the folder away to retrain, nothing was deleted"
            )
        recipe = spec.recipe()
        if spec.init_from is not None:  # the model it is adapted from, trained first when it is missing too
            load_model(spec.init_from, progress=progress)
        print(f"adec: model {name!r} is not in the cache; training it on task {spec.task!r} "
              f"(about {recipe['max_minutes']:g} min on CPU) into {folder}", file=sys.stderr, flush=True)
        staging = folder.parent / f".{name}.partial-{os.getpid()}"
        mode = os.environ.get("WANDB_MODE", "offline")
        result = train_denoiser(spec.task, out_dir=staging, progress=progress,
                                wandb_mode=mode if mode in ("online", "disabled") else "offline",
                                **spec.training_overrides())
        if folder.exists():
            folder.rmdir()  # empty (checked above)
        os.replace(staging, folder)
        print(f"adec: {result.summary().replace(str(staging), str(folder))}", file=sys.stderr, flush=True)


def _register() -> None:
    from adaptive_decoding.framework.training.text_model import train_missing_text_model

    register_missing_builder("denoiser", train_missing_builtin)
    register_missing_builder("text", train_missing_text_model)


_register()
