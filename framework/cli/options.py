"""Options shared by the decoding commands: ``--model``, ``--dtype``, ``--device``,
``--trust-remote-code``, ``--no-chat-template``, ``--controller``, ``--set``, ``--seed``.

``--model`` is a folder (this project's format or a Hugging Face checkpoint), a built-in name
(``adec list models``) or a hub name ``org/name`` found in the local Hugging Face cache; nothing is
downloaded. ``--dtype`` and ``--device`` are checked when the command line is parsed, before any work.

``--set key=value`` reaches both the loop's :class:`adaptive_decoding.framework.engine.config.DecodeConfig` and the
controller's own parameters; a key that neither knows fails with both lists.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any, Optional

from adaptive_decoding.framework.core.params import ParameterError, parse_assignments
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.controller_io import split_settings as engine_split_settings

DEFAULT_MODEL = "tiny-addition"
DTYPES = ("auto", "float32", "bfloat16", "float16")  # = adaptive_decoding.framework.models.hub_loading.DTYPES
DEVICES = "auto, cpu, cuda, cuda:N, mps"


#: ``--model`` of the commands that run a task (bench, tune, train-controller)
MODEL_HELP = ("a checkpoint folder (this project's format or a Hugging Face LLaDA / Dream / masked-LM "
              "checkpoint), a built-in name (see 'adec list models') or a hub name org/name from the local "
              "Hugging Face cache (never downloaded); default: the task's built-in model (tiny-<task>); "
              "required for the data and lm_eval tasks")
#: ``--task-param`` of the commands that run a task
TASK_PARAM_HELP = ("task parameter, repeatable: a size knob (--task-param digits=2) or, for your own data, the "
                   "data task's file, columns and metric (--task data --task-param test=gsm8k_test.jsonl "
                   "--task-param prompt=question --task-param metric=gsm8k; see 'adec list tasks -v')")


def parse_task_params(task: str, pairs: list[str]) -> dict[str, Any]:
    """``--task-param KEY=VALUE`` pairs of ``task``: values of the task's string parameters kept as
    written (a template ``{question}``), the others read as literals (``digits=2``, ``until=[w0]``)."""
    from adaptive_decoding.framework.core.params import parse_assignments
    from adaptive_decoding.framework.tasks.base import TASKS

    return parse_assignments(pairs, option="--task-param", declared=getattr(TASKS.get(task), "params", None))


def device_arg(text: str) -> str:
    """``--device`` syntax (availability is checked when the model is loaded, still before decoding)."""
    if text in ("auto", "cpu", "mps") or re.fullmatch(r"cuda(:\d+)?", text):
        return text
    raise argparse.ArgumentTypeError(f"invalid device {text!r}; allowed: {DEVICES}")


def add_model_args(g: Any, *, model_default: Optional[str] = DEFAULT_MODEL, model_help: Optional[str] = None) -> None:
    """``--model``, ``--dtype``, ``--device``, ``--trust-remote-code``, ``--query-chunk``, ``--no-chat-template``."""
    g.add_argument("--model", default=model_default,
                   help=model_help or (
                       f"a folder (this project's format or a Hugging Face checkpoint), a built-in name "
                       f"(see 'adec list models'; trained on first use) or a hub name org/name from the local "
                       f"Hugging Face cache (HF_HUB_CACHE / HF_HOME; never downloaded) (default: {model_default})"))
    g.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="weights dtype of a Hugging Face checkpoint: auto = bfloat16 on a GPU, float32 on CPU "
                        "(the tiny models stay float32 unless one is named) (default: auto)")
    g.add_argument("--device", default="auto", type=device_arg,
                   help=f"{DEVICES}; auto = CUDA when torch.cuda.is_available(), else CPU (default: auto)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let a checkpoint run the modeling code it ships (auto_map in config.json); without "
                        "it such a checkpoint is refused. LLaDA and Dream load with the framework's own "
                        "implementation and do not need it")
    g.add_argument("--query-chunk", type=int, default=None, metavar="N",
                   help="the framework's own LLaDA/Dream: take each forward over more than N query rows (every "
                        "step without a cache, each block's refresh with one) N rows at a time, so a step holds "
                        "one chunk's activations instead of the whole canvas's; slower where arithmetic is the "
                        "bound, so set it for memory (long canvases, large batches) (default: one pass)")
    g.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                   help="do not wrap prompts in the tokenizer's chat template (by default an instruct "
                        "model's prompt becomes one user turn plus the generation prompt)")


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`adaptive_decoding.framework.training.zoo.load_model` from the parsed flags,
    with the device resolved (``auto``) and checked on this machine."""
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.models.hub_adapters import HubModelError
    from adaptive_decoding.framework.models.hub_loading import resolve_device

    try:
        device = resolve_device(getattr(args, "device", "auto"))
    except HubModelError as exc:
        raise CLIError(f"--device: {exc}") from None
    chunk = getattr(args, "query_chunk", None)
    if chunk is not None and chunk < 1:
        raise CLIError(f"--query-chunk={chunk} is out of range; allowed: ≥ 1 (or leave it out: one pass)")
    return {"device": device, "dtype": getattr(args, "dtype", "auto"),
            "trust_remote_code": bool(getattr(args, "trust_remote_code", False)),
            "chat": None if getattr(args, "chat_template", True) else False, "query_chunk": chunk}


def load_cli_model(name: Optional[str], options: dict[str, Any], task: Any = None) -> Any:
    """:func:`adaptive_decoding.framework.training.zoo.load_model` with its loading errors as one-line CLI errors; with
    ``task``, ``name=None`` is the task's built-in model and the task's chat wish applies
    (:func:`adaptive_decoding.framework.training.zoo.load_model_for_task`)."""
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.models.hub_adapters import HubModelError
    from adaptive_decoding.framework.training.zoo import load_model, load_model_for_task

    try:
        if task is not None:
            return load_model_for_task(task, name, **options)[0]
        return load_model(name, **options)
    except HubModelError as exc:
        if isinstance(exc, FileNotFoundError):
            raise  # ModelNotCachedError: reported as is (it says how to fetch the model)
        raise CLIError(f"--model {name}: {exc}") from None


def add_decoding_args(p: argparse.ArgumentParser, *, default_controller: str = "fast_dllm") -> None:
    g = p.add_argument_group("decoding")
    add_model_args(g)
    g.add_argument("--controller", default=default_controller,
                   help=f"registered controller (see 'adec list controllers') or tuned:PATH.yaml "
                        f"(default: {default_controller})")
    g.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="decoding option or controller parameter, repeatable: "
                        "--set gen_length=32 --set block_length=8 --set threshold=0.9")
    g.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")


#: the keys of ``--lookahead`` (``Lookahead.params``; a test keeps this list complete without importing
#: the engine when the parser is built)
LOOKAHEAD_OPTIONS = ("width", "hold", "escalate", "positions", "branch",  # which candidates
                     "rollout", "rollout_threshold", "max_depth", "advance", "complete",  # how each is rolled out
                     "rescore", "hold_bonus", "lazy", "branch_pll",  # how they are ranked
                     "budget")


def add_lookahead_args(p: argparse.ArgumentParser) -> None:
    """``--scorer SPEC`` and ``--lookahead KEY=VALUE`` (read by :func:`build_lookahead`)."""
    g = p.add_argument_group("lookahead")
    g.add_argument("--scorer", metavar="SPEC", default=None,
                   help="enable lookahead, ranking rollouts with this scorer or weighted mix, e.g. "
                        "'logprob:0.7,consistency:0.3,repetition:1' (see 'adec list scorers'); it acts at "
                        "steps where the controller asks for a lookahead depth (margin_topk, entropy_topk, "
                        "confidence_ladder, compose)")
    g.add_argument("--lookahead", dest="lookahead_sets", action="append", default=[], metavar="KEY=VALUE",
                   help="lookahead option, repeatable: " + ", ".join(LOOKAHEAD_OPTIONS) + " (with --scorer; "
                        "see docs/lookahead.md; extra NFE per sample are capped by --lookahead budget=N, default 128)")


@dataclass
class DecodingSetup:
    controller: Controller
    config: DecodeConfig
    controller_name: str


def split_settings(controller_name: str, settings: dict[str, Any], defaults: Optional[dict[str, Any]] = None,
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``--set`` values into (decode-config keys, controller keys); unknown keys fail."""
    _, cfg, ctrl = engine_split_settings(controller_name, settings, defaults=defaults)
    return cfg, ctrl


def resolve_decoding(args: argparse.Namespace, defaults: Optional[dict[str, Any]] = None) -> DecodingSetup:
    """Build and validate the controller and the decode config from parsed CLI arguments."""
    settings = parse_assignments(args.sets)
    cfg_kw, ctrl_kw = split_settings(args.controller, settings, defaults)
    cfg_kw.setdefault("seed", args.seed)
    config = DecodeConfig.build(**cfg_kw)
    controller = build_controller(args.controller, **ctrl_kw)
    return DecodingSetup(controller=controller, config=config, controller_name=args.controller)


def build_lookahead(args: argparse.Namespace):
    """A :class:`adaptive_decoding.framework.engine.lookahead.Lookahead` from ``--scorer SPEC`` and ``--lookahead KEY=VALUE``,
    or ``None`` without ``--scorer``; its scorers read the tokenizer, prompts and metas of each decode
    call's context (:meth:`adaptive_decoding.framework.engine.context.DecodeContext.for_batch`)."""
    spec = getattr(args, "scorer", None)
    sets = getattr(args, "lookahead_sets", None) or []
    if not spec:
        if sets:
            raise ParameterError(f"--lookahead {sets[0]} has no effect without --scorer SPEC")
        return None
    from adaptive_decoding.framework.engine.lookahead import Lookahead
    from adaptive_decoding.framework.engine.scorer import parse_scorer_spec

    return Lookahead.build(scorer=parse_scorer_spec(spec), **parse_assignments(sets))
