"""``adec generate``: batch generation from a prompts JSONL file, or from a task's split (``--task``,
e.g. the ``data`` task over your own file), into a resumable results JSONL.

Order of work (so that bad input costs nothing): read and check the prompt file (or build the task
and read its examples), validate the decoding options (with the defaults of the task, or of the
model's task read without loading it), the controller, the scorer and every item's ``params``,
then load the model (which may train a built-in one), then decode. With ``--task`` every finished
row is then scored by the task. See docs/generate.md for the file formats and the fault behaviour.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from adaptive_decoding.framework.cli.options import (
    DEFAULT_MODEL,
    TASK_PARAM_HELP,
    add_decoding_args,
    build_lookahead,
    load_cli_model,
    model_options,
    parse_task_params,
    resolve_decoding,
)
from adaptive_decoding.framework.core.params import parse_assignments
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.layout import config_for_model
from adaptive_decoding.framework.jobs.errors import JobInputError, OutputFileError
from adaptive_decoding.framework.jobs.options import JobOptions
from adaptive_decoding.framework.jobs.plan import check_items, check_job_options
from adaptive_decoding.framework.jobs.runner import run_generation_job
from adaptive_decoding.framework.tasks.prompts import LineProblem, PromptItem, read_prompts

FLAGS = {"batch_size": "--batch-size", "item_timeout_s": "--item-timeout", "job_timeout_s": "--job-timeout",
         "max_retries": "--max-retries"}
EXIT_OK, EXIT_ITEM_ERRORS, EXIT_JOB_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 3, 130
SPLITS = ("train", "validation", "test")  # = adaptive_decoding.framework.tasks.base.SPLITS (not imported to build the parser)
ONE_INPUT = ("give exactly one of --input PROMPTS.jsonl (your prompts) and --task NAME (a task's split, e.g. "
             "--task data --task-param test=FILE.jsonl --task-param prompt=COLUMN)")

EPILOG = """\
input  (one JSON object per line):
  {"prompt": "12+34=", "id": "q1", "params": {"threshold": 0.8}, "meta": {"answer": "46"}}
  "prompt" is required; "id" (default: a hash of prompt, params and settings), "params" (per-item
  decoding options / controller parameters, the keys of --set) and "meta" (copied to the output)
  are optional; any other field makes the line bad.

--task instead of --input: the items are the examples of the task's --split (default test; --n N:
  the first N, default every row of a data / lm_eval split), with the task's example ids and, as
  meta, the example's meta plus its "answer". After the job every ok row is scored by the task
  (which cuts the text at its stop strings itself): 'score: MEAN (METRIC) over K of N rows' on
  stderr, "task_score" in --summary-json. gen_length / block_length default to the task's
  (--task-param gen_length=... block_length=..., or --set). Without --model: the task's built-in
  model (the data and lm_eval tasks need --model). Resume works as with --input.

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
  adec generate --task data --task-param test=gsm8k_test.jsonl --task-param prompt=question \\
      --task-param metric=gsm8k --model ./my-llada --output results.jsonl --n 100 --set threshold=0.9
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate",
        help="batch generation from a prompts JSONL file or a task's split (resumable, OOM-safe, "
             "per-item fallbacks)",
        description="Decode every prompt of a JSONL file (or every example of a task's split, then score\n"
                    "the rows) into a results JSONL file, one row per prompt, written as soon as it is\n"
                    "done. Survives out-of-memory errors (the batch halves), failing items (retried,\n"
                    "then a fallback decoder or an error row), timeouts and kills (run the same command\n"
                    "again to resume).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    io = p.add_argument_group("files")
    io.add_argument("--input", default=None, metavar="PROMPTS.jsonl",
                    help="prompts, one JSON object per line (or give --task instead)")
    io.add_argument("--output", required=True, metavar="RESULTS.jsonl",
                    help="results, one JSON row per prompt; resumed if it exists")
    io.add_argument("--on-bad-line", choices=("skip", "refuse"), default="refuse",
                    help="a malformed line or invalid per-item params: 'refuse' lists every bad line and "
                         "starts nothing (default); 'skip' reports them and runs the other lines")
    io.add_argument("--retry-errors", action="store_true",
                    help="decode again the items that have an error row in --output")
    io.add_argument("--overwrite", action="store_true", help="start --output from scratch")
    _add_task_args(p)
    add_decoding_args(p)
    p.set_defaults(model=None)  # resolved in run: DEFAULT_MODEL, or with --task the task's built-in model
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
    job.add_argument("--summary-json", default=None, metavar="PATH",
                     help="also write the summary as JSON (with --task: and the task's score, "
                          "\"task_score\")")
    p.set_defaults(func=run)


def _add_task_args(p: argparse.ArgumentParser) -> None:
    """``--task``, ``--task-param``, ``--split`` and ``--n``: a task's split as the input."""
    g = p.add_argument_group("task input (instead of --input)")
    g.add_argument("--task", default=None, metavar="NAME",
                   help="decode the examples of this task's --split (see 'adec list tasks'; 'data' = your "
                        "own file) and score every finished row with the task")
    g.add_argument("--task-param", dest="task_params", action="append", default=[], metavar="KEY=VALUE",
                   help=TASK_PARAM_HELP)
    g.add_argument("--split", default=None, choices=SPLITS, help="the split to decode (default: test)")
    g.add_argument("--n", type=int, default=None, metavar="N",
                   help="the first N examples of the split (default: every row of a data or lm_eval split; "
                        "required for a task that draws its examples without end)")


def load_model_for(name: Optional[str], device: str, task: Any = None, **options: Any) -> Any:
    """The model of ``--model`` (a seam for tests: replace to inject a model); ``options`` are
    ``dtype``, ``trust_remote_code`` and ``chat`` (see :func:`adaptive_decoding.framework.training.zoo.load_model`);
    with ``task`` (``--task``) the task's chat wish applies (``load_cli_model(..., task=task)``)."""
    return load_cli_model(name, {"device": device, **options}, task=task)


def task_lengths(task: Any, sets: list[str]) -> dict[str, Any]:
    """``gen_length`` / ``block_length`` of ``task`` as decoding defaults (``--set`` overrides them).

    ``block_length`` is left to the user when ``--set gen_length`` is given without it, so that a
    task's block length never conflicts with a generation length chosen on the command line.
    """
    out = {"gen_length": task.gen_length, "block_length": task.default_block_length}
    user = parse_assignments(sets)
    if "gen_length" in user and "block_length" not in user:
        del out["block_length"]
    return out


def task_defaults(model: str, sets: list[str]) -> dict[str, Any]:
    """:func:`task_lengths` of the task the model was trained for, known without loading it (a
    built-in name, or the ``task`` in a saved folder's config.json); ``{}`` when it names none."""
    from adaptive_decoding.framework.models.saved import CONFIG_FILE
    from adaptive_decoding.framework.training.zoo import MODELS

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
        from adaptive_decoding.framework.tasks.base import get_task

        t = get_task(task, **task_params)
    except Exception:  # noqa: BLE001 - a corrupt folder is reported by load_model, naming the file
        return {}
    return task_lengths(t, sets)


# ---------------------------------------------------------------------------------- --task input
def check_input_choice(args: argparse.Namespace) -> None:
    """Exactly one of ``--input`` and ``--task``; the task-only flags only with ``--task``."""
    from adaptive_decoding.framework.cli.errors import CLIError

    if (args.input is None) == (args.task is None):
        given = "both were given" if args.input is not None else "neither was given"
        raise CLIError(f"{ONE_INPUT}; {given}")
    if args.task is None:
        for flag, value in (("--task-param", args.task_params), ("--split", args.split), ("--n", args.n)):
            if value:
                raise CLIError(f"{flag} has no effect without --task NAME (the prompts come from --input)")
    if args.n is not None and args.n < 1:
        raise CLIError(f"--n={args.n} is out of range; allowed: integer in [1, inf) "
                       f"(or leave it out: every row)")


def split_size(task: Any, split: str) -> Optional[int]:
    """How many examples ``split`` of ``task`` has: every row of a ``data`` split or every document of
    an ``lm_eval`` split; ``None`` for a task that draws its examples without end."""
    rows = getattr(task, "split_rows", None)
    if callable(rows):
        return len(rows(split))
    loaded = getattr(task, "loaded", None)
    if callable(loaded):
        docs = loaded().docs
        return len(docs[split]) if split in docs else 0  # 0: task.examples names the splits it has
    return None


def task_examples(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The task of ``--task`` / ``--task-param`` (built and validated) and the examples of ``--split``:
    the first ``--n``, by default all of them."""
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.tasks.base import get_task

    task = get_task(args.task, **parse_task_params(args.task, args.task_params))
    split = args.split or "test"
    n = args.n
    if n is None:
        n = split_size(task, split)
        if n is None:
            raise CLIError(f"--task {args.task}: its {split} examples are drawn without end; give --n N")
    return task, task.examples(split, n)


def example_items(examples: Sequence[Any]) -> list[PromptItem]:
    """One job item per example: its prompt and id, as meta its meta plus ``answer`` (the expected answer)."""
    return [PromptItem(prompt=ex.prompt, id=str(ex.id), meta={**dict(ex.meta or {}), "answer": ex.answer})
            for ex in examples]


@dataclass
class TaskScore:
    """The task's mean score over the ok rows of the job's items (``rows`` of ``items``)."""

    metric: str
    mean: Optional[float]
    rows: int
    items: int

    def format(self) -> str:
        mean = "-" if self.mean is None else f"{self.mean:.3f}"
        return f"score: {mean} ({self.metric}) over {self.rows} of {self.items} rows"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "mean": self.mean, "rows": self.rows}


def score_rows(task: Any, examples: Sequence[Any], output: str) -> TaskScore:
    """Score every ok row of ``output`` that belongs to one of ``examples`` with ``task.score`` (rows of
    earlier runs included: a resumed job scores all of its rows); error and missing rows are not scored."""
    from adaptive_decoding.framework.jobs.output import read_results

    texts = {r["id"]: r["text"] for r in read_results(output)
             if r["status"] == "ok" and r["text"] is not None}
    scores = [float(task.score(ex, texts[str(ex.id)])) for ex in examples if str(ex.id) in texts]
    mean = sum(scores) / len(scores) if scores else None
    metric = str(getattr(task, "metric", "score"))
    return TaskScore(metric=metric, mean=mean, rows=len(scores), items=len(examples))


# ---------------------------------------------------------------------------------- the command
@dataclass
class _Input:
    """What the job decodes: its items and skipped lines, the decoding defaults, and (``--task``) the
    task and its examples."""

    items: list[PromptItem]
    problems: list[LineProblem]
    defaults: dict[str, Any]
    task: Any = None
    examples: Optional[list[Any]] = None


def read_input(args: argparse.Namespace) -> _Input:
    """The items of ``--input`` or ``--task``, and resolve ``--model`` (its default depends on which)."""
    if args.task is not None:
        task, examples = task_examples(args)
        if args.model is None:
            from adaptive_decoding.framework.training.zoo import default_model_name

            args.model = default_model_name(task)
        return _Input(example_items(examples), [], task_lengths(task, args.sets), task, examples)
    if args.model is None:
        args.model = DEFAULT_MODEL
    items, problems = read_prompts(args.input, on_error=args.on_bad_line)
    for prob in problems:
        print(f"adec generate: skipping {args.input}:{prob.line}: {prob.reason}", file=sys.stderr)
    return _Input(items, problems, task_defaults(args.model, args.sets))


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.framework.cli.errors import CLIError

    check_job_options(args.batch_size, args.item_timeout, args.job_timeout, args.max_retries, names=FLAGS)
    check_input_choice(args)
    options = model_options(args)
    source = read_input(args)
    items, problems = source.items, source.problems
    setup = resolve_decoding(args, source.defaults)
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
    if source.task is not None:
        options["task"] = source.task
    loaded = load_model_for(args.model, device, **options)
    config_for_model(setup.config, loaded.denoiser)  # a block length or cache the model has no meaning for: refused now

    previous = None
    try:  # SIGTERM (batch schedulers, `kill`) stops like Ctrl-C: flushed rows, resumable
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # pragma: no cover - not in the main thread
        pass
    try:
        summary = run_generation_job(loaded, items, setup.controller, setup.config, args.output,
                                     job_options(args, fallback, problems), lookahead=lookahead, task=source.task)
    except OutputFileError as exc:
        raise CLIError(str(exc)) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(summary.format(), file=sys.stderr)
    report = summary.to_dict()
    if source.task is not None:
        score = score_rows(source.task, source.examples or [], args.output)
        print(score.format(), file=sys.stderr)
        report["task_score"] = score.to_dict()
    if args.summary_json:
        with open(args.summary_json, "w") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
    if summary.status == "interrupted":
        return EXIT_INTERRUPTED
    if summary.status == "job_timeout":
        return EXIT_JOB_TIMEOUT
    return EXIT_ITEM_ERRORS if summary.failed else EXIT_OK


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def job_options(args: argparse.Namespace, fallback: Any, skipped: list) -> JobOptions:
    """The job's :class:`~adaptive_decoding.framework.jobs.options.JobOptions`, built once from the flags (``fallback``
    the checked ``--fallback`` controller, ``skipped`` the input lines the reader skipped)."""
    return JobOptions.from_dict({
        "batching": {"batch_size": args.batch_size},
        "faults": {"item_timeout_s": args.item_timeout, "job_timeout_s": args.job_timeout,
                   "max_retries": args.max_retries, "fallback_controller": fallback, "on_error": args.on_bad_line},
        "output": {"retry_errors": args.retry_errors, "overwrite": args.overwrite, "progress": not args.no_progress,
                   "skipped": skipped},
        "settings": {"lookahead_spec": args.scorer},
    })
