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

import gc
import hashlib
import json
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from .controller import Controller, DecodeState, build_controller
from .decoding import DecodeConfig, decode
from .prompts import ON_ERROR, LineProblem, PromptItem
from .params import ParameterError
from .rng import stable_seed

SCHEMA = "adec-generate/1"
ERROR_TYPES = ("empty_prompt", "too_long", "encode", "controller", "scorer", "timeout", "oom", "model", "output")
#: Row fields that must be identical whatever the batch size, back-off, bisection or resume.
RESULT_FIELDS = ("id", "status", "prompt", "params", "seed", "controller", "text", "prompt_ids",
                 "generated_ids", "nfe", "steps", "lookahead_nfe", "lookahead_fallbacks", "fallback", "error_type")
MAX_REASON = 500


# ---------------------------------------------------------------------------------- errors
class JobInputError(ParameterError):
    """Items whose per-item ``params`` are invalid, with ``on_error="refuse"``; lists all of them."""

    def __init__(self, problems: Sequence[LineProblem]) -> None:
        self.problems = list(problems)
        n = len(self.problems)
        body = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{n} item{'s' if n != 1 else ''} with invalid params; the job did not start "
                         f"(use --on-bad-line skip to run the others):\n{body}")


class OutputFileError(ValueError):
    """The output file cannot be resumed safely (corrupt row, other settings, locked)."""


class DeadlineExceeded(Exception):
    """Raised before a forward pass once the batch's item deadline or the job deadline passed."""

    def __init__(self, kind: str, limit_s: float, elapsed_s: float) -> None:
        self.kind, self.limit_s, self.elapsed_s = kind, limit_s, elapsed_s
        what = "item_timeout_s" if kind == "item" else "job_timeout_s"
        super().__init__(f"timed out: ran past {what}={limit_s:g} (stopped after {elapsed_s:.2f} s, "
                         f"at a forward-pass boundary)")


class ControllerFailure(Exception):
    """A controller's ``reset`` or ``decide`` raised (the cause is chained)."""


class ScorerFailure(Exception):
    """The lookahead (its scorers or rollouts) raised (the cause is chained)."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of CUDA, another accelerator, or the CPU allocator."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError):
        msg = str(exc).lower()
        return "out of memory" in msg or "can't allocate memory" in msg or "defaultcpuallocator" in msg
    return False


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------- guards
class _DeadlineModel:
    """The denoiser, checking the deadlines before every forward pass (steps and rollouts)."""

    def __init__(self, inner: Any, started: float, item_limit: Optional[float], job_deadline: Optional[float],
                 job_limit: Optional[float], job_started: float) -> None:
        self._inner, self._started, self._item_limit = inner, started, item_limit
        self._job_deadline, self._job_limit, self._job_started = job_deadline, job_limit, job_started

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if self._job_deadline is not None and now >= self._job_deadline:
            raise DeadlineExceeded("job", float(self._job_limit), now - self._job_started)
        if self._item_limit is not None and now - self._started >= self._item_limit:
            raise DeadlineExceeded("item", self._item_limit, now - self._started)
        return self._inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _passthrough(exc: BaseException) -> bool:
    return isinstance(exc, (DeadlineExceeded, ControllerFailure, ScorerFailure)) or is_oom(exc)


class _GuardedController:
    """Delegates to a controller; its exceptions become :class:`ControllerFailure`."""

    def __init__(self, inner: Controller, name: str) -> None:
        self._inner, self._name = inner, name

    def reset(self, state: DecodeState) -> None:
        try:
            self._inner.reset(state)
        except Exception as exc:  # noqa: BLE001 - any controller bug must not kill the job
            if _passthrough(exc):
                raise
            raise ControllerFailure(f"controller {self._name!r} raised in reset: {_reason(exc)}") from exc

    def decide(self, features: Any, state: DecodeState) -> Any:
        try:
            return self._inner.decide(features, state)
        except Exception as exc:  # noqa: BLE001
            if _passthrough(exc):
                raise
            raise ControllerFailure(f"controller {self._name!r} raised: {_reason(exc)}") from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _GuardedLookahead:
    """Delegates to a lookahead; its exceptions become :class:`ScorerFailure`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def refine(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._inner.refine(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            if _passthrough(exc):
                raise
            raise ScorerFailure(f"lookahead/scorer raised: {_reason(exc)}") from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# ---------------------------------------------------------------------------------- batch size
@dataclass
class BatchSizer:
    """Adaptive batch size: halve on OOM, grow back carefully (a binary search below the failure).

    * OOM at size n: ``ceiling = n`` (the smallest size known to fail); the size drops to
      ``n // 2``, or to the largest size that worked since (``good``), if that is larger.
    * After ``grow_after`` consecutive full-size successes the size grows: doubling while no
      ceiling is known, else to the midpoint between the size and the ceiling.
    * Once the size sits just below the ceiling, ``probe_after`` (initially ``4 × grow_after``)
      more successes forget the ceiling, so larger sizes are tried again (memory use varies with
      prompt length and fragmentation); each probe that ends in an OOM doubles ``probe_after``.
    """

    max_size: int
    grow_after: int = 4
    size: int = 0
    ceiling: Optional[int] = None
    good: int = 0
    streak: int = 0
    oom_events: int = 0
    smallest: int = 0
    probe_after: int = 0
    probing: bool = False

    def __post_init__(self) -> None:
        self.size = self.size or self.max_size
        self.smallest = self.size
        self.probe_after = self.probe_after or 4 * self.grow_after

    def on_oom(self, n: int) -> None:
        self.oom_events += 1
        if self.probing:
            self.probe_after *= 2
            self.probing = False
        if self.good >= n:  # what worked before does not work now
            self.good = 0
        self.ceiling = n if self.ceiling is None else min(self.ceiling, n)
        self.size = max(1, n // 2, self.good)
        self.smallest = min(self.smallest, self.size)
        self.streak = 0

    def on_success(self, n: int) -> None:
        if n < self.size:  # a short tail batch says nothing about the current size
            return
        self.good = max(self.good, n)
        self.streak += 1
        if self.ceiling is None:
            if self.streak >= self.grow_after and self.size < self.max_size:
                self.size, self.streak = min(self.max_size, self.size * 2), 0
            return
        target = min(self.max_size, (self.size + self.ceiling) // 2)
        if target > self.size:
            if self.streak >= self.grow_after:
                self.size, self.streak = target, 0
        elif self.streak >= self.probe_after and self.size < self.max_size:
            self.ceiling, self.streak, self.probing = None, 0, True


# ---------------------------------------------------------------------------------- schema
_T_STR, _T_INT, _T_NUM, _T_BOOL, _T_OBJ, _T_LIST = "string", "integer", "number", "boolean", "object", "array"
#: field -> (JSON type, nullable)
ROW_FIELDS: dict[str, tuple[str, bool]] = {
    "schema": (_T_STR, False),
    "id": (_T_STR, False),
    "status": (_T_STR, False),
    "prompt": (_T_STR, False),
    "params": (_T_OBJ, False),
    "meta": (_T_OBJ, True),
    "line": (_T_INT, True),
    "model": (_T_STR, False),
    "controller": (_T_STR, False),
    "settings": (_T_STR, False),
    "seed": (_T_INT, False),
    "text": (_T_STR, True),
    "prompt_ids": (_T_LIST, True),
    "generated_ids": (_T_LIST, True),
    "nfe": (_T_INT, True),
    "steps": (_T_INT, True),
    "lookahead_nfe": (_T_INT, True),
    "lookahead_fallbacks": (_T_INT, True),
    "fallback": (_T_BOOL, False),
    "fallback_reason": (_T_STR, True),
    "error": (_T_STR, True),
    "error_type": (_T_STR, True),
    "retries": (_T_INT, False),
    "batch_size": (_T_INT, True),
    "latency_s": (_T_NUM, True),
}
_OK_REQUIRED = ("text", "prompt_ids", "generated_ids", "nfe", "steps", "lookahead_nfe", "lookahead_fallbacks",
                "batch_size", "latency_s")
_ERROR_NULL = ("text", "generated_ids", "nfe", "steps", "lookahead_nfe", "lookahead_fallbacks")


class RowSchemaError(ValueError):
    """A result row that does not follow the schema; the message lists every problem."""


def _is_type(value: Any, kind: str) -> bool:
    if kind == _T_INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _T_NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, {_T_STR: str, _T_BOOL: bool, _T_OBJ: dict, _T_LIST: list}[kind])


def row_problems(row: Any) -> list[str]:
    """Every way ``row`` breaks the schema (empty list = valid)."""
    if not isinstance(row, dict):
        return [f"a row must be a JSON object, got {type(row).__name__}"]
    out: list[str] = []
    for key in row:
        if key not in ROW_FIELDS:
            out.append(f"unknown field {key!r}")
    for key, (kind, nullable) in ROW_FIELDS.items():
        if key not in row:
            out.append(f"missing field {key!r}")
            continue
        value = row[key]
        if value is None:
            if not nullable:
                out.append(f"{key!r} must not be null")
        elif not _is_type(value, kind):
            out.append(f"{key!r} must be {'a' if kind != _T_OBJ and kind != _T_INT else 'an'} {kind}"
                       f"{' or null' if nullable else ''}, got {type(value).__name__}")
    if out:
        return out
    if row["schema"] != SCHEMA:
        out.append(f"'schema' is {row['schema']!r}; allowed: {SCHEMA!r}")
    if not row["id"]:
        out.append("'id' must not be empty")
    for key in ("prompt_ids", "generated_ids"):
        if row[key] is not None and not all(_is_type(t, _T_INT) and t >= 0 for t in row[key]):
            out.append(f"{key!r} must be a list of non-negative integers")
    for key in ("seed", "retries"):
        if row[key] < 0:
            out.append(f"{key!r}={row[key]} must be >= 0")
    if row["fallback"] != (row["fallback_reason"] is not None):
        out.append("'fallback_reason' must be a string exactly when 'fallback' is true")
    if row["status"] == "ok":
        for key in _OK_REQUIRED:
            if row[key] is None:
                out.append(f"status 'ok' needs {key!r}")
        if row["error"] is not None or row["error_type"] is not None:
            out.append("status 'ok' must have null 'error' and 'error_type'")
        if row["nfe"] is not None and row["nfe"] < 1:
            out.append(f"'nfe'={row['nfe']} must be >= 1")
        if row["batch_size"] is not None and row["batch_size"] < 1:
            out.append(f"'batch_size'={row['batch_size']} must be >= 1")
    elif row["status"] == "error":
        if not row["error"]:
            out.append("status 'error' needs a non-empty 'error'")
        if row["error_type"] not in ERROR_TYPES:
            out.append(f"'error_type'={row['error_type']!r}; allowed: one of {', '.join(ERROR_TYPES)}")
        for key in _ERROR_NULL:
            if row[key] is not None:
                out.append(f"status 'error' must have null {key!r}")
    else:
        out.append(f"'status'={row['status']!r}; allowed: 'ok' or 'error'")
    return out


def validate_row(row: Any) -> None:
    """Raise :class:`RowSchemaError` listing every problem if ``row`` breaks the schema."""
    problems = row_problems(row)
    if problems:
        rid = row.get("id") if isinstance(row, dict) else None
        raise RowSchemaError(f"row {rid!r}: " + "; ".join(problems))


def read_results(path: str | os.PathLike) -> list[dict]:
    """Every complete, schema-valid row of a results file (raises on a corrupt line)."""
    rows, _ = _scan(os.fspath(path), repair=False)
    return rows


# ---------------------------------------------------------------------------------- output file
def _scan(path: str, repair: bool) -> tuple[list[dict], Optional[str]]:
    """Rows of ``path``; a torn last line (no final newline) is removed when ``repair``."""
    if not os.path.exists(path):
        return [], None
    with open(path, "rb") as fh:
        data = fh.read()
    note = None
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        n_line = data[:cut].count(b"\n") + 1
        note = (f"{path}: removed a torn last line (line {n_line}, {len(data) - cut} bytes) left by an "
                f"interrupted write; that item runs again")
        if repair:
            os.truncate(path, cut)
        data = data[:cut]
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise OutputFileError(f"{path}:{n}: not a valid JSON row ({exc}); this file was not written by "
                                  f"one adec generate job. Fix or remove that line, or use another --output") from None
        problems = row_problems(row)
        if problems:
            raise OutputFileError(f"{path}:{n}: row does not follow the {SCHEMA} schema: {'; '.join(problems)}")
        if row["id"] in seen:
            raise OutputFileError(f"{path}:{n}: duplicate id {row['id']!r} (first on line {seen[row['id']]})")
        seen[row["id"]] = n
        rows.append(row)
    return rows, note


class _ResultFile:
    """Append-only JSONL writer: one ``os.write`` per row, ``fsync`` per batch, an exclusive lock."""

    def __init__(self, path: str, fsync: bool = True) -> None:
        self.path, self.fsync = path, fsync
        self.fd: Optional[int] = None

    def open(self) -> None:
        existed = os.path.exists(self.path)
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise OutputFileError(f"{self.path} is being written by another job (locked); wait for it or "
                                  f"use another --output") from None
        if not existed:
            _fsync_dir(parent)

    def reopen(self) -> None:
        """After the file was replaced (``os.replace``): hold the new one."""
        self.close()
        self.open()

    def write(self, rows: Iterable[dict]) -> None:
        assert self.fd is not None
        for row in rows:
            data = (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
        if self.fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            if self.fsync:
                os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse
        pass
    finally:
        os.close(fd)


def _rewrite(path: str, rows: Sequence[dict]) -> None:
    """Atomically replace ``path`` by ``rows`` (temp file, fsync, rename)."""
    tmp = f"{path}.rewrite-{os.getpid()}"
    with open(tmp, "wb") as fh:
        for row in rows:
            fh.write((json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


# ---------------------------------------------------------------------------------- summary
def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile: the smallest value with at least q% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class JobSummary:
    """What one run of a job did.

    ``status`` is ``"completed"``, ``"interrupted"`` (Ctrl-C) or ``"job_timeout"``; ``pending``
    items have no row yet and run when the same job is started again.
    """

    output: str
    status: str = "completed"
    total: int = 0
    already_done: int = 0
    done: int = 0
    failed: int = 0
    retried: int = 0
    fallbacks: int = 0
    step_fallbacks: int = 0
    pending: int = 0
    oom_events: int = 0
    bisections: int = 0
    batch_size_start: int = 0
    batch_size_final: int = 0
    batch_size_min: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    skipped: list[LineProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list, repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def latency(self, q: float) -> Optional[float]:
        return percentile(self.latencies, q)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in (
            "output", "status", "total", "already_done", "done", "failed", "retried", "fallbacks",
            "step_fallbacks", "pending",
            "oom_events", "bisections", "batch_size_start", "batch_size_final", "batch_size_min", "tokens",
            "elapsed_s", "notes")}
        out["skipped"] = [str(p) for p in self.skipped]
        out["tokens_per_second"] = self.tokens_per_second
        out.update({f"latency_p{q}_s": self.latency(q) for q in (50, 95, 99)})
        return out

    def format(self) -> str:
        def ms(v: Optional[float]) -> str:
            return "-" if v is None else f"{1000 * v:.1f} ms"

        lines = [
            f"generate: {self.status} -> {self.output}",
            f"  items {self.total}: done {self.done}, failed {self.failed}, already in output {self.already_done}, "
            f"pending {self.pending}, skipped bad lines {len(self.skipped)}",
            f"  retried {self.retried}, fallbacks {self.fallbacks} (+{self.step_fallbacks} lookahead steps), "
            f"OOM back-offs {self.oom_events}, "
            f"bisections {self.bisections}, batch size {self.batch_size_start} -> {self.batch_size_final} "
            f"(min {self.batch_size_min})",
            f"  {self.tokens} tokens in {self.elapsed_s:.2f} s = {self.tokens_per_second:.1f} tokens/s; "
            f"latency per item P50 {ms(self.latency(50))}, P95 {ms(self.latency(95))}, P99 {ms(self.latency(99))}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        if self.pending:
            lines.append(f"  {self.pending} items have no row yet: run the same command again to resume "
                         f"(rows already in {self.output} are kept, only the pending items run)")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------- job
@dataclass
class _Group:
    config: DecodeConfig
    controller: Controller
    overrides: dict[str, Any]


@dataclass
class _Work:
    item: PromptItem
    id: str
    group: _Group
    seed: int
    ids: list[int] = field(default_factory=list)
    mode: str = "normal"  # normal | no_lookahead | fallback
    mode_failures: int = 0
    retries: int = 0
    fallback_reason: Optional[str] = None


def _as_factory(obj: Any) -> Callable[..., Controller]:
    if isinstance(obj, Controller):
        return lambda **over: type(obj).build(**{**obj.get_params(), **over}) if over else obj
    if callable(obj):
        return obj
    raise ParameterError(f"controller_factory={obj!r} is neither a Controller nor a callable returning one")


def _name(ctrl: Controller) -> str:
    return type(ctrl).display_name()


def _dry_reset(ctrl: Controller, config: DecodeConfig, mask_id: int) -> None:
    """Run the controller's ``reset`` once so that its own config checks fire before any work."""
    ctrl.reset(DecodeState(config=config, seeds=torch.zeros(1, dtype=torch.long), mask_token_id=mask_id))


def _describe_lookahead(lookahead: Any, spec: Optional[str]) -> Optional[dict]:
    """What identifies a lookahead in the settings hash (never an object address)."""
    if lookahead is None:
        return None
    params = {}
    if hasattr(lookahead, "get_params"):
        for key, value in lookahead.get_params().items():
            if value is None or isinstance(value, (str, int, float, bool)):
                params[key] = value
            elif hasattr(value, "to_dict"):
                params[key] = _jsonable(value.to_dict())
    return {"type": type(lookahead).__qualname__, "spec": spec, "params": params}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _hash(obj: Any, n: int = 16) -> str:
    return hashlib.blake2b(json.dumps(obj, sort_keys=True, default=str).encode(), digest_size=n // 2).hexdigest()


def context_length(loaded_model: Any) -> Optional[int]:
    """The most positions the denoiser accepts (prompt + G), or ``None`` when it does not say."""
    den = loaded_model.denoiser
    for holder in (den, getattr(den, "config", None)):
        if holder is None:
            continue
        for attr in ("max_len", "max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(holder, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    value = (loaded_model.info or {}).get("max_len")
    return value if isinstance(value, int) else None


def run_generation_job(
    loaded_model: Any,
    items: Sequence[PromptItem],
    controller_factory: Controller | Callable[..., Controller],
    config: DecodeConfig,
    output_path: str | os.PathLike,
    *,
    batch_size: int = 8,
    lookahead: Any = None,
    lookahead_spec: Optional[str] = None,
    seed: Optional[int] = None,
    item_timeout_s: Optional[float] = None,
    job_timeout_s: Optional[float] = None,
    max_retries: int = 1,
    fallback_controller: str | Controller | None = "sequential",
    on_error: str = "refuse",
    skipped: Sequence[LineProblem] = (),
    retry_errors: bool = False,
    overwrite: bool = False,
    grow_after: int = 4,
    progress: bool = True,
    fsync: bool = True,
    log: Optional[Callable[[str], None]] = None,
) -> JobSummary:
    """Decode ``items`` into ``output_path`` (JSONL, one row per item), resumably.

    Args:
        loaded_model: a :class:`framework.denoiser.LoadedModel` (``denoiser``, ``tokenizer``, ``name``).
        items: the prompts (:func:`framework.prompts.read_prompts`); ``params`` override decoding
            options and controller parameters per item (items with equal settings share batches).
        controller_factory: a built controller, or ``factory(**overrides) -> Controller``.
        config: the loop's options (gen_length G, block_length, temperature, seed ...).
        output_path: the results file; rows already in it are kept and not decoded again.
        batch_size: the largest batch B (the adaptive size never exceeds it).
        lookahead: a lookahead object for :func:`framework.decoding.decode`, or ``None``.
        lookahead_spec: how the lookahead was configured (e.g. the ``--scorer`` spec), for the settings hash.
        seed: overrides ``config.seed``; item ``i`` uses ``stable_seed(seed, id_i)``.
        item_timeout_s / job_timeout_s: wall-clock limits (``None`` = none).
        max_retries: re-runs of an item that failed on its own, per mode.
        fallback_controller: the plain decoder used after a controller failure (``None`` = none).
        on_error: ``"refuse"``: invalid per-item params stop the job before any work; ``"skip"``:
            those items are reported in the summary and not run.
        skipped: bad input lines already skipped by the reader (reported in the summary).
        retry_errors: drop the error rows already in the output and decode those items again.
        overwrite: start the output from scratch.
        grow_after: clean batches before the batch size grows again after an OOM.
        progress: show a tqdm bar (items/s, tokens/s, batch size).
        fsync: ``fsync`` after every batch (off only in benchmarks of the writer itself).
        log: where messages go (default: stderr, above the progress bar).

    Raises (all before any work): :class:`ParameterError` for a bad option or parameter value,
    :class:`JobInputError` for invalid per-item params with ``on_error="refuse"``,
    :class:`OutputFileError` for an output that cannot be resumed safely.
    """
    from tqdm.auto import tqdm

    say = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    t_job = time.monotonic()
    path = os.fspath(output_path)
    check_job_options(batch_size, item_timeout_s, job_timeout_s, max_retries, on_error, grow_after)
    summary = JobSummary(output=path, skipped=list(skipped), batch_size_start=batch_size)

    # ---- validation: nothing below touches the model or the output file until it all passes
    denoiser, tokenizer = loaded_model.denoiser, loaded_model.tokenizer
    base_cfg = config.get_params()
    if seed is not None:
        base_cfg["seed"] = seed
    config = DecodeConfig.build(**base_cfg)
    factory = _as_factory(controller_factory)
    base_ctrl = factory()
    base_ctrl.validate()
    _dry_reset(base_ctrl, config, int(denoiser.mask_token_id))
    if lookahead is not None and hasattr(lookahead, "validate"):
        lookahead.validate()
    fallback = None
    if fallback_controller is not None:
        fallback = (build_controller(fallback_controller) if isinstance(fallback_controller, str)
                    else fallback_controller)
        fallback.validate()
        _dry_reset(fallback, config, int(denoiser.mask_token_id))
    settings = {
        "schema": SCHEMA, "model": loaded_model.name, "controller": _jsonable(base_ctrl.to_dict()),
        "config": _jsonable(config.get_params()), "lookahead": _describe_lookahead(lookahead, lookahead_spec),
        "fallback": _jsonable(fallback.to_dict()) if fallback is not None else None,
    }
    settings_hash = _hash(settings)
    works, problems = _plan(items, factory, base_ctrl, config, int(denoiser.mask_token_id), settings_hash)
    if problems and on_error == "refuse":
        raise JobInputError(problems)
    summary.skipped += problems

    out, existing = _open_output(path, settings_hash, overwrite, retry_errors, fsync, summary, say)
    done_ids = {r["id"] for r in existing}
    summary.total = len(works)
    todo = [w for w in works if w.id not in done_ids]
    summary.already_done = len(works) - len(todo)

    sizer = BatchSizer(batch_size, grow_after=grow_after)
    job_deadline = t_job + job_timeout_s if job_timeout_s is not None else None
    bar = tqdm(total=len(todo), unit="item", disable=not progress, file=sys.stderr, dynamic_ncols=True,
               desc="generate")
    written: set[str] = set()
    retried: set[str] = set()
    t_run = time.perf_counter()

    def emit(rows: list[dict]) -> None:
        try:
            out.write(rows)
        except OSError as exc:
            raise OutputFileError(f"cannot write {path} ({exc}); the rows written so far are kept: fix the "
                                  f"cause (disk space?) and run the same command again to resume") from None
        for row in rows:
            written.add(row["id"])
            if row["status"] == "ok":
                summary.done += 1
                summary.tokens += len(row["generated_ids"])
                summary.latencies.append(row["latency_s"])
                summary.fallbacks += int(row["fallback"])
                summary.step_fallbacks += row["lookahead_fallbacks"]
            else:
                summary.failed += 1
        bar.update(len(rows))
        elapsed = time.perf_counter() - t_run
        bar.set_postfix(tok_s=f"{summary.tokens / max(elapsed, 1e-9):.0f}", bs=sizer.size, failed=summary.failed,
                        refresh=False)

    try:
        queue: deque[_Work] = deque()
        pre_rows = []
        for w in todo:
            row = _precheck(w, tokenizer, loaded_model, settings_hash)
            if row is not None:
                pre_rows.append(row)
            else:
                queue.append(w)
        if pre_rows:
            emit(pre_rows)
        # longest prompts first inside each settings group: an OOM shows up early, padding is small
        order: dict[int, int] = {}
        for w in queue:
            order.setdefault(id(w.group), len(order))
        queue = deque(sorted(queue, key=lambda w: (order[id(w.group)], -len(w.ids))))
        explicit: deque[list[_Work]] = deque()
        while queue or explicit:
            if job_deadline is not None and time.monotonic() >= job_deadline:
                summary.status = "job_timeout"
                break
            batch = explicit.popleft() if explicit else _take(queue, sizer.size)
            if len(batch) > sizer.size:  # made before the last OOM: split to the current size first
                _push_chunks(explicit, batch, sizer.size)
                continue
            try:
                rows = _decode_batch(batch, loaded_model, lookahead, fallback, settings_hash, item_timeout_s,
                                     job_deadline, job_timeout_s, t_job)
            except DeadlineExceeded as exc:
                if exc.kind == "job":
                    summary.status = "job_timeout"
                    break
                _on_failure(batch, "timeout", str(exc), explicit, sizer, summary, retried, max_retries, fallback,
                            emit, settings_hash, loaded_model)
                continue
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - classified, never lost
                if is_oom(exc):
                    _free_memory()
                    if len(batch) > 1:
                        sizer.on_oom(len(batch))
                        say(f"out of memory at batch size {len(batch)}; retrying these items at {sizer.size}")
                        _push_chunks(explicit, batch, sizer.size)
                        continue
                    kind, reason = "oom", f"out of memory at batch size 1 ({_reason(exc)})"
                elif isinstance(exc, ControllerFailure):
                    kind, reason = "controller", str(exc)
                elif isinstance(exc, ScorerFailure):
                    kind, reason = "scorer", str(exc)
                else:
                    kind, reason = "model", _reason(exc)
                _on_failure(batch, kind, reason, explicit, sizer, summary, retried, max_retries, fallback,
                            emit, settings_hash, loaded_model)
                continue
            emit(rows)
            sizer.on_success(len(batch))
    except KeyboardInterrupt:
        summary.status = "interrupted"
    finally:
        bar.close()
        out.close()
        summary.elapsed_s = time.perf_counter() - t_run
        summary.retried = len(retried)
        summary.pending = len([w for w in todo if w.id not in written])
        summary.oom_events = sizer.oom_events
        summary.batch_size_final = sizer.size
        summary.batch_size_min = sizer.smallest
    return summary


def _open_output(path: str, settings_hash: str, overwrite: bool, retry_errors: bool, fsync: bool,
                 summary: JobSummary, say: Callable[[str], None]) -> tuple[_ResultFile, list[dict]]:
    """Lock the output first (no other job appends while this one reads and repairs it), read its
    rows, refuse rows written with other settings, cut a torn last line, drop error rows if asked."""
    out = _ResultFile(path, fsync=fsync)
    out.open()
    try:
        if overwrite:
            _rewrite(path, [])
            out.reopen()
        existing, note = _scan(path, repair=False)
        other = [r for r in existing if r["settings"] != settings_hash]
        if other:
            raise OutputFileError(
                f"{path} holds {len(other)} rows written with other settings (settings {other[0]['settings']} "
                f"!= {settings_hash}: model, controller, decoding options, scorer or fallback differ); use "
                f"another --output, or --overwrite to start it again")
        if note:
            _scan(path, repair=True)
            summary.notes.append(note)
            say(note)
        if retry_errors and any(r["status"] == "error" for r in existing):
            existing = [r for r in existing if r["status"] != "error"]
            _rewrite(path, existing)
            out.reopen()
            summary.notes.append("removed the error rows of the previous run; those items run again")
    except BaseException:
        out.close()
        raise
    return out, existing


def check_job_options(batch_size: int, item_timeout_s: Optional[float], job_timeout_s: Optional[float],
                      max_retries: int, on_error: str = "refuse", grow_after: int = 4,
                      names: Optional[dict[str, str]] = None) -> None:
    """Raise :class:`ParameterError` naming the option, the value and the allowed range.

    ``names`` renames options in the messages (a command passes its flags: ``--batch-size``).
    """
    names = names or {}

    def bad(name: str, value: Any, allowed: str) -> ParameterError:
        return ParameterError(f"{names.get(name, name)}={value!r} is out of range; allowed: {allowed}")

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise bad("batch_size", batch_size, "integer in [1, inf)")
    for name, value in (("item_timeout_s", item_timeout_s), ("job_timeout_s", job_timeout_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0 or not math.isfinite(value)):
            raise bad(name, value, "number in (0, inf) or null")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise bad("max_retries", max_retries, "integer in [0, inf)")
    if isinstance(grow_after, bool) or not isinstance(grow_after, int) or grow_after < 1:
        raise bad("grow_after", grow_after, "integer in [1, inf)")
    if on_error not in ON_ERROR:
        raise ParameterError(f"on_error={on_error!r} is not allowed; allowed: one of 'skip', 'refuse'")


def check_items(items: Sequence[PromptItem], controller_factory: Controller | Callable[..., Controller],
                config: DecodeConfig) -> list[LineProblem]:
    """The problems of the items' per-item ``params`` (and duplicate ids), without a model.

    The job runs the same checks itself; a command calls this first so that bad input is refused
    before a model is loaded (or trained).
    """
    factory = _as_factory(controller_factory)
    base_ctrl = factory()
    return _plan(items, factory, base_ctrl, config, 0, "")[1]


def _plan(items: Sequence[PromptItem], factory: Callable[..., Controller], base_ctrl: Controller,
          config: DecodeConfig, mask_id: int, settings_hash: str) -> tuple[list[_Work], list[LineProblem]]:
    """Validate per-item params, group items by settings, give every item its id and seed."""
    cfg_keys = set(DecodeConfig._param_names())
    ctrl_keys = set(type(base_ctrl)._param_names())
    base_group = _Group(config, base_ctrl, {})
    groups: dict[str, _Group] = {_hash([{k: v for k, v in config.get_params().items() if k != "seed"}, {}]): base_group}
    works: list[_Work] = []
    problems: list[LineProblem] = []
    occurrences: dict[str, int] = {}
    ids: dict[str, Optional[int]] = {}
    for n, item in enumerate(items):
        def label(reason: str, line: Optional[int] = item.line, n: int = n) -> LineProblem:
            return LineProblem(line, reason) if line is not None else LineProblem(None, f"item {n}: {reason}")

        params = dict(item.params or {})
        unknown = [k for k in params if k not in cfg_keys and k not in ctrl_keys]
        if unknown:
            problems.append(label(
                f"params: unknown key {unknown[0]!r}; decoding options: {', '.join(sorted(cfg_keys))}; "
                f"{_name(base_ctrl)} parameters: {', '.join(sorted(ctrl_keys)) or '(none)'}"))
            continue
        group = base_group
        seed = config.seed
        if params:
            cfg_over = {k: v for k, v in params.items() if k in cfg_keys}
            ctrl_over = {k: v for k, v in params.items() if k in ctrl_keys and k not in cfg_keys}
            try:
                item_cfg = DecodeConfig.build(**{**config.get_params(), **cfg_over})
                seed = item_cfg.seed
                key = _hash([{k: v for k, v in item_cfg.get_params().items() if k != "seed"}, ctrl_over])
                if key not in groups:
                    ctrl = factory(**ctrl_over) if ctrl_over else base_ctrl
                    ctrl.validate()
                    _dry_reset(ctrl, item_cfg, mask_id)
                    groups[key] = _Group(item_cfg, ctrl, ctrl_over)
                group = groups[key]
            except ParameterError as exc:
                problems.append(label(f"params: {exc}"))
                continue
        if item.id is not None:
            item_id = item.id
        else:
            basis = [item.prompt, _jsonable(params), settings_hash]
            k = _hash(basis)
            occurrences[k] = occurrences.get(k, 0) + 1
            item_id = "h" + _hash(basis + [occurrences[k]])
        if item_id in ids:
            first = ids[item_id]
            problems.append(label(f"duplicate id {item_id!r}" + (f" (first on line {first})" if first else "")))
            continue
        ids[item_id] = item.line
        works.append(_Work(item=item, id=item_id, group=group, seed=stable_seed(seed, item_id)))
    return works, problems


def _push_chunks(explicit: deque, batch: list[_Work], size: int) -> None:
    """Put ``batch`` back at the front of the work, in order, as chunks of at most ``size``."""
    for chunk in reversed([batch[i:i + size] for i in range(0, len(batch), size)]):
        explicit.appendleft(chunk)


def _take(queue: deque, size: int) -> list[_Work]:
    first = queue.popleft()
    batch = [first]
    while queue and len(batch) < size and queue[0].group is first.group:
        batch.append(queue.popleft())
    return batch


def _base_row(w: _Work, loaded_model: Any, settings_hash: str, controller: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "id": w.id, "status": "ok", "prompt": w.item.prompt,
        "params": _jsonable(w.item.params or {}), "meta": _jsonable(w.item.meta) if w.item.meta is not None else None,
        "line": w.item.line, "model": str(loaded_model.name), "controller": controller, "settings": settings_hash,
        "seed": w.seed, "text": None, "prompt_ids": None, "generated_ids": None, "nfe": None, "steps": None,
        "lookahead_nfe": None, "lookahead_fallbacks": None, "fallback": w.fallback_reason is not None,
        "fallback_reason": w.fallback_reason,
        "error": None, "error_type": None, "retries": w.retries, "batch_size": None, "latency_s": None,
    }


def _error_row(w: _Work, loaded_model: Any, settings_hash: str, kind: str, reason: str,
               fallback: Optional[Controller] = None) -> dict[str, Any]:
    ctrl = fallback if (w.mode == "fallback" and fallback is not None) else w.group.controller
    row = _base_row(w, loaded_model, settings_hash, _name(ctrl))
    row.update(status="error", error=reason or kind, error_type=kind, prompt_ids=list(w.ids) if w.ids else None)
    return row


def _precheck(w: _Work, tokenizer: Any, loaded_model: Any, settings_hash: str) -> Optional[dict]:
    """An error row for an item that cannot run (deterministic, so not retried), else ``None``."""
    if not w.item.prompt or not w.item.prompt.strip():
        return _error_row(w, loaded_model, settings_hash, "empty_prompt", "prompt is empty")
    try:
        w.ids = [int(t) for t in tokenizer.encode(w.item.prompt)]
    except Exception as exc:  # noqa: BLE001
        return _error_row(w, loaded_model, settings_hash, "encode",
                          f"the tokenizer cannot encode the prompt: {_reason(exc)}")
    if not w.ids:
        return _error_row(w, loaded_model, settings_hash, "empty_prompt", "prompt encodes to 0 tokens")
    ctx = context_length(loaded_model)
    need = len(w.ids) + w.group.config.gen_length
    if ctx is not None and need > ctx:
        return _error_row(w, loaded_model, settings_hash, "too_long",
                          f"prompt of {len(w.ids)} tokens + gen_length {w.group.config.gen_length} = {need} "
                          f"positions exceeds the model's context of {ctx} positions")
    return None


def _decode_batch(batch: list[_Work], loaded_model: Any, lookahead: Any, fallback: Optional[Controller],
                  settings_hash: str, item_timeout_s: Optional[float], job_deadline: Optional[float],
                  job_timeout_s: Optional[float], t_job: float) -> list[dict]:
    """Decode one batch (all of one group and mode) into rows; raises on any failure."""
    mode = batch[0].mode
    group = batch[0].group
    ctrl = fallback if mode == "fallback" else group.controller
    assert ctrl is not None
    la = _GuardedLookahead(lookahead) if (lookahead is not None and mode == "normal") else None
    started = time.monotonic()
    model = _DeadlineModel(loaded_model.denoiser, started, item_timeout_s, job_deadline, job_timeout_s, t_job)
    t0 = time.perf_counter()
    tok = loaded_model.tokenizer
    extras = {"tokenizer": tok, "prompt_text": [w.item.prompt for w in batch],
              "meta": [dict(w.item.meta or {}) for w in batch]}
    res = decode(model, [w.ids for w in batch], _GuardedController(ctrl, _name(ctrl)), group.config,
                 seeds=[w.seed for w in batch], lookahead=la, extras=extras)
    latency = time.perf_counter() - t0
    step_fallbacks = res.fallbacks if res.fallbacks is not None else torch.zeros(len(batch), dtype=torch.long)
    rows = []
    for b, w in enumerate(batch):
        gen = [int(t) for t in res.generated[b].tolist()]
        row = _base_row(w, loaded_model, settings_hash, _name(ctrl))
        row.update(text=tok.decode(gen, stop_at_eos=True), prompt_ids=list(w.ids), generated_ids=gen,
                   nfe=int(res.nfe[b]), steps=int(res.steps[b]), lookahead_nfe=int(res.lookahead_nfe[b]),
                   lookahead_fallbacks=int(step_fallbacks[b]),
                   batch_size=len(batch), latency_s=round(latency, 6))
        rows.append(row)
    return rows


def _on_failure(batch: list[_Work], kind: str, reason: str, explicit: deque, sizer: BatchSizer,
                summary: JobSummary, retried: set, max_retries: int, fallback: Optional[Controller],
                emit: Callable[[list[dict]], None], settings_hash: str, loaded_model: Any) -> None:
    """Bisect a failed batch; retry, fall back or write an error row for a failed single item."""
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
        retried.add(w.id)
        explicit.appendleft([w])
        return
    if kind == "controller" and w.mode != "fallback" and fallback is not None:
        w.mode, w.mode_failures = "fallback", 0
        w.fallback_reason = (f"{reason} (failed {max_retries + 1} times); decoded with "
                             f"{_name(fallback)!r} without lookahead")
        explicit.appendleft([w])
        return
    if kind == "scorer" and w.mode == "normal":
        w.mode, w.mode_failures = "no_lookahead", 0
        w.fallback_reason = f"{reason} (failed {max_retries + 1} times); decoded without lookahead"
        explicit.appendleft([w])
        return
    emit([_error_row(w, loaded_model, settings_hash, kind, reason, fallback)])
