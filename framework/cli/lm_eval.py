"""``adec lm-eval ARGS``: lm-evaluation-harness's command line with the ``adec`` model registered.

lm-eval finds a ``--model`` only in its own registry and (in 0.4.x) has no plugin discovery, so
this command imports :mod:`adaptive_decoding.framework.integrations.lm_eval_model` (which registers ``adec``) and hands every
argument, unchanged, to lm-eval's CLI. Without ``--model`` it adds ``--model adec``.
"""

from __future__ import annotations

import argparse
import sys

LM_EVAL_SUBCOMMANDS = ("run", "ls", "validate")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "lm-eval", help="run lm-evaluation-harness with the adec model (any controller)",
        description=(
            "lm-evaluation-harness's command line (pip install 'adaptive-decoding[eval]') with the 'adec' "
            "model registered; every argument goes to lm-eval unchanged ('adec lm-eval --help' shows lm-eval's). "
            "--model_args takes model= (as adec decode --model), controller= and its parameters, the "
            "decoding options (gen_length, block_length, cache, ...), mc_num, cfg, check_greedy.\n\n"
            "Example (GSM8K 5-shot as Fast-dLLM runs it; the model must be in the local HF cache):\n"
            "  adec lm-eval --model adec --tasks gsm8k --num_fewshot 5 --batch_size 8 --device cuda:0 \\\n"
            "    --model_args model=GSAI-ML/LLaDA-8B-Instruct,controller=fast_dllm,threshold=0.9,"
            "gen_length=256,block_length=32,cache=dual"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        prefix_chars="+", add_help=False,  # '--help' and every other flag reach lm-eval
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="lm-eval's arguments")
    p.set_defaults(func=run)


def lm_eval_argv(args: list[str]) -> list[str]:
    """lm-eval's ``sys.argv`` for our arguments: ``--model adec`` added to a run that names no model."""
    argv = list(args)
    help_only = any(a in ("-h", "--help") for a in argv)
    names_model = any(a in ("--model", "-M") or a.startswith("--model=") for a in argv)
    listing = bool(argv) and argv[0] in LM_EVAL_SUBCOMMANDS[1:]
    if argv and not help_only and not names_model and not listing:
        argv += ["--model", "adec"]
    return ["lm-eval", *argv]


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.framework.cli.errors import CLIError

    try:
        from lm_eval.__main__ import cli_evaluate

        import adaptive_decoding.framework.integrations.lm_eval_model  # noqa: F401  (registers the adec model with lm-eval)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "lm_eval":
            raise CLIError("lm-evaluation-harness is not installed: pip install 'adaptive-decoding[eval]' "
                           "(or pip install lm-eval)") from None
        raise
    saved = sys.argv
    sys.argv = lm_eval_argv(args.args)
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
