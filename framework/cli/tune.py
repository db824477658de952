"""``adec tune``: a two-objective Optuna study over a controller's declared search space."""

from __future__ import annotations

import argparse
import json
from typing import Any

DESCRIPTION = """\
Tune a controller's declared parameters (its Params with tune=...) on the validation split of a
task, maximising accuracy (the task's own score: exact match, the data task's metric, an lm-eval
task's headline figure) and minimising mean NFE, then export the chosen point to a
YAML file that '--controller tuned:PATH' loads, and report it next to one-token-per-step decoding
on the test split.

Storage (--storage): nothing = SQLite file OUT/STUDY.db; 'memory' (one process, not saved);
'journal:PATH' (Optuna JournalStorage on an append-only file, no server needed); any Optuna RDB
URL (sqlite:///f.db, postgresql://user:pw@host/db, mysql://...); 'redis://host' (journal).
Resuming: the same --study-name in the same storage continues the study; --n-trials is the
study's total, so finished trials are never re-run. --workers N starts N processes on the storage;
the default point (a new study's first trial) runs in this process before they start.

Rules: a trial is pruned when its accuracy on the first --prune-fraction of the validation
examples is more than --prune-margin below sequential decoding's there; the exported point is the
fewest-NFE trial whose validation accuracy is at least sequential's minus --max-drop (else the
most accurate trial, with a note). Outputs in --out: STUDY.yaml, STUDY_pareto.png, STUDY.json.

Search space: each tuned parameter's declared range (adec list --verbose); --range NAME=LOW:HIGH
replaces one (nested controllers' parameters by dotted names: inner.threshold, base.eta,
controllers.0.eta).

Example:
  adec tune --controller margin_topk --task addition --n-trials 30 --workers 2
  adec tune --controller margin_topk --task sudoku9 --range eta=0.9:0.999 --n-trials 8
  adec tune --controller fast_dllm --task data --model /models/LLaDA-8B-Instruct --dtype bfloat16 \\
      --task-param train=gsm8k_train.jsonl --task-param test=gsm8k_test.jsonl \\
      --task-param prompt=question --task-param metric=gsm8k --set cache=dual --n-val 64 --n-trials 12
  adec decode --controller tuned:runs/tune/margin_topk-addition-tiny-addition.yaml ...
"""


def register(sub: argparse._SubParsersAction) -> None:
    from adaptive_decoding.framework.cli.options import MODEL_HELP, TASK_PARAM_HELP, add_model_args

    p = sub.add_parser("tune", help="tune a controller with Optuna (accuracy vs NFE), export the chosen point",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--controller", required=True, help="registered controller with a search space")
    p.add_argument("--task", required=True, help="task name (see 'adec list tasks')")
    add_model_args(p, model_default=None, model_help=MODEL_HELP)
    p.add_argument("--task-param", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help=TASK_PARAM_HELP)
    p.add_argument("--n-trials", type=int, default=20, help="total finished trials of the study (default: 20)")
    p.add_argument("--workers", type=int, default=1, help="processes sharing the storage (default: 1)")
    p.add_argument("--storage", default=None,
                   help="memory | journal:PATH | sqlite:///PATH | postgresql://... (default: OUT/STUDY.db)")
    p.add_argument("--study-name", default=None, help="default: CONTROLLER-TASK-MODEL")
    p.add_argument("--n-val", type=int, default=64, help="validation examples per trial (default: 64)")
    p.add_argument("--n-test", type=int, default=200, help="test examples for the report (default: 200)")
    p.add_argument("--batch-size", type=int, default=64, help="decoding batch size (default: 64)")
    p.add_argument("--max-drop", type=float, default=0.01,
                   help="accuracy the chosen point may lose vs sequential decoding (default: 0.01)")
    p.add_argument("--prune-margin", type=float, default=0.25,
                   help="prune trials this far below sequential on the first chunk (default: 0.25)")
    p.add_argument("--prune-fraction", type=float, default=0.25,
                   help="fraction of the validation examples in the first chunk (default: 0.25)")
    p.add_argument("--no-prune", action="store_true", help="never prune")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="decoding option, or controller parameter held fixed (taken out of the space)")
    p.add_argument("--range", dest="ranges", action="append", default=[], metavar="NAME=LOW:HIGH",
                   help="replace a parameter's declared search range, repeatable (e.g. --range eta=0.9:0.999; a "
                        "nested controller's by its dotted name, --range inner.threshold=0.8:0.99); checked "
                        "against the parameter's bounds; ints stay ints, a log-scale range stays log")
    p.add_argument("--out", default="runs/tune", help="output folder (default: runs/tune)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default: 0)")
    p.add_argument("--no-plot", action="store_true", help="skip the Pareto plot")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.cli.options import model_options, parse_task_params, split_settings
    from adaptive_decoding.framework.core.params import parse_assignments
    from adaptive_decoding.framework.tuning.front import NoCompleteTrialError
    from adaptive_decoding.framework.tuning.study import tune_controller

    cfg_kw, fixed = split_settings(args.controller, parse_assignments(args.sets))
    options = model_options(args)
    ranges = {}
    for pair in args.ranges:
        name, sep, text = pair.partition("=")
        if not sep or ":" not in text:
            raise CLIError(f"--range expects NAME=LOW:HIGH (e.g. eta=0.9:0.999), got {pair!r}")
        ranges[name.strip()] = text.strip()
    try:
        result = tune_controller(args.controller, args.task, tune_options(args, fixed, ranges, cfg_kw),
                                 model=args.model, task_params=parse_task_params(args.task, args.task_params),
                                 model_options=options, device=options.pop("device"))
    except NoCompleteTrialError as exc:  # the trials stay in the study's storage; more trials resume it
        raise CLIError(f"{exc}; the finished trials are kept, so running again continues the study") from None
    summary = Path(args.out) / f"{result.study_name}.json"
    summary.write_text(json.dumps(result.summary(), indent=2, default=str))
    return 0


def tune_options(args: argparse.Namespace, fixed: dict, ranges: dict, decode: dict) -> Any:
    """:class:`~adaptive_decoding.framework.tuning.options.TuneOptions`, built once from the flags (``--set`` already split
    into the controller's ``fixed`` parameters and the ``decode`` options, ``--range`` into ``ranges``)."""
    from adaptive_decoding.framework.tuning.options import TuneOptions

    return TuneOptions.from_dict({
        "search": {"n_trials": args.n_trials, "seed": args.seed, "fixed": fixed, "ranges": ranges,
                   "prune_margin": None if args.no_prune else args.prune_margin,
                   "prune_fraction": args.prune_fraction},
        "evaluation": {"n_val": args.n_val, "n_test": args.n_test, "batch_size": args.batch_size,
                       "max_drop": args.max_drop, "decode": decode},
        "study": {"storage": args.storage, "study_name": args.study_name, "workers": args.workers},
        "output": {"out_dir": args.out, "plot": not args.no_plot},
    })
