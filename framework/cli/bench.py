"""``adec bench``: a quick side-by-side table of strategies on one task.

Every strategy runs on the same model, the same test examples and the same seeds, in one
process, one after the other; times are medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from adaptive_decoding.framework.cli.options import (
    MODEL_HELP,
    TASK_PARAM_HELP,
    add_model_args,
    load_cli_model,
    model_options,
    parse_task_params,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="compare the baselines (or given controllers) on a task",
        description=(
            "Print, for a few strategies on a task: accuracy, mean NFE, tokens per forward, "
            "median ms per generated token, peak memory, and the loop's overhead relative to the "
            "model's forward time; then one line reading the table (the fastest strategy within "
            "one point of one-token-per-step decoding, and how far the oracle is above it).\n\n"
            "Default: 9x9 Sudoku (tiny-sudoku9 ships with the package, nothing to train) and the "
            "'newcomer' suite: one-token-per-step decoding, random and confidence order at four tokens "
            "per forward, two Fast-dLLM thresholds, EB, and the oracle.\n\n"
            "Examples:\n  adec bench\n  adec bench --task addition --suite baselines --repeats 3\n"
            "  adec bench --controller fast_dllm:threshold=0.8 --controller oracle\n"
            "  adec bench --task data --model /models/LLaDA-8B-Instruct --dtype bfloat16 \\\n"
            "      --task-param test=gsm8k_test.jsonl --task-param prompt=question --task-param metric=gsm8k \\\n"
            "      --set cache=dual --n 100 --batch-size 16"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", default="sudoku9", help="task name (see 'adec list tasks'; default: sudoku9)")
    p.add_argument("--suite", default="newcomer", choices=("newcomer", "baselines"),
                   help="strategies when no --controller is given: newcomer (a few rows and the oracle, "
                        "the default) or baselines (every published baseline)")
    add_model_args(p, model_default=None, model_help=MODEL_HELP)
    p.add_argument("--task-param", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help=TASK_PARAM_HELP)
    p.add_argument("--controller", action="append", default=[], metavar="NAME[:k=v,...]",
                   help="strategies to compare instead of the baseline suite, e.g. "
                        "--controller fast_dllm:threshold=0.8 (repeatable)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="decoding option for every strategy (gen_length, block_length, temperature, eos_fill, ...)")
    p.add_argument("--n", type=int, default=50, help="test examples (default: 50; 100 or more to compare accuracies)")
    p.add_argument("--batch-size", type=int, default=100, help="batch size (default: 100)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timing repeats; ms/token is their median (default: 1; use 3 or more to compare times)")
    p.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    p.add_argument("--eos-pairs", action="store_true",
                   help="also run strategies with end-of-text fill (eos_fill=true) to show its NFE saving")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="the PNG of accuracy against tokens per forward (default: runs/bench/TASK.png)")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.set_defaults(func=run)


def parse_controller_arg(text: str) -> tuple[str, dict]:
    from adaptive_decoding.framework.core.params import parse_assignments

    name, _, rest = text.partition(":")
    if name == "tuned":  # tuned:PATH keeps its colon
        return text, {}
    params = parse_assignments([kv for kv in rest.split(",") if kv]) if rest else {}
    return name, params


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.experiments.strategies import BASELINES, EOS_PAIRS, NEWCOMER, Strategy
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.core.params import parse_assignments
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller
    from adaptive_decoding.framework.engine.evaluate import evaluate
    from adaptive_decoding.framework.tasks.base import get_task

    if args.n < 1 or args.repeats < 1 or args.batch_size < 1:
        raise CLIError("--n, --repeats and --batch-size must be ≥ 1")
    options = model_options(args)
    task = get_task(args.task, **parse_task_params(args.task, args.task_params))
    loaded = load_cli_model(args.model, options, task=task)
    cfg_kw = {"gen_length": task.gen_length, "block_length": task.default_block_length, "seed": args.seed}
    cfg_kw.update(parse_assignments(args.sets))
    config = DecodeConfig.build(**cfg_kw)
    if args.controller:
        strategies = []
        for text in args.controller:
            name, params = parse_controller_arg(text)
            strategies.append(Strategy(text, name, params))
    else:
        strategies = [s for s in (NEWCOMER if args.suite == "newcomer" else BASELINES) if s.applies_to(task.name)]
        strategies += list(EOS_PAIRS) if args.eos_pairs else []
    rows = []
    print(f"task={task.name} model={loaded.name} n={args.n} G={config.gen_length} "
          f"block={config.effective_block_length} seed={args.seed} repeats={args.repeats}", file=sys.stderr)
    width = max([30] + [len(s.label) for s in strategies])
    header = (f"{'strategy':<{width}} {'acc':>6} {'NFE':>7} {'tok/fwd':>8} {'tpf_mean':>8} {'ms/tok':>8} "
              f"{'peakMB':>8} {'loop/fwd':>9}")
    print(header)
    print("-" * len(header))
    for s in strategies:
        ctrl = build_controller(s.controller, **s.resolve(config.gen_length, config.effective_block_length))
        cfg = DecodeConfig.build(**{**config.get_params(), **s.decode}) if s.decode else config
        res = evaluate(loaded, task, ctrl, cfg, strategy=s.label, n=args.n, batch_size=args.batch_size,
                       repeats=args.repeats, lookahead=_lookahead(s))
        row = res.row()
        row.update(kind=s.kind or getattr(ctrl, "kind", ""), lookahead=s.lookahead)
        rows.append(row)
        print(f"{s.label:<{width}} {res.accuracy:>6.3f} {res.nfe:>7.2f} {res.tpf:>8.2f} {res.tpf_mean:>8.2f} "
              f"{res.ms_per_token:>8.3f} {res.peak_mem_mb:>8.1f} {res.extra['loop_overhead_ratio']:>9.3f}")
        sys.stdout.flush()
    print(reading(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    if not args.no_plot:
        path = plot_rows(rows, args.plot or f"runs/bench/{task.name}.png",
                         f"{task.name} on {loaded.name}: {args.n} test examples, G={config.gen_length}")
        print(f"plot: {path}", file=sys.stderr)
    return 0


def _lookahead(strategy: Any) -> Any:
    """The strategy's :class:`adaptive_decoding.framework.engine.lookahead.Lookahead` (the evaluation hands its scorers
    the tokenizer, the prompts and the task's meta), or ``None``."""
    if not strategy.lookahead:
        return None
    from adaptive_decoding.framework.engine.lookahead import Lookahead

    return Lookahead.build(**strategy.lookahead)


def plot_rows(rows: list[dict], path: str, title: str) -> Any:
    """The bench table as a PNG of accuracy against tokens per forward (the report's plot)."""
    from pathlib import Path

    from adaptive_decoding.experiments.plots import plot_task

    shown = [{**r, "quality": r["accuracy"], "quality_metric": "accuracy", "higher_is_better": True,
              "curve": None, "lookahead": bool(r.get("lookahead"))} for r in rows]
    return plot_task(shown, Path(path), title)


def reading(rows: list[dict], tolerance: float = 0.01) -> str:
    """One line that reads a bench table: the fastest strategy by total cost (the fewest forwards per
    example, i.e. the most answer tokens per forward pooled over the examples) whose accuracy is
    within ``tolerance`` of one-token-per-step decoding, the oracle's room, and the losses."""
    ref = next((r for r in rows if r.get("kind") == "reference"), None)
    oracle = next((r for r in rows if r.get("kind") == "oracle"), None)
    if ref is None:
        return "reading: no one-token-per-step reference in the table, nothing to match accuracy against"
    ok = [r for r in rows if r.get("kind") not in ("reference", "oracle")
          and r["accuracy"] >= ref["accuracy"] - tolerance]
    lost = [r for r in rows if r.get("kind") not in ("reference", "oracle") and r not in ok]
    text = f"reading: one token per step reaches {ref['accuracy']:.1%}"
    if ok:
        best = min(ok, key=lambda r: (r["nfe"], -r["tpf"]))
        text += (f"; the fastest within {tolerance:.0%} of it is {best['strategy']} at {best['nfe']:.2f} forwards "
                 f"({best['tpf']:.2f} tokens per forward)")
        if oracle is not None and best["tpf"] > 0:
            text += f"; the oracle commits {oracle['tpf'] / best['tpf']:.1f}x as many per forward ({oracle['tpf']:.2f})"
    else:
        text += "; no parallel strategy stays within that accuracy"
    if lost:
        worst = min(lost, key=lambda r: r["accuracy"])
        text += f"; {len(lost)} lose accuracy, worst {worst['strategy']} ({worst['accuracy']:.1%})"
    return text
