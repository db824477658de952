"""Reference decodes for controllers that need one (``Controller.reference_param``, e.g. ``oracle``).

A controller never runs the model itself: a caller that decodes with such a controller first
decodes the same prompts, configuration and seeds with the reference controller it names, and
passes the final tokens y* as ``DecodeContext.reference_tokens`` ``[B, G]``
(:func:`decode_with_reference` does both). The reference's forwards are not counted in the
controller's NFE.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import DecodeResult, decode


def reference_spec(controller: Any) -> Optional[str]:
    """The reference controller ``controller`` needs the final tokens of (the value of its
    ``reference_param`` parameter), or ``None`` for a controller that needs none."""
    name = getattr(type(controller), "reference_param", None)
    return None if name is None else getattr(controller, name)


def reference_tokens(model: Any, prompts: Sequence[Sequence[int]], controller: Any, config: DecodeConfig, *,
                     seeds: Any = None, context: Optional[DecodeContext] = None) -> Optional[torch.Tensor]:
    """y* ``[B, G]`` for ``controller``: the generation of its reference controller on the same
    prompts, configuration, seeds and ``context``; ``None`` when the controller needs no reference."""
    spec = reference_spec(controller)
    if spec is None:
        return None
    return decode(model, prompts, build_controller(spec), config, seeds=seeds, context=context).generated


def with_reference(context: Optional[DecodeContext], model: Any, prompts: Sequence[Sequence[int]], controller: Any,
                   config: DecodeConfig, *, seeds: Any = None) -> Optional[DecodeContext]:
    """``context`` with ``reference_tokens`` filled in where ``controller`` needs a reference and the
    context has none; otherwise ``context`` itself."""
    if reference_spec(controller) is None or (context is not None and context.reference_tokens is not None):
        return context
    ref = reference_tokens(model, prompts, controller, config, seeds=seeds, context=context)
    return replace(context or DecodeContext(), reference_tokens=ref)


def decode_with_reference(model: Any, prompts: Sequence[Sequence[int]], controller: Any,
                          config: Optional[DecodeConfig] = None, *, context: Optional[DecodeContext] = None,
                          **kwargs: Any) -> DecodeResult:
    """:func:`~adaptive_decoding.framework.engine.loop.decode`, after the reference decode ``controller`` needs (if any)."""
    config = config or DecodeConfig()
    context = with_reference(context, model, prompts, controller, config, seeds=kwargs.get("seeds"))
    return decode(model, prompts, controller, config, context=context, **kwargs)
