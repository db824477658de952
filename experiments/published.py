"""Published results beside this run's: the experiment key ``published`` and the report's tables.

An experiment file may carry, at the top level, a list of comparison tables, each a paper's
numbers for some of the file's strategies on some of its tasks::

    published:
      - title: "9×9 Sudoku, one cell per step: Kim et al. 2025 (Table 2) beside this run"
        source: "Kim et al. 2025, arXiv 2502.06768, Table 2"       # optional
        note: "6M-parameter MDM trained on ...; ours: ..."          # optional: what differs
        columns: {all: sudoku9, hard: "sudoku9(grade=hard)"}        # column title -> a task of this file
        rows:
          - {label: random order, strategy: "llada_random (1 cell/step)", published: {all: 6.88, hard: 3.62}}
          - {label: top margin, strategy: margin_1, published: {all: 89.49}}   # a column may be left out

A column names a task as the report's rows do: the task's name with its parameters sorted,
``sudoku9(grade=hard)`` (:attr:`adaptive_decoding.experiments.spec.TaskSpec.key`), or just the name when the file
lists that task once. ``strategy`` is a strategy label of the file (a sweep point's label,
``fast_dllm (threshold=0.9)``, included); ``label`` (default: the strategy) names the row;
``published`` maps column titles to the paper's figures, in percent. Validation reports every
unknown key, unknown task or strategy, a strategy that does not run on a column's task and every
non-numeric figure at its YAML path (``published[0].rows[2].published.hard``).

The runner stores the file as run (``experiment.yaml`` in the run folder) and the report reads the
block from there: per table, the title, source and note, then ``label | strategy | <column>: ours |
<column>: paper | ...``, ours being the run's quality in percent (mean over seeds) with NFE and
tokens per forward, ``—`` for a strategy not run (yet) or a figure not given.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Optional, Sequence

from adaptive_decoding.experiments.spec import TaskSpec, did_you_mean
from adaptive_decoding.experiments.tables import figure, markdown_table

BLOCK_KEYS = ("title", "source", "note", "columns", "rows")
ROW_KEYS = ("label", "strategy", "published")
MISSING = "—"


class _Quiet:
    """A checker that drops problems (the report reads a file that was validated when it ran)."""

    def add(self, path: str, msg: str) -> None:
        pass

    def keys(self, obj: dict, allowed: Sequence[str], path: str) -> None:
        pass


def task_pairs(raw_tasks: Any) -> list[tuple[str, str]]:
    """``(name, key)`` of each task of a raw (YAML) ``tasks`` list; entries that are no task are left out."""
    out = []
    for t in raw_tasks if isinstance(raw_tasks, list) else []:
        if isinstance(t, str):
            t = {"name": t}
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            params = t.get("params") if isinstance(t.get("params"), dict) else {}
            out.append((t["name"], TaskSpec(name=t["name"], params=dict(params)).key))
    return out


def resolve_task(value: Any, tasks: Sequence[tuple[str, str]]) -> tuple[Optional[str], str]:
    """The task key a column names (its key, or a name the file lists once) and, if none, why not."""
    keys = [k for _, k in tasks]
    if not isinstance(value, str) or not value:
        return None, f"{value!r} is not allowed; allowed: a task of this file ({', '.join(keys)})"
    if value in keys:
        return value, ""
    named = [k for n, k in tasks if n == value]
    if len(named) == 1:
        return named[0], ""
    if named:
        return None, (f"task name {value!r} is listed {len(named)} times ({', '.join(named)}); name one "
                      f"with its parameters, as the report's rows do")
    return None, (f"unknown task {value!r}; allowed: a task of this file by its name, or its name with "
                  f"parameters as the report labels it." + did_you_mean(value, keys))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_published(c: Any, raw: Any, tasks: Sequence[tuple[str, str]],
                    strategies: Optional[dict[str, Optional[list]]] = None) -> list[dict]:
    """Validate a ``published`` list (problems go to ``c.add(path, msg)``) and return it normalised:
    ``[{"title", "source", "note", "columns": {title: task key}, "rows": [{"label", "strategy",
    "published": {column: number}}]}]``. ``strategies`` maps each strategy label to its ``tasks``
    restriction (``None``: every task); without it strategies are not checked."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        c.add("published", f"{type(raw).__name__} is not allowed; allowed: a list of tables, each "
                           "{title:, source:, note:, columns: {title: task}, rows: [...]}")
        return []
    names = {k: n for n, k in tasks}
    blocks = []
    for i, b in enumerate(raw):
        where = f"published[{i}]"
        if not isinstance(b, dict):
            c.add(where, f"{b!r} is not allowed; allowed: a mapping with title, columns and rows")
            continue
        blocks.append(_check_block(c, b, where, i, tasks, names, strategies))
    return blocks


def _check_block(c: Any, b: dict, where: str, i: int, tasks: Sequence[tuple[str, str]], names: dict[str, str],
                 strategies: Optional[dict[str, Optional[list]]]) -> dict:
    """One published table ``b`` (at ``where``), checked and normalised (see :func:`check_published`)."""
    c.keys(b, BLOCK_KEYS, where)
    title = b.get("title")
    if not isinstance(title, str) or not title.strip():
        c.add(f"{where}.title", "required: a non-empty string (the table's heading)")
        title = f"Published results {i + 1}"
    for key in ("source", "note"):
        if b.get(key) is not None and not isinstance(b[key], str):
            c.add(f"{where}.{key}", f"{b[key]!r} is not allowed; allowed: a string")
    columns = _check_columns(c, b.get("columns"), where, tasks)
    rows = []
    raw_rows = b.get("rows")
    if not isinstance(raw_rows, list) or not raw_rows:
        c.add(f"{where}.rows",
              "required: a non-empty list of {label:, strategy:, published: {column: number}}")
        raw_rows = []
    for j, r in enumerate(raw_rows):
        rw = f"{where}.rows[{j}]"
        if not isinstance(r, dict):
            c.add(rw, f"{r!r} is not allowed; allowed: a mapping {{label:, strategy:, published:}}")
            continue
        c.keys(r, ROW_KEYS, rw)
        strategy = _check_row_strategy(c, r.get("strategy"), rw, columns, names, strategies)
        label = r.get("label", strategy)
        if not isinstance(label, str) or not label:
            c.add(f"{rw}.label", f"{label!r} is not allowed; allowed: a non-empty string")
            label = str(strategy or f"row {j + 1}")
        rows.append({"label": label, "strategy": strategy,
                     "published": _check_figures(c, r.get("published") or {}, rw, columns)})
    labels = [r["label"] for r in rows]
    for lab in sorted({x for x in labels if labels.count(x) > 1}):
        c.add(f"{where}.rows", f"label {lab!r} names more than one row")
    return {"title": title, "source": b.get("source") if isinstance(b.get("source"), str) else None,
            "note": b.get("note") if isinstance(b.get("note"), str) else None,
            "columns": columns, "rows": rows}


def _check_columns(c: Any, raw_cols: Any, where: str,
                   tasks: Sequence[tuple[str, str]]) -> dict[str, Optional[str]]:
    """A table's ``columns`` (title -> task of this file): each title's task key (``None`` if unknown)."""
    columns: dict[str, Optional[str]] = {}
    if not isinstance(raw_cols, dict) or not raw_cols:
        c.add(f"{where}.columns", "required: a mapping of column titles to tasks of this file, "
                                  "e.g. {all: sudoku9, hard: 'sudoku9(grade=hard)'}")
        return columns
    for col, value in raw_cols.items():
        key, why = resolve_task(value, tasks)
        if key is None:
            c.add(f"{where}.columns.{col}", why)
        columns[str(col)] = key
    return columns


def _check_row_strategy(c: Any, strategy: Any, rw: str, columns: dict[str, Optional[str]],
                        names: dict[str, str],
                        strategies: Optional[dict[str, Optional[list]]]) -> Optional[str]:
    """A row's ``strategy``: a strategy label of this file that runs on every column's task (``None``
    when missing)."""
    if not isinstance(strategy, str) or not strategy:
        c.add(f"{rw}.strategy", "required: a strategy label of this file")
        return None
    if strategies is not None and strategy not in strategies:
        c.add(f"{rw}.strategy", f"unknown strategy {strategy!r}; allowed: a strategy label of this file."
              + did_you_mean(strategy, list(strategies)))
    elif strategies is not None and strategies[strategy] is not None:
        for col, key in columns.items():
            if key is not None and names.get(key, key) not in strategies[strategy]:
                c.add(f"{rw}.strategy", f"{strategy!r} does not run on task {key} (column {col!r}): its "
                                        f"tasks are {strategies[strategy]}")
    return strategy


def _check_figures(c: Any, pub: Any, rw: str, columns: dict[str, Optional[str]]) -> dict[str,
                                                                                         Optional[float]]:
    """A row's ``published`` figures: a number per known column."""
    figures: dict[str, Optional[float]] = {}
    if not isinstance(pub, dict):
        c.add(f"{rw}.published", f"{pub!r} is not allowed; allowed: a mapping {{column: number}}")
        pub = {}
    for col, v in pub.items():
        if str(col) not in columns and columns:
            close = difflib.get_close_matches(str(col), list(columns), n=1)
            c.add(f"{rw}.published.{col}", f"unknown column {col!r}"
                  + (f"; did you mean {close[0]!r}?" if close else "")
                  + f"; allowed: the table's columns ({', '.join(columns)})")
        elif not _number(v):
            c.add(f"{rw}.published.{col}", f"{v!r} is not allowed; allowed: a number (the paper's "
                                           "figure, in percent)")
        else:
            figures[str(col)] = v
    return figures


# ====================================================================== the report's tables
def _ours(row: Optional[dict]) -> dict:
    """The run's figure for one cell of the table: quality (in percent when it is a fraction), NFE, tpf."""
    if row is None or row.get("quality") is None:
        return {"ours": None, "unit": None, "nfe": None, "tpf": None, "n": None, "seeds": None}
    q = float(row["quality"])
    percent = row.get("higher_is_better", True) and -1e-9 <= q <= 1 + 1e-9
    return {"ours": 100.0 * q if percent else q, "unit": "percent" if percent else row.get("quality_metric"),
            "nfe": row.get("nfe"), "tpf": row.get("tpf"), "n": row.get("n"), "seeds": row.get("seeds")}


def _ours_text(cell: dict) -> str:
    if cell["ours"] is None:
        return MISSING
    text = figure(cell["ours"], 2) if cell["unit"] == "percent" else f"{cell['ours']:.4g} {cell['unit']}"
    extra = [f"{figure(cell['nfe'], 1)} NFE" if _number(cell["nfe"]) else None,
             f"{figure(cell['tpf'], 2)} tok/fwd" if _number(cell["tpf"]) else None]
    extra = [e for e in extra if e]
    return text + (f" ({', '.join(extra)})" if extra else "")


def _paper_text(v: Optional[float]) -> str:
    return MISSING if v is None else f"{v:g}"


def published_tables(runs: Sequence[Any], rows: Sequence[dict], multi: bool = False) -> tuple[list[str],
                                                                                              list[dict]]:
    """Markdown lines and JSON of every ``published`` table of ``runs`` (``RunInfo``), ours from the
    aggregated ``rows`` (:func:`adaptive_decoding.experiments.report.aggregate`)."""
    md: list[str] = []
    out: list[dict] = []
    index = {(r["experiment"], r["task"], r["strategy"]): r for r in rows}
    for run in runs:
        blocks = check_published(_Quiet(), (run.experiment or {}).get("published"),
                                 task_pairs((run.experiment or {}).get("tasks")))
        for b in blocks:
            cols = b["columns"]
            table_rows = []
            for r in b["rows"]:
                cells = {}
                for col, key in cols.items():
                    found = index.get((run.name, key, r["strategy"])) if key and r["strategy"] else None
                    cells[col] = {**_ours(found), "paper": r["published"].get(col)}
                table_rows.append({"label": r["label"], "strategy": r["strategy"], "cells": cells})
            out.append({"experiment": run.name, "title": b["title"], "source": b["source"], "note": b["note"],
                        "columns": cols, "rows": table_rows})
            md += [f"## {b['title']}" + (f" (run `{run.name}`)" if multi else ""), ""]
            if b["source"]:
                md += [f"Source: {b['source'].rstrip('.')}.", ""]
            if b["note"]:
                md += [b["note"], ""]
            head = ["label", "strategy (this run)"] + [f"{col}: {who}" for col in cols
                                                       for who in ("ours", "paper")]
            md += markdown_table(head, [[tr["label"], tr["strategy"] or MISSING,
                                         *(text for col in cols for text in (_ours_text(tr["cells"][col]),
                                                                             _paper_text(tr["cells"][col]["paper"])))]
                                        for tr in table_rows])
            ns = sorted({c["n"] for tr in table_rows for c in tr["cells"].values() if c["n"] is not None})
            seeds = sorted({s for tr in table_rows for c in tr["cells"].values() for s in (c["seeds"] or [])})
            md += ["", "Columns: " + "; ".join(f"{col} = task `{key or '?'}`" for col, key in cols.items())
                   + f". *ours*: run `{run.name}`, quality in percent (mean over seeds {seeds or '–'}; "
                   f"{'/'.join(map(str, ns)) or '–'} test examples per cell) with NFE and tokens per "
                   f"forward; *paper*: the published figure, as the experiment file gives it; {MISSING}: "
                   f"not run (yet) or not published.", ""]
    return md, out
