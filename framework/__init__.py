"""adaptive-decoding: adaptive parallel decoding of masked diffusion language models.

The public API, for scripts, notebooks and plugins: everything the docs' examples use is a name of
this package (``tests/docs/test_docs.py`` checks that every Python example of docs/ and the README
imports only from here); the built-in plugins, the experiments and the tests import the defining
modules directly, so that the layer check sees where they sit::

    from framework import decode, DecodeConfig, build_controller, load_model
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
    "decode": "framework.engine.loop",
    "DecodeResult": "framework.engine.loop",
    "DecodeConfig": "framework.engine.config",
    "Controller": "framework.engine.controller",
    "Decision": "framework.engine.controller",
    "DecodeState": "framework.engine.controller",
    "DecodeContext": "framework.engine.context",
    "decode_with_reference": "framework.engine.reference",
    "CONTROLLERS": "framework.engine.controller",
    "Composite": "framework.engine.nesting",
    "Wrapper": "framework.engine.nesting",
    "wrapped_params": "framework.engine.nesting",
    "StepFeatures": "framework.engine.features",
    "rank_within": "framework.engine.selection",
    "select_topk": "framework.engine.selection",
    "ensure_progress": "framework.engine.selection",
    "build_controller": "framework.engine.controller_io",
    "save_controller": "framework.engine.controller_io",
    "load_controller": "framework.engine.controller_io",
    "Scorer": "framework.engine.scorer",
    "Candidates": "framework.engine.scorer",
    "ScoringContext": "framework.engine.scorer",
    "SCORERS": "framework.engine.scorer",
    "build_scorer": "framework.engine.scorer",
    "Lookahead": "framework.engine.lookahead",
    "evaluate": "framework.engine.evaluate",
    # core: parameters and registries
    "Param": "framework.core.params",
    "Configurable": "framework.core.params",
    "ControllerSpec": "framework.core.params",
    "ParameterError": "framework.core.params",
    "Registry": "framework.core.registry",
    "UnknownNameError": "framework.core.registry",
    # models and tasks
    "LoadedModel": "framework.models.protocol",
    "Denoiser": "framework.models.protocol",
    "Tokenizer": "framework.models.protocol",
    "TASKS": "framework.tasks.base",
    "Task": "framework.tasks.base",
    "Recipe": "framework.tasks.base",
    "Example": "framework.tasks.base",
    "get_task": "framework.tasks.base",
    "make_vocabulary": "framework.tasks.vocab",
    "read_prompts": "framework.tasks.prompts",
    "Metric": "framework.tasks.metrics",
    "METRICS": "framework.tasks.metrics",
    "get_metric": "framework.tasks.metrics",
    "MODELS": "framework.training.zoo",
    "load_model": "framework.training.zoo",
    "train_denoiser": "framework.training.masked_diffusion",
    "DenoiserOptions": "framework.training.options",
    # adec generate's jobs
    "run_generation_job": "framework.jobs",
    "JobOptions": "framework.jobs",
    "check_items": "framework.jobs",
    "validate_row": "framework.jobs",
    "read_results": "framework.jobs",
    # plugin authors: conformance suites and designed toys
    "check_controller": "framework.testing.conformance",
    "controller_checks": "framework.testing.conformance",
    "check_scorer": "framework.testing.scorer_conformance",
    "check_task": "framework.testing.task_conformance",
    # diffusers' LLaDA2Pipeline with any controller (the `diffusers` extra)
    "FrameworkScheduler": "framework.integrations.diffusers_scheduler",
    "PipelineDenoiser": "framework.integrations.diffusers_scheduler",
    "block_profile_model": "framework.profiling.shapes",
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
