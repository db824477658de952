"""``adec report``: docs/benchmark.md (plots, then tables), docs/plots/*.png and docs/benchmark.json."""

from __future__ import annotations

import argparse
import shlex
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="write the benchmark report from finished runs",
        description=(
            "Read run folders written by 'adec run' and write, into --out: benchmark.md (per task a "
            "plot of quality against tokens per forward, one line per sweep, then the table strategy | "
            "AUP | quality | NFE | tokens per forward | ms per token | peak memory sorted by AUP, "
            "accuracy under parallelism; with the machine, the commands and the seeds), "
            "plots/benchmark-<task>.png and benchmark.json (rows, and per task AUP per curve and y_max).\n\n"
            "Example:\n  adec report --runs runs/benchmark --out docs/"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", action="append", default=None, metavar="DIR",
                   help="a run folder, or a folder of run folders (repeatable; default: runs/)")
    p.add_argument("--out", default="docs", help="output folder (default: docs/)")
    p.add_argument("--title", default="Benchmark", help="title of the report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.experiments.report import ReportError, write_report
    from adaptive_decoding.framework.cli.errors import CLIError

    runs = args.runs or ["runs"]
    command = "adec " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["report"] else \
        f"adec report --runs {' --runs '.join(runs)} --out {args.out}"
    try:
        out = write_report(runs, args.out, title=args.title, command=command)
    except ReportError as exc:
        raise CLIError(str(exc)) from None
    for key, path in out.items():
        print(f"{key}: {path}")
    return 0
