"""``adec list``: what is registered (controllers, scorers, tasks, models, metrics)."""

from __future__ import annotations

import argparse
import importlib

KINDS = {
    "controllers": ("framework.controller", "CONTROLLERS"),
    "scorers": ("framework.scorer", "SCORERS"),
    "tasks": ("framework.tasks", "TASKS"),
    "models": ("framework.models", "MODELS"),
    "metrics": ("framework.metrics", "METRICS"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list", help="list registered controllers, scorers, tasks, models and metrics",
        description="List what is registered, built-in and from entry points. With --verbose, "
                    "every parameter with its allowed range, default and meaning.",
    )
    p.add_argument("kind", nargs="?", default="all", choices=["all", *KINDS],
                   help="which registry to list (default: all)")
    p.add_argument("-v", "--verbose", action="store_true", help="show each plugin's parameters")
    p.set_defaults(func=run)


def _registry(kind: str):
    mod_name, attr = KINDS[kind]
    try:
        return getattr(importlib.import_module(mod_name), attr)
    except (ModuleNotFoundError, AttributeError):
        return None


def _defaults(obj) -> dict:
    import inspect

    try:
        sig = inspect.signature(obj.__init__)
    except (TypeError, ValueError):
        return {}
    return {k: v.default for k, v in sig.parameters.items() if v.default is not inspect.Parameter.empty}


def run(args: argparse.Namespace) -> int:
    kinds = list(KINDS) if args.kind == "all" else [args.kind]
    for kind in kinds:
        reg = _registry(kind)
        if reg is None:
            continue
        print(f"{kind}:")
        for name in reg.names():
            obj = reg.get(name)
            doc = (getattr(obj, "__doc__", "") or "").strip().splitlines()
            family = getattr(obj, "kind", "")
            family = f"[{family}] " if isinstance(family, str) and family else ""
            print(f"  {name:<22} {family}{doc[0] if doc else ''}")
            if args.verbose and getattr(obj, "params", None):
                defaults = _defaults(obj)
                for pname, spec in obj.params.items():
                    default = defaults.get(pname, "-")
                    tune = f"  tune {spec.tune}" if getattr(spec, "tune", None) else ""
                    print(f"      {pname:<20} default {default!r:<14} {spec.allowed()}{tune}  {spec.doc}")
        print()
    return 0
