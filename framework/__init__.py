"""adaptive-decoding: adaptive parallel decoding of masked diffusion language models.

The public API, for scripts, notebooks and plugins: everything the docs' examples use is a name of
this package (``tests/docs/test_docs.py`` checks that every Python example of docs/ and the README
imports only from here); the built-in plugins, the experiments and the tests import the defining
modules directly, so that the layer check sees where they sit::

    from adaptive_decoding.framework import decode, DecodeConfig, build_controller, load_model
    loaded = load_model("tiny-addition")
    result = decode(loaded.denoiser, [loaded.tokenizer.encode("123+456=")],
                    build_controller("fast_dllm", threshold=0.9), DecodeConfig(gen_length=5))

Plugin authors subclass :class:`Controller` or :class:`Scorer`, register with
``CONTROLLERS.register`` / ``SCORERS.register`` (or an entry point), and run
:func:`check_controller` / :func:`check_scorer`, the shared conformance suites.

Layers (lowest first; each imports only its own layer and lower ones, see docs/architecture.md):
``core`` -> ``engine`` -> ``models``, ``tasks`` -> ``training``, ``learning``, ``tuning``, ``jobs``
-> (``controllers/``, ``scorers/`` plugins) -> ``testing``, ``integrations``, ``profiling``
-> ``experiments/`` -> ``cli``.
Names are imported lazily on first use, so ``import framework`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
_EXPORTS = {
    # engine: the loop and its contracts
    "decode": "adaptive_decoding.framework.engine.loop",
    "DecodeResult": "adaptive_decoding.framework.engine.loop",
    "DecodeConfig": "adaptive_decoding.framework.engine.config",
    "Controller": "adaptive_decoding.framework.engine.controller",
    "Decision": "adaptive_decoding.framework.engine.controller",
    "DecodeState": "adaptive_decoding.framework.engine.controller",
    "DecodeContext": "adaptive_decoding.framework.engine.context",
    "decode_with_reference": "adaptive_decoding.framework.engine.reference",
    "CONTROLLERS": "adaptive_decoding.framework.engine.controller",
    "Composite": "adaptive_decoding.framework.engine.nesting",
    "Wrapper": "adaptive_decoding.framework.engine.nesting",
    "wrapped_params": "adaptive_decoding.framework.engine.nesting",
    "StepFeatures": "adaptive_decoding.framework.engine.features",
    "rank_within": "adaptive_decoding.framework.engine.selection",
    "select_topk": "adaptive_decoding.framework.engine.selection",
    "ensure_progress": "adaptive_decoding.framework.engine.selection",
    "build_controller": "adaptive_decoding.framework.engine.controller_io",
    "save_controller": "adaptive_decoding.framework.engine.controller_io",
    "load_controller": "adaptive_decoding.framework.engine.controller_io",
    "Scorer": "adaptive_decoding.framework.engine.scorer",
    "Candidates": "adaptive_decoding.framework.engine.scorer",
    "ScoringContext": "adaptive_decoding.framework.engine.scorer",
    "SCORERS": "adaptive_decoding.framework.engine.scorer",
    "build_scorer": "adaptive_decoding.framework.engine.scorer",
    "Lookahead": "adaptive_decoding.framework.engine.lookahead",
    "evaluate": "adaptive_decoding.framework.engine.evaluate",
    # core: parameters and registries
    "Param": "adaptive_decoding.framework.core.params",
    "Configurable": "adaptive_decoding.framework.core.params",
    "ControllerSpec": "adaptive_decoding.framework.core.params",
    "ParameterError": "adaptive_decoding.framework.core.params",
    "Registry": "adaptive_decoding.framework.core.registry",
    "UnknownNameError": "adaptive_decoding.framework.core.registry",
    # models and tasks
    "LoadedModel": "adaptive_decoding.framework.models.protocol",
    "Denoiser": "adaptive_decoding.framework.models.protocol",
    "Tokenizer": "adaptive_decoding.framework.models.protocol",
    "TASKS": "adaptive_decoding.framework.tasks.base",
    "Task": "adaptive_decoding.framework.tasks.base",
    "Recipe": "adaptive_decoding.framework.tasks.base",
    "Example": "adaptive_decoding.framework.tasks.base",
    "get_task": "adaptive_decoding.framework.tasks.base",
    "make_vocabulary": "adaptive_decoding.framework.tasks.vocab",
    "read_prompts": "adaptive_decoding.framework.tasks.prompts",
    "Metric": "adaptive_decoding.framework.tasks.metrics",
    "METRICS": "adaptive_decoding.framework.tasks.metrics",
    "get_metric": "adaptive_decoding.framework.tasks.metrics",
    "MODELS": "adaptive_decoding.framework.training.zoo",
    "load_model": "adaptive_decoding.framework.training.zoo",
    "train_denoiser": "adaptive_decoding.framework.training.masked_diffusion",
    "DenoiserOptions": "adaptive_decoding.framework.training.options",
    # adec generate's jobs
    "run_generation_job": "adaptive_decoding.framework.jobs",
    "JobOptions": "adaptive_decoding.framework.jobs",
    "check_items": "adaptive_decoding.framework.jobs",
    "validate_row": "adaptive_decoding.framework.jobs",
    "read_results": "adaptive_decoding.framework.jobs",
    # plugin authors: conformance suites and designed toys
    "check_controller": "adaptive_decoding.framework.testing.conformance",
    "controller_checks": "adaptive_decoding.framework.testing.conformance",
    "check_scorer": "adaptive_decoding.framework.testing.scorer_conformance",
    "check_task": "adaptive_decoding.framework.testing.task_conformance",
    # diffusers' LLaDA2Pipeline with any controller (the `diffusers` extra)
    "FrameworkScheduler": "adaptive_decoding.framework.integrations.diffusers_scheduler",
    "PipelineDenoiser": "adaptive_decoding.framework.integrations.diffusers_scheduler",
    "block_profile_model": "adaptive_decoding.framework.profiling.shapes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'framework' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
