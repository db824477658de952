"""Batch generation that survives faults and bad input, and loses nothing.

:func:`run_generation_job` decodes many prompts into a JSONL file of result rows (schema:
:func:`validate_row`, docs/generate.md). What it guarantees:

* **Durable, resumable output.** Each row is one ``os.write`` of one JSON line to a file opened
  with ``O_APPEND``, and every batch is ``fsync``-ed. Rows are keyed by a stable id (given, or
  ``h`` + a hash of prompt, per-item params, settings and occurrence). Re-running the same job
  reads the file, removes a torn last line left by a kill, and decodes only the ids not yet in it:
  no duplicate, no missing row. A file written with other settings is refused, not mixed.
* **Adaptive batching.** An out-of-memory error (``torch.OutOfMemoryError``, or a RuntimeError
  saying "out of memory" / "can't allocate memory", or MemoryError) halves the batch and re-runs
  the same items; after ``grow_after`` clean batches it grows back by a binary search below the
  size that failed, and probes larger sizes again later (:class:`BatchSizer`).
* **Per-item isolation.** Any other failure of a batch splits it in halves (bisection), so one bad
  item costs O(log B) extra decodes and the others still come out batched. An item that fails on
  its own is retried ``max_retries`` times; then a controller failure falls back to
  ``fallback_controller`` without lookahead (row marked ``fallback: true`` with the reason), a
  scorer failure to the same controller without lookahead, and anything else (or a failing
  fallback) becomes an error row. Deterministic input checks (empty prompt, prompt + G longer
  than the model's context, a prompt the tokenizer cannot encode) become error rows at once.
* **Timeouts.** The deadline of a batch is ``min(start + item_timeout_s, job deadline)``; it is
  checked before every forward pass (decode steps and lookahead rollouts alike), so a batch stops
  at most one forward after its deadline. A batch past its item deadline is bisected like any
  failure; an item times out only when it runs past the limit alone (and again on its retry).
  Past the job deadline the job stops; unfinished items stay pending for a resume.
* **Ctrl-C** (KeyboardInterrupt) stops the job: written rows are already on disk; the summary
  says how many items are pending and that re-running the command resumes.
* **Determinism.** Item ``i`` decodes with the per-sample seed ``stable_seed(seed, id_i)``, and the
  decode loop makes a row depend only on its prompt and seed, so the output does not depend on
  the batch size, on OOM back-off, on bisection, or on a resume.

Latency of an item = the wall time of the batch that produced its row (what a user of that batch
waited). The summary gives nearest-rank P50/P95/P99 over this run's successful rows.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from adaptive_decoding.framework.engine.config import LATER_DEFAULTS, REMOVED_DEFAULTS, DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import Controller
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.reference import with_reference
from adaptive_decoding.framework.jobs.batcher import BatchSizer
from adaptive_decoding.framework.jobs.errors import (
    ControllerFailure,
    DeadlineExceeded,
    JobInputError,
    OutputFileError,
    ScorerFailure,
    failure_reason,
    free_memory,
    is_oom,
)
from adaptive_decoding.framework.jobs.guards import DeadlineModel, guarded_decode
from adaptive_decoding.framework.jobs.options import JobOptions
from adaptive_decoding.framework.jobs.output import SETTINGS_ID, ResultFile, rewrite_results, scan_results
from adaptive_decoding.framework.jobs.plan import (
    WorkItem,
    as_factory,
    base_row,
    check_job_options,
    controller_name,
    describe_lookahead,
    dry_reset,
    error_row,
    jsonable,
    plan_work,
    precheck,
    push_chunks,
    short_hash,
    take_batch,
)
from adaptive_decoding.framework.jobs.summary import JobSummary
from adaptive_decoding.framework.tasks.prompts import PromptItem


def run_generation_job(
    loaded_model: Any,
    items: Sequence[PromptItem],
    controller_factory: Controller | Callable[..., Controller],
    config: DecodeConfig,
    output_path: str | os.PathLike,
    options: Optional[JobOptions] = None,
    *,
    lookahead: Any = None,
    task: Any = None,
) -> JobSummary:
    """Decode ``items`` into ``output_path`` (JSONL, one row per item), resumably.

    Args:
        loaded_model: a :class:`adaptive_decoding.framework.models.protocol.LoadedModel` (``denoiser``, ``tokenizer``,
            ``name``).
        items: the prompts (:func:`adaptive_decoding.framework.tasks.prompts.read_prompts`); ``params`` override decoding
            options and controller parameters per item (items with equal settings share batches).
        controller_factory: a built controller, or ``factory(**overrides) -> Controller``.
        config: the loop's options (gen_length G, block_length, temperature, seed ...).
        output_path: the results file; rows already in it are kept and not decoded again.
        options: :class:`~adaptive_decoding.framework.jobs.options.JobOptions` (default every default): ``batching``
            (the largest batch B, ``grow_after`` an OOM), ``faults`` (``item_timeout_s`` /
            ``job_timeout_s``, ``max_retries``, ``fallback_controller``, ``on_error``: ``"refuse"``
            stops the job before any work on invalid per-item params, ``"skip"`` reports those items
            in the summary), ``output`` (``overwrite``, ``retry_errors``, ``fsync``, ``progress``,
            ``log``, ``skipped``: bad input lines already skipped by the reader) and ``settings``
            (``seed`` overriding ``config.seed``, item ``i`` using ``stable_seed(seed, id_i)``;
            ``lookahead_spec`` for the settings hash).
        lookahead: a lookahead object for :func:`adaptive_decoding.framework.engine.loop.decode`, or ``None``.
        task: the task the items are examples of (``adec generate --task``), or ``None``: each batch's
            decode context (:meth:`DecodeContext.for_batch`) gets its name in every meta and its spans.

    Raises (all before any work): :class:`ParameterError` for a bad option or parameter value,
    :class:`JobInputError` for invalid per-item params with ``on_error="refuse"``, :class:`OutputFileError`
    for an output that cannot be resumed safely.
    """
    from tqdm.auto import tqdm

    opts = (options or JobOptions()).validate()
    b, f, o = opts.batching, opts.faults, opts.output
    say = o.log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    t_job = time.monotonic()
    path = os.fspath(output_path)
    check_job_options(b.batch_size, f.item_timeout_s, f.job_timeout_s, f.max_retries, f.on_error, b.grow_after)
    summary = JobSummary(output=path, skipped=list(o.skipped), batch_size_start=b.batch_size)
    job, works = _prepared_job(loaded_model, items, controller_factory, config, opts, lookahead, t_job, summary,
                               task)
    out, todo = _open_output(path, job.settings_hash, works, o.overwrite, o.retry_errors, o.fsync, summary, say)
    sizer = BatchSizer(b.batch_size, grow_after=b.grow_after)
    sink = _RowSink(out, path, summary, sizer, tqdm(total=len(todo), unit="item", disable=not o.progress,
                                                    file=sys.stderr, dynamic_ncols=True, desc="generate"))
    try:
        queue = _prechecked_queue(todo, job, sink)
        _run_batches(queue, job, sizer, summary, sink, say)
    except KeyboardInterrupt:
        summary.status = "interrupted"
    finally:
        sink.close()
        _close_summary(summary, sink, todo, sizer)
    return summary


def _prepared_job(loaded_model: Any, items: Sequence[PromptItem],
                  controller_factory: Controller | Callable[..., Controller], config: DecodeConfig,
                  opts: JobOptions, lookahead: Any, t_job: float, summary: JobSummary,
                  task: Any = None) -> tuple[_Job, list[WorkItem]]:
    """Validate the options, controllers and lookahead, hash the settings and plan the items: the job
    and its work items. Nothing here touches the model's weights or the output file; invalid items
    stop the job (``on_error="refuse"``) or go to ``summary.skipped``."""
    f = opts.faults
    config = _job_config(config, opts.settings.seed)
    factory = as_factory(controller_factory)
    probe = DecodeContext.for_batch(loaded_model.tokenizer, list(items[:1]), task=task, gen_length=config.gen_length)
    base_ctrl, fallback = _checked_controllers(factory, f.fallback_controller, lookahead, config,
                                               loaded_model.denoiser, probe)
    settings_hash = short_hash(_settings(loaded_model, base_ctrl, config, lookahead, opts.settings.lookahead_spec,
                                         fallback))
    mask_id = int(loaded_model.denoiser.mask_token_id)
    works, problems = plan_work(items, factory, base_ctrl, config, mask_id, settings_hash)
    if problems and f.on_error == "refuse":
        raise JobInputError(problems)
    summary.skipped += problems
    deadline = t_job + f.job_timeout_s if f.job_timeout_s is not None else None
    job = _Job(loaded_model, lookahead, fallback, settings_hash, f.item_timeout_s, f.job_timeout_s, t_job,
               deadline, f.max_retries, task)
    return job, works


def _job_config(config: DecodeConfig, seed: Optional[int]) -> DecodeConfig:
    """The job's decoding options: ``config`` rebuilt (and so re-checked), with ``seed`` if given."""
    base_cfg = config.get_params()
    if seed is not None:
        base_cfg["seed"] = seed
    return DecodeConfig.build(**base_cfg)


def _checked_controllers(factory: Callable[..., Controller], fallback_controller: str | Controller | None,
                         lookahead: Any, config: DecodeConfig, denoiser: Any,
                         probe: DecodeContext) -> tuple[Controller, Optional[Controller]]:
    """Build and validate the job's controller and its fallback (each reset once on a dry run, the
    controller with ``probe``, the decode context of the job's first item) and validate the lookahead:
    every bad option, and a context the controller needs and the job cannot give, fails here, before any work."""
    base_ctrl = factory()
    base_ctrl.validate()
    dry_reset(base_ctrl, config, int(denoiser.mask_token_id), probe)
    if lookahead is not None and hasattr(lookahead, "validate"):
        lookahead.validate()
    fallback = None
    if fallback_controller is not None:
        fallback = (build_controller(fallback_controller) if isinstance(fallback_controller, str)
                    else fallback_controller)
        fallback.validate()
        dry_reset(fallback, config, int(denoiser.mask_token_id))
    return base_ctrl, fallback


def _settings(loaded_model: Any, base_ctrl: Controller, config: DecodeConfig, lookahead: Any,
              lookahead_spec: Optional[str], fallback: Optional[Controller]) -> dict[str, Any]:
    """What a results file's rows were written with (its hash is each row's ``settings``)."""
    settings = {
        "schema": SETTINGS_ID, "model": loaded_model.name, "controller": jsonable(base_ctrl.to_dict()),
        "config": jsonable(_hashed_config(config)),
        "lookahead": describe_lookahead(lookahead, lookahead_spec),
        "fallback": jsonable(fallback.to_dict()) if fallback is not None else None,
    }
    info = getattr(loaded_model, "info", None) or {}
    loading = {k: info[k] for k in ("dtype", "chat_template") if k in info}  # hub checkpoints: --dtype, chat
    if loading:  # (absent for the tiny models, so their results files keep their settings hash)
        settings["loading"] = loading
    return settings


@dataclass
class _Job:
    """What every batch of one job decodes with, and its limits."""

    loaded_model: Any
    lookahead: Any
    fallback: Optional[Controller]
    settings_hash: str
    item_timeout_s: Optional[float]
    job_timeout_s: Optional[float]
    t_job: float
    deadline: Optional[float]  # monotonic time the job stops at (None: no job timeout)
    max_retries: int
    task: Any = None  # the task the items are examples of (adec generate --task), for the decode context


class _RowSink:
    """Writes rows to the results file and counts them in the summary and the progress bar."""

    def __init__(self, out: ResultFile, path: str, summary: JobSummary, sizer: BatchSizer, bar: Any) -> None:
        self.out, self.path, self.summary, self.sizer, self.bar = out, path, summary, sizer, bar
        self.written: set[str] = set()
        self.retried: set[str] = set()
        self.t_run = time.perf_counter()

    def emit(self, rows: list[dict]) -> None:
        summary = self.summary
        try:
            self.out.write(rows)
        except OSError as exc:
            raise OutputFileError(f"cannot write {self.path} ({exc}); the rows written so far are kept: "
                                  f"fix the cause (disk space?) and run the same command again to "
                                  f"resume") from None
        for row in rows:
            self.written.add(row["id"])
            if row["status"] == "ok":
                summary.done += 1
                summary.tokens += len(row["generated_ids"])
                summary.latencies.append(row["latency_s"])
                summary.fallbacks += int(row["fallback"])
                summary.step_fallbacks += row["lookahead_fallbacks"]
            else:
                summary.failed += 1
        self.bar.update(len(rows))
        elapsed = time.perf_counter() - self.t_run
        self.bar.set_postfix(tok_s=f"{summary.tokens / max(elapsed, 1e-9):.0f}", bs=self.sizer.size,
                             failed=summary.failed, refresh=False)

    def close(self) -> None:
        """Close the progress bar, then the results file."""
        self.bar.close()
        self.out.close()


def _prechecked_queue(todo: list[WorkItem], job: _Job, sink: _RowSink) -> deque[WorkItem]:
    """Write the error rows of items that fail the input checks; queue the rest, longest prompts
    first inside each settings group (an OOM shows up early, padding is small)."""
    queue: deque[WorkItem] = deque()
    pre_rows = []
    for w in todo:
        row = precheck(w, job.loaded_model.tokenizer, job.loaded_model, job.settings_hash)
        if row is not None:
            pre_rows.append(row)
        else:
            queue.append(w)
    if pre_rows:
        sink.emit(pre_rows)
    order: dict[int, int] = {}
    for w in queue:
        order.setdefault(id(w.group), len(order))
    return deque(sorted(queue, key=lambda w: (order[id(w.group)], -len(w.ids))))


def _run_batches(queue: deque[WorkItem], job: _Job, sizer: BatchSizer, summary: JobSummary, sink: _RowSink,
                 say: Callable[[str], None]) -> None:
    """Decode the queue batch by batch until it is empty or the job deadline passes: an OOM halves
    the batch, any other failure goes to :func:`_on_failure` (bisect, retry, fall back, error row)."""
    explicit: deque[list[WorkItem]] = deque()
    while queue or explicit:
        if job.deadline is not None and time.monotonic() >= job.deadline:
            summary.status = "job_timeout"
            break
        batch = explicit.popleft() if explicit else take_batch(queue, sizer.size)
        if len(batch) > sizer.size:  # made before the last OOM: split to the current size first
            push_chunks(explicit, batch, sizer.size)
            continue
        try:
            rows = _decode_batch(batch, job)
        except DeadlineExceeded as exc:
            if exc.kind == "job":
                summary.status = "job_timeout"
                break
            kind, reason = "timeout", str(exc)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - classified, never lost
            if is_oom(exc):
                free_memory()
                if len(batch) > 1:
                    sizer.on_oom(len(batch))
                    say(f"out of memory at batch size {len(batch)}; retrying these items at {sizer.size}")
                    push_chunks(explicit, batch, sizer.size)
                    continue
            kind, reason = _failure_kind(exc)
        else:
            sink.emit(rows)
            sizer.on_success(len(batch))
            continue
        _on_failure(batch, kind, reason, job, explicit, summary, sink)


def _failure_kind(exc: Exception) -> tuple[str, str]:
    """``(kind, reason)`` of a failed batch: ``oom`` (at batch size 1), ``controller``, ``scorer``
    or ``model``."""
    if is_oom(exc):
        return "oom", f"out of memory at batch size 1 ({failure_reason(exc)})"
    if isinstance(exc, ControllerFailure):
        return "controller", str(exc)
    if isinstance(exc, ScorerFailure):
        return "scorer", str(exc)
    return "model", failure_reason(exc)


def _close_summary(summary: JobSummary, sink: _RowSink, todo: list[WorkItem], sizer: BatchSizer) -> None:
    """The summary's closing figures: run time, retries, pending items, batch sizes."""
    summary.elapsed_s = time.perf_counter() - sink.t_run
    summary.retried = len(sink.retried)
    summary.pending = len([w for w in todo if w.id not in sink.written])
    summary.oom_events = sizer.oom_events
    summary.batch_size_final = sizer.size
    summary.batch_size_min = sizer.smallest


def _open_output(path: str, settings_hash: str, works: list[WorkItem], overwrite: bool, retry_errors: bool,
                 fsync: bool, summary: JobSummary,
                 say: Callable[[str], None]) -> tuple[ResultFile, list[WorkItem]]:
    """Open the output and count what is already done: the open file and the work items still to decode."""
    out, existing = _read_output(path, settings_hash, overwrite, retry_errors, fsync, summary, say)
    done_ids = {r["id"] for r in existing}
    summary.total = len(works)
    todo = [w for w in works if w.id not in done_ids]
    summary.already_done = len(works) - len(todo)
    return out, todo


def _read_output(path: str, settings_hash: str, overwrite: bool, retry_errors: bool, fsync: bool,
                 summary: JobSummary, say: Callable[[str], None]) -> tuple[ResultFile, list[dict]]:
    """Lock the output first (no other job appends while this one reads and repairs it), read its
    rows, refuse rows written with other settings, cut a torn last line, drop error rows if asked."""
    out = ResultFile(path, fsync=fsync)
    out.open()
    try:
        if overwrite:
            rewrite_results(path, [])
            out.reopen()
        existing, note = scan_results(path, repair=False)
        other = [r for r in existing if r["settings"] != settings_hash]
        if other:
            raise OutputFileError(
                f"{path} holds {len(other)} rows written with other settings "
                f"(settings {other[0]['settings']} != {settings_hash}: model, controller, decoding options, "
                f"scorer or fallback differ); use "
                f"another --output, or --overwrite to start it again")
        if note:
            scan_results(path, repair=True)
            summary.notes.append(note)
            say(note)
        if retry_errors and any(r["status"] == "error" for r in existing):
            existing = [r for r in existing if r["status"] != "error"]
            rewrite_results(path, existing)
            out.reopen()
            summary.notes.append("removed the error rows of the previous run; those items run again")
    except BaseException:
        out.close()
        raise
    return out, existing


def _decode_batch(batch: list[WorkItem], job: _Job) -> list[dict]:
    """Decode one batch (all of one group and mode) into rows, with the batch's
    :meth:`DecodeContext.for_batch` (its items' prompts and metas, the job's task's spans), under the
    job's item and job deadlines; raises on any failure."""
    mode = batch[0].mode
    group = batch[0].group
    ctrl = job.fallback if mode == "fallback" else group.controller
    assert ctrl is not None
    la = job.lookahead if mode == "normal" else None
    loaded_model, settings_hash = job.loaded_model, job.settings_hash
    started = time.monotonic()
    model = DeadlineModel(loaded_model.denoiser, started, job.item_timeout_s, job.deadline, job.job_timeout_s,
                          job.t_job)
    t0 = time.perf_counter()
    tok = loaded_model.tokenizer
    context = DecodeContext.for_batch(tok, [w.item for w in batch], task=job.task,
                                      gen_length=group.config.gen_length)
    context = with_reference(context, model, [w.ids for w in batch], ctrl, group.config, seeds=[w.seed for w in batch])
    res = guarded_decode(model, [w.ids for w in batch], ctrl, group.config, name=controller_name(ctrl),
                         seeds=[w.seed for w in batch], lookahead=la, context=context)
    latency = time.perf_counter() - t0
    step_fallbacks = res.fallbacks if res.fallbacks is not None else torch.zeros(len(batch), dtype=torch.long)
    rows = []
    for b, w in enumerate(batch):
        gen = [int(t) for t in res.generated[b].tolist()]
        row = base_row(w, loaded_model, settings_hash, controller_name(ctrl))
        row.update(text=tok.decode(gen, stop_at_eos=True), prompt_ids=list(w.ids), generated_ids=gen,
                   nfe=int(res.nfe[b]), steps=int(res.steps[b]), lookahead_nfe=int(res.lookahead_nfe[b]),
                   lookahead_fallbacks=int(step_fallbacks[b]),
                   remasks=int(res.remasks[b]) if res.remasks is not None else 0, batch_size=len(batch),
                   latency_s=round(latency, 6))
        rows.append(row)
    return rows


def _hashed_config(config: DecodeConfig) -> dict[str, Any]:
    """The decoding options the settings hash covers: options added later are left out at the
    default that keeps the earlier behaviour (``LATER_DEFAULTS``) and options removed since are put back
    at the value earlier files recorded (``REMOVED_DEFAULTS``), so earlier results files resume."""
    kept = {k: v for k, v in config.get_params().items() if not (k in LATER_DEFAULTS and v == LATER_DEFAULTS[k])}
    return {**REMOVED_DEFAULTS, **kept}


def _on_failure(batch: list[WorkItem], kind: str, reason: str, job: _Job, explicit: deque,
                summary: JobSummary, sink: _RowSink) -> None:
    """Bisect a failed batch (both halves to the front of ``explicit``); retry a failed single item
    up to the job's ``max_retries``, then decode it with the fallback controller (a controller
    failure) or without lookahead (a scorer failure), else write its error row to ``sink``."""
    max_retries, fallback = job.max_retries, job.fallback
    if len(batch) > 1:
        half = len(batch) // 2
        explicit.appendleft(batch[half:])
        explicit.appendleft(batch[:half])
        summary.bisections += 1
        return
    w = batch[0]
    if w.mode_failures < max_retries:
        w.mode_failures += 1
        w.retries += 1
        sink.retried.add(w.id)
        explicit.appendleft([w])
        return
    if kind == "controller" and w.mode != "fallback" and fallback is not None:
        w.mode, w.mode_failures = "fallback", 0
        w.fallback_reason = (f"{reason} (failed {max_retries + 1} times); decoded with "
                             f"{controller_name(fallback)!r} without lookahead")
        explicit.appendleft([w])
        return
    if kind == "scorer" and w.mode == "normal":
        w.mode, w.mode_failures = "no_lookahead", 0
        w.fallback_reason = f"{reason} (failed {max_retries + 1} times); decoded without lookahead"
        explicit.appendleft([w])
        return
    sink.emit([error_row(w, job.loaded_model, job.settings_hash, kind, reason, fallback)])
