"""Pick the framework's own implementation from a checkpoint's ``config.json`` and load it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import nn

from .checkpoint import PathLike, detect_architecture, load_pretrained, read_config
from .dream import DreamModel
from .fast_dllm_v2 import FastDLLMv2Model
from .llada import LLaDAModel
from .llada2 import LLaDA2MoeModel
from .llada_moe import LLaDAMoEModel
from .sdar import SDARModel


def load_architecture(folder: PathLike, dtype: Optional[torch.dtype] = None,
                      device: "torch.device | str | None" = None) -> nn.Module:
    """Load a LLaDA, Dream or LLaDA2-MoE checkpoint folder with the framework's own implementation, choosing the
    class from ``config.json`` (``model_type``, ``architectures``, ``auto_map``)."""
    config = read_config(folder)
    found = detect_architecture(config, str(Path(folder) / "config.json"))
    cls = {"llada": LLaDAModel, "dream": DreamModel, "llada2_moe": LLaDA2MoeModel, "sdar": SDARModel,
           "fast_dllm_qwen": FastDLLMv2Model, "lladamoe": LLaDAMoEModel}[found]
    return load_pretrained(cls, folder, dtype=dtype, device=device)
