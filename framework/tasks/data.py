"""The ``data`` task: your own data (a JSONL / JSON / CSV / Parquet file, or a dataset in the local
Hugging Face cache) as a benchmark task, scored by a metric of :data:`adaptive_decoding.framework.tasks.metrics.METRICS`.

Rows are read with Hugging Face ``datasets`` (``load_dataset("json", data_files=...)``), offline:
a dataset named by ``dataset=`` must already be in the local cache (nothing is downloaded; a missing
one fails with the command that fetches it on a machine with network). A row becomes an
:class:`~adaptive_decoding.framework.tasks.base.Example`:

* ``prompt``: the row's ``prompt`` column, or ``template`` formatted over the row
  (``"Question: {question}\\nAnswer:"``), after ``few_shot`` solved examples (each ``prompt +
  target_delimiter + answer``) joined by ``separator``;
* ``answer``: the row's ``answer`` column, or ``answer`` as a template (``"{solution}"``);
* ``meta``: every field of the row (a code metric finds its tests there), with ``row_index`` and
  ``data_split`` (a column of the same name wins).

Splits: with split files (``train`` / ``validation`` / ``test``) or a cached dataset's own splits,
the test split is the whole test source; a missing validation split is carved from train by the
project's hash (:meth:`Task.split_of`), so ``adec tune`` and ``adec train-controller`` never see a
test item. With one file (``path``) the hash splits it 80 / 10 / 10.

Generation belongs to the task (Fast-dLLM's evaluation defaults): ``gen_length`` 256,
``block_length`` 32 and stop strings ``until``: the output text is cut at the first of them before
the metric sees it. Prompts are tokenized by the model's tokenizer (``loaded.tokenizer``), which also
applies an instruct model's chat template; :meth:`DataTask.model_chat` is what the ``chat`` parameter
asks of the model loader (``load_model(..., chat=task.model_chat())``).
"""

from __future__ import annotations

import hashlib
import os
import random
import string
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from adaptive_decoding.framework.core.measure import first_stop
from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import SPLITS, TASKS, Example, Task

#: file suffixes and the ``datasets`` builder that reads them
BUILDERS: dict[str, str] = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
CHAT_CHOICES = ("auto", True, False)


class DataTaskError(ParameterError):
    """Bad data-task input (a missing file or column, an empty file, an unknown metric ...)."""


# ====================================================================== helpers
def cut_at_stops(text: str, until: "str | Sequence[str] | None") -> str:
    """``text`` up to the first occurrence of any stop string (lm-eval's ``until``)."""
    stops = [until] if isinstance(until, str) else list(until or [])
    return text[:first_stop(text, stops)]


def template_keys(template: str) -> list[str]:
    """The field names of a ``str.format`` template (``"Q: {question}"`` -> ``["question"]``)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise DataTaskError(f"template {template!r} is not a valid format string ({exc}); write literal "
                            f"braces as {{{{ and }}}}") from None
    return [name.split(".")[0].split("[")[0] for _, name, _, _ in parsed if name is not None]


def is_template(text: str) -> bool:
    """Whether ``text`` has a ``{field}`` (else it names a column)."""
    return bool(template_keys(text))


def builder_of(path: str, what: str) -> str:
    """The ``datasets`` builder of a data file, after checking that it exists."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataTaskError(f"{what}={path!r}: no such file (working directory {os.getcwd()}); allowed: a "
                            f"{', '.join(BUILDERS)} file")
    suffix = p.suffix.lower()
    if suffix not in BUILDERS:
        raise DataTaskError(f"{what}={path!r}: unknown file type {suffix or '(none)'}; allowed: "
                            f"{', '.join(BUILDERS)}")
    return BUILDERS[suffix]


@contextmanager
def offline_datasets() -> Iterator[Any]:
    """``datasets`` with the hub switched off (as ``HF_DATASETS_OFFLINE=1``), restored afterwards."""
    try:
        import datasets
    except ModuleNotFoundError:
        raise DataTaskError("the data task reads files with Hugging Face datasets, which is not installed: "
                            "pip install 'adaptive-decoding[data]' (or pip install datasets)") from None
    import huggingface_hub.constants as hub

    saved = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    bars = datasets.is_progress_bar_enabled()
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()  # "Generating rows split" per small file is noise in a run's log
    try:
        yield datasets
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved
        if bars:
            datasets.enable_progress_bars()


@lru_cache(maxsize=32)
def _read_file(path: str, mtime: float) -> tuple[dict, ...]:
    with offline_datasets() as datasets:
        ds = datasets.load_dataset(builder_of(path, "path"), data_files={"rows": path}, split="rows")
    return tuple(dict(r) for r in ds)


def _blank(path: str, probe: int = 1 << 16) -> bool:
    """Whether a file is empty or (a small text file) only whitespace."""
    size = os.path.getsize(path)
    if size == 0 or size > probe or path.lower().endswith(".parquet"):
        return size == 0
    with open(path, "rb") as fh:
        return not fh.read().strip()


def read_file(path: str, what: str = "path") -> list[dict]:
    """The rows of a JSONL / JSON / CSV / Parquet file (read once per modification time)."""
    builder = builder_of(path, what)
    full = str(Path(path).expanduser().resolve())
    rows: tuple = ()
    if not _blank(full):
        try:
            rows = _read_file(full, os.path.getmtime(full))
        except DataTaskError:
            raise
        except Exception as exc:  # noqa: BLE001 - a parse error of the file, reported with its name
            raise DataTaskError(f"{what}={path!r} could not be read as {builder} ({type(exc).__name__}: "
                                f"{exc})") from None
    if not rows:
        raise DataTaskError(f"{what}={path!r} has no rows; allowed: a file with at least one row")
    return list(rows)


def fetch_command(dataset: str, config: Optional[str]) -> str:
    args = repr(dataset) + ("" if config is None else f", {config!r}")
    return f'python -c "import datasets; datasets.load_dataset({args})"'


@lru_cache(maxsize=8)
def read_cached_dataset(dataset: str, config: Optional[str]) -> dict[str, tuple[dict, ...]]:
    """Every split of a dataset already in the local Hugging Face datasets cache (never downloaded)."""
    with offline_datasets() as datasets:
        try:
            dd = datasets.load_dataset(dataset, config)
        except Exception as exc:  # noqa: BLE001 - offline: not cached (ConnectionError, FileNotFoundError ...)
            raise DataTaskError(
                f"dataset={dataset!r}" + ("" if config is None else f" config={config!r}") + " is not in the local "
                f"Hugging Face datasets cache ({type(exc).__name__}: {exc}); fetch it on a machine with network "
                f"with `{fetch_command(dataset, config)}` and point HF_DATASETS_CACHE (or HF_HOME) at that cache, "
                f"or export it to a file (ds.to_json('data.jsonl')) and pass path=data.jsonl") from None
    return {name: tuple(dict(r) for r in split) for name, split in dd.items()}


# ====================================================================== the task
class DataTask(Task):
    """Your own data (JSONL / JSON / CSV / Parquet, or a cached HF dataset) scored by a named metric."""

    metric = "the metric parameter: a name in adaptive_decoding.framework.tasks.metrics.METRICS (default exact)"
    params = {
        "path": Param(str, nullable=True, doc="one data file (.jsonl .json .csv .parquet), split 80/10/10 by hash"),
        "train": Param(str, nullable=True, doc="the train split's file"),
        "validation": Param(str, nullable=True, doc="the validation split's file (default: carved from train)"),
        "test": Param(str, nullable=True, doc="the test split's file"),
        "dataset": Param(str, nullable=True, doc="a dataset name in the local HF datasets cache (gsm8k)"),
        "config": Param(str, nullable=True, doc="the cached dataset's configuration (main)"),
        "split": Param(str, doc="the cached dataset's split used as the test split"),
        "prompt": Param(str, nullable=True, doc="the prompt column (or give template)"),
        "template": Param(str, nullable=True, doc="the prompt as a format string over the row"),
        "answer": Param(str, doc="the answer column, or a format string over the row"),
        "few_shot": Param(int, low=0, doc="solved examples shown before each prompt"),
        "few_shot_split": Param(str, choices=SPLITS, doc="the split the shots are drawn from"),
        "few_shot_path": Param(str, nullable=True, doc="a file the shots are drawn from instead"),
        "few_shot_seed": Param(int, doc="seed of the shots' draw"),
        "separator": Param(str, doc="between the shots and before the prompt"),
        "target_delimiter": Param(str, doc="between a shot's prompt and its answer"),
        "chat": Param(str, choices=CHAT_CHOICES, doc="the model's chat template: auto (if it has one), true, false"),
        "gen_length": Param(int, low=1, high=8192, doc="tokens generated per item (G)"),
        "block_length": Param(int, low=1, high=8192, doc="semi-autoregressive block length"),
        "until": Param(list, nullable=True, doc="stop strings: the output is cut at the first before scoring"),
        "metric": Param(str, doc="a metric of the metrics registry (adec list metrics)"),
        "metric_params": Param(dict, nullable=True, doc="the metric's parameters"),
    }

    def __init__(self, path: Optional[str] = None, train: Optional[str] = None, validation: Optional[str] = None,
                 test: Optional[str] = None, dataset: Optional[str] = None, config: Optional[str] = None,
                 split: str = "test", prompt: Optional[str] = None, template: Optional[str] = None,
                 answer: str = "answer", few_shot: int = 0, few_shot_split: str = "train",
                 few_shot_path: Optional[str] = None, few_shot_seed: int = 1234, separator: str = "\n\n",
                 target_delimiter: str = " ", chat: Any = "auto", gen_length: int = 256, block_length: int = 32,
                 until: Optional[list] = None, metric: str = "exact", metric_params: Optional[dict] = None) -> None:
        self.path, self.train, self.validation, self.test = path, train, validation, test
        self.dataset, self.config, self.split = dataset, config, split
        self.prompt, self.template, self.answer = prompt, template, answer
        self.few_shot, self.few_shot_split, self.few_shot_path = few_shot, few_shot_split, few_shot_path
        self.few_shot_seed, self.separator, self.target_delimiter = few_shot_seed, separator, target_delimiter
        self.chat, self.gen_length, self.block_length = chat, gen_length, block_length
        self.until, self.metric, self.metric_params = until, metric, metric_params

    # Task declares gen_length a property; here it is a plain validated parameter (as in TextTask)
    gen_length = None  # type: ignore[assignment]

    # ------------------------------------------------------------------ validation (before any decoding)
    def check_combination(self) -> None:
        if isinstance(self.until, str):
            self.until = [self.until]
        if self.until is not None and not all(isinstance(s, str) and s for s in self.until):
            raise DataTaskError(f"data.until={self.until!r} is not allowed; allowed: a list of non-empty strings")
        if self.metric_params is not None and not isinstance(self.metric_params, dict):
            raise DataTaskError(f"data.metric_params={self.metric_params!r} is not allowed; allowed: a mapping")
        self._check_sources()
        self.scorer()
        self._check_fields()
        self._check_few_shot()

    def _check_sources(self) -> None:
        files = {k: getattr(self, k) for k in ("train", "validation", "test") if getattr(self, k) is not None}
        given = [name for name, on in (("path", self.path is not None), ("train/validation/test", bool(files)),
                                        ("dataset", self.dataset is not None)) if on]
        if len(given) != 1:
            raise DataTaskError(f"data: give exactly one source; allowed: path=FILE, split files (train=, "
                                f"validation=, test=) or dataset=NAME (with config=, split=); given: "
                                f"{', '.join(given) or 'none'}")
        for key, value in files.items():
            builder_of(value, key)
        if self.path is not None:
            builder_of(self.path, "path")
        if self.few_shot_path is not None:
            builder_of(self.few_shot_path, "few_shot_path")
        if self.dataset is None and self.config is not None:
            self.warn_no_effect("config", "it only applies to dataset=NAME")

    def _check_fields(self) -> None:
        if (self.prompt is None) == (self.template is None):
            raise DataTaskError("data: give exactly one of prompt=COLUMN or template='...{column}...' "
                                f"(given: prompt={self.prompt!r}, template={self.template!r})")
        for source, rows in self.sources().items():
            columns = list(rows[0])
            if self.prompt is not None and self.prompt not in columns:
                raise DataTaskError(f"data.prompt={self.prompt!r} is not a column of {source}; columns: "
                                    f"{', '.join(columns)}")
            for what, text in (("template", self.template), ("answer", self.answer)):
                keys = template_keys(text) if text is not None else []
                missing = [k for k in keys if k not in columns]
                if missing:
                    raise DataTaskError(f"data.{what}={text!r} names {', '.join(map(repr, missing))}, not a "
                                        f"column of {source}; columns: {', '.join(columns)}")
            if not is_template(self.answer) and self.answer not in columns:
                raise DataTaskError(f"data.answer={self.answer!r} is not a column of {source} (nor a template "
                                    f"with {{column}}); columns: {', '.join(columns)}")

    def _check_few_shot(self) -> None:
        if self.few_shot == 0:
            return
        pool = self._shot_pool()
        if len(pool) < self.few_shot + 1:
            where = f"few_shot_path={self.few_shot_path!r}" if self.few_shot_path else \
                f"the {self.few_shot_split} split"
            raise DataTaskError(f"data.few_shot={self.few_shot} needs at least {self.few_shot + 1} rows in {where}, "
                                f"which has {len(pool)}; allowed: few_shot ≤ {max(0, len(pool) - 1)}")

    # ------------------------------------------------------------------ rows and splits
    def sources(self) -> dict[str, list[dict]]:
        """The rows of every source, by a name for messages (file path or ``dataset:split``)."""
        if self.path is not None:
            out = {f"path={self.path!r}": read_file(self.path)}
        elif self.dataset is not None:
            out = {f"dataset {self.dataset}[{name}]": list(rows) for name, rows in self._dataset_splits().items()}
        else:
            out = {f"{k}={getattr(self, k)!r}": read_file(getattr(self, k), k)
                   for k in ("train", "validation", "test") if getattr(self, k) is not None}
        if self.few_shot_path is not None:
            out[f"few_shot_path={self.few_shot_path!r}"] = read_file(self.few_shot_path, "few_shot_path")
        return out

    def _dataset_splits(self) -> dict[str, list[dict]]:
        """The cached dataset's rows as the project's splits (``split`` is the test split)."""
        found = read_cached_dataset(self.dataset, self.config)
        if self.split not in found:
            raise DataTaskError(f"data.split={self.split!r} is not a split of dataset {self.dataset!r}; allowed: "
                                f"{', '.join(found)}")
        out = {"test": list(found[self.split])}
        for name in ("train", "validation"):
            if name in found and name != self.split:
                out[name] = list(found[name])
        empty = [k for k, rows in out.items() if not rows]
        if empty:
            raise DataTaskError(f"dataset {self.dataset!r} split {empty[0]!r} has no rows")
        return out

    def split_rows(self, split: str) -> list[dict]:
        """The rows of one of the project's splits (see the module docstring)."""
        self._check_split(split)
        if self.path is not None:
            return [r for r in read_file(self.path) if self.split_of(self.render_prompt(r)) == split]
        named = self._dataset_splits() if self.dataset is not None else {
            k: read_file(getattr(self, k), k) for k in ("train", "validation", "test") if getattr(self, k) is not None}
        if split in named:
            if split == "train" and "validation" not in named:  # validation was carved from train
                return [r for r in named["train"] if self.split_of(self.render_prompt(r)) != "validation"]
            return named[split]
        if split == "validation" and "train" in named:
            return [r for r in named["train"] if self.split_of(self.render_prompt(r)) == "validation"]
        raise DataTaskError(f"data: no {split} split; give {split}=FILE" +
                            (" (or train=FILE, whose hash part becomes validation)" if split == "validation" else ""))

    # ------------------------------------------------------------------ rendering
    def render_prompt(self, row: dict) -> str:
        """The row's prompt without shots: its ``prompt`` column or ``template`` over the row."""
        if self.template is not None:
            return self.template.format(**row)
        return str(row[self.prompt])

    def render_answer(self, row: dict) -> str:
        """The row's answer: its ``answer`` column, or ``answer`` as a template over the row."""
        return self.answer.format(**row) if is_template(self.answer) else str(row[self.answer])

    def _shot_pool(self) -> list[dict]:
        if self.few_shot_path is not None:
            return read_file(self.few_shot_path, "few_shot_path")
        return self.split_rows(self.few_shot_split)

    def shots(self, exclude: Optional[str] = None) -> list[dict]:
        """The ``few_shot`` solved rows (one seeded draw), skipping a row whose prompt is ``exclude``."""
        if self.few_shot == 0:
            return []
        pool = self._shot_pool()
        order = random.Random(f"data-shots|{self.few_shot_seed}").sample(range(len(pool)), len(pool))
        drawn = [pool[i] for i in order if exclude is None or self.render_prompt(pool[i]) != exclude]
        return drawn[: self.few_shot]

    def full_prompt(self, row: dict, shots: Sequence[dict]) -> str:
        """``shots`` (prompt, ``target_delimiter``, answer) then the row's prompt, joined by ``separator``."""
        parts = [self.render_prompt(s) + self.target_delimiter + self.render_answer(s) for s in shots]
        return self.separator.join([*parts, self.render_prompt(row)])

    # ------------------------------------------------------------------ the Task contract
    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """The first ``n`` rows of ``split`` in file order (as lm-eval's ``--limit``); ``seed`` is unused:
        the data are fixed."""
        self._check_split(split)
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n={n!r} must be a non-negative integer")
        rows = self.split_rows(split)
        if n > len(rows):
            raise DataTaskError(f"task data has {len(rows)} {split} rows, fewer than n={n}; ask for n ≤ {len(rows)}")
        shots = self.shots()
        out = []
        for i, row in enumerate(rows[:n]):
            question = self.render_prompt(row)
            mine = shots if all(self.render_prompt(s) != question for s in shots) else self.shots(exclude=question)
            prompt, answer = self.full_prompt(row, mine), self.render_answer(row)
            digest = hashlib.sha256(f"{prompt}\x00{answer}".encode()).hexdigest()[:8]
            out.append(Example(id=f"data-{split}-{i}-{digest}", prompt=prompt, answer=answer,
                               meta={"row_index": i, "data_split": split, **row}))
        return out

    def iter_examples(self, split: str, seed: int = 0) -> Iterator[Example]:
        """Every row of ``split`` once, in file order."""
        yield from self.examples(split, len(self.split_rows(split)), seed)

    @property
    def max_prompt_length(self) -> int:
        """Longest test prompt in characters (tokens are the model's; a character bound is the safe one)."""
        return max(len(ex.prompt) for ex in self.iter_examples("test"))

    @property
    def default_block_length(self) -> int:
        return min(self.block_length, self.gen_length)

    @property
    def tokenizer(self) -> Any:
        raise DataTaskError("the data task has no vocabulary of its own: its prompts are tokenized by the model's "
                            "tokenizer (loaded.tokenizer), as adaptive_decoding.framework.engine.evaluate does")

    def model_chat(self) -> Optional[bool]:
        """What ``chat`` asks of the model loader: ``None`` = the tokenizer's own choice (auto)."""
        return None if self.chat == "auto" else bool(self.chat)

    def scorer(self) -> Any:
        """The metric (:func:`adaptive_decoding.framework.tasks.metrics.get_metric` with ``metric_params``)."""
        from adaptive_decoding.framework.core.registry import UnknownNameError
        from adaptive_decoding.framework.tasks.metrics import get_metric

        try:
            return get_metric(self.metric, **(self.metric_params or {}))
        except UnknownNameError as exc:
            raise DataTaskError(f"data.metric: {exc}") from None

    def scores(self, example: Example, output_text: str) -> dict[str, float]:
        """Every figure of the metric for the output cut at ``until``, headline first."""
        return self.scorer().scores(cut_at_stops(output_text, self.until), example)

    def score(self, example: Example, output_text: str) -> float:
        """The metric's headline figure for the output cut at the first ``until`` string."""
        return float(self.scorer().score(cut_at_stops(output_text, self.until), example))

    def stop_strings(self, example: Example) -> list[str]:
        """``until``: the output is cut at the first of them."""
        return list(self.until or [])

    def score_ids(self, example: Example, generated_ids: Any) -> float:  # pragma: no cover - needs the model
        raise DataTaskError("data task: score the decoded text (score(example, loaded.tokenizer.decode(ids)))")

    def describe(self) -> str:
        return (type(self).__doc__ or "").strip().splitlines()[0]


def _register() -> None:
    if "data" not in TASKS:
        TASKS.add("data", DataTask)


_register()
