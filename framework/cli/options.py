"""Options shared by the decoding commands: ``--model``, ``--controller``, ``--set``, ``--seed``.

``--set key=value`` reaches both the loop's :class:`framework.engine.config.DecodeConfig` and the
controller's own parameters; a key that neither knows fails with both lists.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Optional

from framework.core.params import ParameterError, parse_assignments
from framework.engine.config import DecodeConfig
from framework.engine.controller import CONTROLLERS, Controller
from framework.engine.controller_io import build_controller

DEFAULT_MODEL = "tiny-addition"


def add_decoding_args(p: argparse.ArgumentParser, *, default_controller: str = "fast_dllm") -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"registered model name (see 'adec list models') or a local folder of a "
                        f"Hugging Face model (default: {DEFAULT_MODEL}, trained on first use)")
    g.add_argument("--controller", default=default_controller,
                   help=f"registered controller (see 'adec list controllers') or tuned:PATH.yaml "
                        f"(default: {default_controller})")
    g.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="decoding option or controller parameter, repeatable: "
                        "--set gen_length=32 --set block_length=8 --set threshold=0.9")
    g.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    g.add_argument("--device", default="cpu", help="torch device (default: cpu)")


def add_lookahead_args(p: argparse.ArgumentParser) -> None:
    """``--scorer SPEC`` and ``--lookahead KEY=VALUE`` (read by :func:`build_lookahead`)."""
    g = p.add_argument_group("lookahead")
    g.add_argument("--scorer", metavar="SPEC", default=None,
                   help="enable lookahead, ranking rollouts with this scorer or weighted mix, e.g. "
                        "'logprob:0.7,consistency:0.3,repetition:1' (see 'adec list scorers'); it acts at "
                        "steps where the controller asks for a lookahead depth (confidence_ladder, compose)")
    g.add_argument("--lookahead", dest="lookahead_sets", action="append", default=[], metavar="KEY=VALUE",
                   help="lookahead option, repeatable: width, positions, rollout, rollout_threshold, "
                        "max_depth, complete, verify (with --scorer; extra NFE are capped by "
                        "--set lookahead_budget=N)")


@dataclass
class DecodingSetup:
    controller: Controller
    config: DecodeConfig
    controller_name: str


def split_settings(controller_name: str, settings: dict[str, Any], defaults: Optional[dict[str, Any]] = None,
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``--set`` values into (decode-config keys, controller keys); unknown keys fail."""
    cfg_keys = set(DecodeConfig._param_names())
    if controller_name.startswith("tuned:"):
        ctrl_keys = None  # the tuned YAML decides; build_controller validates
    else:
        ctrl_keys = set(CONTROLLERS.get(controller_name)._param_names())
    cfg: dict[str, Any] = dict(defaults or {})
    ctrl: dict[str, Any] = {}
    for key, value in settings.items():
        if key in cfg_keys:
            cfg[key] = value
        elif ctrl_keys is None or key in ctrl_keys:
            ctrl[key] = value
        else:
            raise ParameterError(
                f"--set {key}={value!r}: unknown key. Decoding options: {', '.join(sorted(cfg_keys))}; "
                f"{controller_name} parameters: {', '.join(sorted(ctrl_keys)) or '(none)'}"
            )
    return cfg, ctrl


def resolve_decoding(args: argparse.Namespace, defaults: Optional[dict[str, Any]] = None) -> DecodingSetup:
    """Build and validate the controller and the decode config from parsed CLI arguments."""
    settings = parse_assignments(args.sets)
    cfg_kw, ctrl_kw = split_settings(args.controller, settings, defaults)
    cfg_kw.setdefault("seed", args.seed)
    config = DecodeConfig.build(**cfg_kw)
    controller = build_controller(args.controller, **ctrl_kw)
    return DecodingSetup(controller=controller, config=config, controller_name=args.controller)


def build_lookahead(args: argparse.Namespace, tokenizer: Any = None):
    """A :class:`framework.engine.lookahead.Lookahead` from ``--scorer SPEC`` and ``--lookahead KEY=VALUE``,
    or ``None`` without ``--scorer``; ``tokenizer`` lets text scorers read the candidates."""
    spec = getattr(args, "scorer", None)
    sets = getattr(args, "lookahead_sets", None) or []
    if not spec:
        if sets:
            raise ParameterError(f"--lookahead {sets[0]} has no effect without --scorer SPEC")
        return None
    from framework.engine.lookahead import Lookahead
    from framework.engine.scorer import ScoringContext, parse_scorer_spec

    context = ScoringContext(tokenizer=tokenizer) if tokenizer is not None else None
    return Lookahead.build(scorer=parse_scorer_spec(spec), context=context, **parse_assignments(sets))
