"""The results file: the row schema, validation, and the durable append-only JSONL writer.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Optional, Sequence

from adaptive_decoding.framework.jobs.errors import OutputFileError

SCHEMA = "adec-generate/2"
#: schemas a results file may hold: /1 rows (before ``remasks``) are read and resumed as they are
SCHEMAS = ("adec-generate/1", SCHEMA)
#: fields that rows of the earlier schema do not have
NEW_IN_2 = ("remasks",)
#: the identity the settings hash is taken under: fixed, so that a results file written before the
#: rows gained fields still resumes (its rows keep their schema; new rows are written as SCHEMA)
SETTINGS_ID = "adec-generate/1"
ERROR_TYPES = ("empty_prompt", "too_long", "encode", "controller", "scorer", "timeout", "oom", "model",
               "output")
#: Row fields that must be identical whatever the batch size, back-off, bisection or resume.
RESULT_FIELDS = ("id", "status", "prompt", "params", "seed", "controller", "text", "prompt_ids",
                 "generated_ids", "nfe", "steps", "lookahead_nfe", "lookahead_fallbacks", "remasks",
                 "fallback", "error_type")


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
    "remasks": (_T_INT, True),
    "fallback": (_T_BOOL, False),
    "fallback_reason": (_T_STR, True),
    "error": (_T_STR, True),
    "error_type": (_T_STR, True),
    "retries": (_T_INT, False),
    "batch_size": (_T_INT, True),
    "latency_s": (_T_NUM, True),
}
_OK_REQUIRED = ("text", "prompt_ids", "generated_ids", "nfe", "steps", "lookahead_nfe", "lookahead_fallbacks",
                "remasks", "batch_size", "latency_s")
_ERROR_NULL = ("text", "generated_ids", "nfe", "steps", "lookahead_nfe", "lookahead_fallbacks", "remasks")


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
    old = row.get("schema") == SCHEMAS[0]
    fields = {k: v for k, v in ROW_FIELDS.items() if not (old and k in NEW_IN_2)}
    for key in row:
        if key not in fields:
            out.append(f"unknown field {key!r}")
    for key, (kind, nullable) in fields.items():
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
    if row["schema"] not in SCHEMAS:
        out.append(f"'schema' is {row['schema']!r}; allowed: {' or '.join(map(repr, SCHEMAS))}")
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
            if key in fields and row[key] is None:
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
            if key in fields and row[key] is not None:
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
    rows, _ = scan_results(os.fspath(path), repair=False)
    return rows


# ---------------------------------------------------------------------------------- output file
def scan_results(path: str, repair: bool) -> tuple[list[dict], Optional[str]]:
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
                                  f"one adec generate job. Fix or remove that line, or use another "
                                  f"--output") from None
        problems = row_problems(row)
        if problems:
            raise OutputFileError(f"{path}:{n}: row does not follow the {SCHEMA} schema: "
                                  f"{'; '.join(problems)}")
        if row["id"] in seen:
            raise OutputFileError(f"{path}:{n}: duplicate id {row['id']!r} (first on line {seen[row['id']]})")
        seen[row["id"]] = n
        rows.append(row)
    return rows, note


class ResultFile:
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


def rewrite_results(path: str, rows: Sequence[dict]) -> None:
    """Atomically replace ``path`` by ``rows`` (temp file, fsync, rename)."""
    tmp = f"{path}.rewrite-{os.getpid()}"
    with open(tmp, "wb") as fh:
        for row in rows:
            fh.write((json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))
