"""``adec generate``: batch generation from a prompts JSONL file into a resumable results JSONL.

Order of work (so that bad input costs nothing): read and check the prompt file, validate the
decoding options (with the defaults of the model's task, read without loading it), the
controller, the scorer and every item's ``params``, then load the model (which may train a
built-in one), then decode. See docs/generate.md for the file formats and the fault behaviour.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any, Optional

from framework.cli.options import (
    add_decoding_args,
    build_lookahead,
    load_cli_model,
    model_options,
    resolve_decoding,
)
from framework.core.params import parse_assignments
from framework.engine.controller_io import build_controller
from framework.jobs.errors import JobInputError, OutputFileError
from framework.jobs.plan import check_items, check_job_options
from framework.jobs.runner import run_generation_job
from framework.tasks.prompts import read_prompts

FLAGS = {"batch_size": "--batch-size", "item_timeout_s": "--item-timeout", "job_timeout_s": "--job-timeout",
         "max_retries": "--max-retries"}
EXIT_OK, EXIT_ITEM_ERRORS, EXIT_JOB_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 3, 130

EPILOG = """\
input  (one JSON object per line):
  {"prompt": "12+34=", "id": "q1", "params": {"threshold": 0.8}, "meta": {"answer": "46"}}
  "prompt" is required; "id" (default: a hash of prompt, params and settings), "params" (per-item
  decoding options / controller parameters, the keys of --set) and "meta" (copied to the output)
  are optional; any other field makes the line bad.

output (one JSON row per item, schema adec-generate/2, see docs/generate.md):
  id, status ok|error, text, generated_ids, nfe, steps, remasks, fallback, error, latency_s, ...

resume: run the same command again. Rows already in --output are kept; a torn last line from a
  kill is repaired; only the items without a row run. The output equals an uninterrupted run.

exit status: 0 all rows ok; 1 finished with error rows; 2 bad input or options (nothing ran);
  3 stopped by --job-timeout (resume to finish); 130 interrupted (resume to finish).

examples:
  adec generate --input prompts.jsonl --output results.jsonl --controller fast_dllm --set threshold=0.9
  adec generate --input prompts.jsonl --output results.jsonl --batch-size 32 --item-timeout 30 \\
      --job-timeout 3600 --on-bad-line skip
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate",
        help="batch generation from a prompts JSONL file (resumable, OOM-safe, per-item fallbacks)",
        description="Decode every prompt of a JSONL file into a results JSONL file, one row per prompt,\n"
                    "written as soon as it is done. Survives out-of-memory errors (the batch halves),\n"
                    "failing items (retried, then a fallback decoder or an error row), timeouts and\n"
                    "kills (run the same command again to resume).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    io = p.add_argument_group("files")
    io.add_argument("--input", required=True, metavar="PROMPTS.jsonl", help="prompts, one JSON object per line")
    io.add_argument("--output", required=True, metavar="RESULTS.jsonl",
                    help="results, one JSON row per prompt; resumed if it exists")
    io.add_argument("--on-bad-line", choices=("skip", "refuse"), default="refuse",
                    help="a malformed line or invalid per-item params: 'refuse' lists every bad line and "
                         "starts nothing (default); 'skip' reports them and runs the other lines")
    io.add_argument("--retry-errors", action="store_true",
                    help="decode again the items that have an error row in --output")
    io.add_argument("--overwrite", action="store_true", help="start --output from scratch")
    add_decoding_args(p)
    la = p.add_argument_group("lookahead")
    la.add_argument("--scorer", default=None, metavar="SPEC",
                   help="rank lookahead rollouts with these scorers, e.g. 'logprob:0.7,repetition:1' "
                        "(see 'adec list scorers'); a scorer failure falls back to decoding without lookahead")
    job = p.add_argument_group("job")
    job.add_argument("--batch-size", type=int, default=8, metavar="N",
                     help="largest batch (halved on out-of-memory, grown back after clean batches; default 8)")
    job.add_argument("--item-timeout", type=float, default=None, metavar="S",
                     help="seconds one batch may run; checked before every forward pass (default: none)")
    job.add_argument("--job-timeout", type=float, default=None, metavar="S",
                     help="seconds the whole run may take; then it stops and can be resumed (default: none)")
    job.add_argument("--max-retries", type=int, default=1, metavar="N",
                     help="re-runs of an item that failed on its own, before its fallback or error row (default 1)")
    job.add_argument("--fallback-controller", default="sequential", metavar="NAME",
                     help="plain decoder used for an item whose controller keeps failing, marked "
                          "'fallback' in its row; 'none' = write an error row instead (default: sequential)")
    job.add_argument("--no-progress", action="store_true", help="no progress bar")
    job.add_argument("--summary-json", default=None, metavar="PATH", help="also write the summary as JSON")
    p.set_defaults(func=run)


def load_model_for(name: str, device: str, **options: Any) -> Any:
    """The model of ``--model`` (a seam for tests: replace to inject a model); ``options`` are
    ``dtype``, ``trust_remote_code`` and ``chat`` (see :func:`framework.training.zoo.load_model`)."""
    return load_cli_model(name, {"device": device, **options})


def task_defaults(model: str, sets: list[str]) -> dict[str, Any]:
    """``gen_length`` / ``block_length`` of the task the model was trained for, known without
    loading it (a built-in name, or the ``task`` in a saved folder's config.json).

    ``block_length`` is left to the user when ``--set gen_length`` is given without it, so that a
    task's block length never conflicts with a generation length chosen on the command line.
    """
    from framework.models.saved import CONFIG_FILE
    from framework.training.zoo import MODELS

    task, task_params = None, {}
    cfg = Path(model).expanduser() / CONFIG_FILE
    try:
        if cfg.is_file():
            data = json.loads(cfg.read_text())
            task, task_params = data.get("task"), dict(data.get("task_params") or {})
        elif model in MODELS:
            task = MODELS.get(model).task
        if not task:
            return {}
        from framework.tasks.base import get_task

        t = get_task(task, **task_params)
    except Exception:  # noqa: BLE001 - a corrupt folder is reported by load_model, naming the file
        return {}
    out = {"gen_length": t.gen_length, "block_length": t.default_block_length}
    user = parse_assignments(sets)
    if "gen_length" in user and "block_length" not in user:
        del out["block_length"]
    return out


def run(args: argparse.Namespace) -> int:
    from framework.cli.errors import CLIError

    check_job_options(args.batch_size, args.item_timeout, args.job_timeout, args.max_retries, names=FLAGS)
    options = model_options(args)
    items, problems = read_prompts(args.input, on_error=args.on_bad_line)
    for prob in problems:
        print(f"adec generate: skipping {args.input}:{prob.line}: {prob.reason}", file=sys.stderr)
    setup = resolve_decoding(args, task_defaults(args.model, args.sets))
    fallback: Optional[Any] = None
    if str(args.fallback_controller).lower() != "none":
        fallback = build_controller(args.fallback_controller)
    item_problems = check_items(items, setup.controller, setup.config)
    if item_problems and args.on_bad_line == "refuse":
        raise JobInputError(item_problems)
    lookahead = build_lookahead(args)
    if lookahead is not None:
        lookahead.validate()
    device = options.pop("device")
    loaded = load_model_for(args.model, device, **options)

    previous = None
    try:  # SIGTERM (batch schedulers, `kill`) stops like Ctrl-C: flushed rows, resumable
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # pragma: no cover - not in the main thread
        pass
    try:
        summary = run_generation_job(
            loaded, items, setup.controller, setup.config, args.output,
            batch_size=args.batch_size, lookahead=lookahead, lookahead_spec=args.scorer,
            item_timeout_s=args.item_timeout, job_timeout_s=args.job_timeout, max_retries=args.max_retries,
            fallback_controller=fallback, on_error=args.on_bad_line, skipped=problems,
            retry_errors=args.retry_errors, overwrite=args.overwrite, progress=not args.no_progress,
        )
    except OutputFileError as exc:
        raise CLIError(str(exc)) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(summary.format(), file=sys.stderr)
    if args.summary_json:
        with open(args.summary_json, "w") as fh:
            json.dump(summary.to_dict(), fh, indent=2)
            fh.write("\n")
    if summary.status == "interrupted":
        return EXIT_INTERRUPTED
    if summary.status == "job_timeout":
        return EXIT_JOB_TIMEOUT
    return EXIT_ITEM_ERRORS if summary.failed else EXIT_OK


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
