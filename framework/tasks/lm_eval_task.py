"""The ``lm_eval`` task: an lm-evaluation-harness ``generate_until`` task as a benchmark task.

``{name: lm_eval, params: {task: gsm8k, include_path: DIR, num_fewshot: 5}}`` loads the task with
lm-eval's own :class:`lm_eval.tasks.TaskManager` and builds its requests with lm-eval's
``build_all_requests`` (its prompt, few-shot context with its seed, and ``until``), exactly as
``lm_eval.simple_evaluate`` does. Each output is cut at the request's ``until`` strings (as lm-eval's
models do), passed through the task's own filters and scored by its own ``process_results``; the
headline figure is the first metric under the first filter (``exact_match,strict-match`` for gsm8k),
so a cell's accuracy, the mean over items, equals what lm-eval reports for the same outputs (tasks
whose headline aggregation is not the mean, and repeated sampling, are refused).

Splits: ``test`` is lm-eval's evaluation documents (its ``test_split``, else ``validation_split``);
``validation`` and ``train`` are the task's other documents (``validation_split``, ``training_split``)
with the same few-shot context, so tuning never sees a test document. Offline: a task's data must
be local (``dataset_path: json`` with ``data_files``) or already in the Hugging Face datasets cache.
lm-eval (``pip install 'adaptive-decoding[eval]'``) is imported only when the task is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.tasks.base import TASKS, Example, Task
from adaptive_decoding.framework.tasks.data import cut_at_stops, offline_datasets


class LmEvalTaskError(ParameterError):
    """Bad lm_eval-task input (lm-eval missing, an unknown task, a task that cannot be scored per item)."""


@dataclass
class LoadedLmEvalTask:
    """One lm-eval task with its requests built: the task object and, per split, docs and contexts."""

    task: Any
    docs: dict[str, list[tuple[int, dict, str, dict]]] = field(default_factory=dict)  # (doc_id, doc, ctx, kwargs)
    positions: dict[str, dict[int, int]] = field(default_factory=dict)

    def index(self, split: str) -> dict[int, int]:
        """``doc_id`` -> position in ``docs[split]``."""
        if split not in self.positions:
            self.positions[split] = {row[0]: i for i, row in enumerate(self.docs[split])}
        return self.positions[split]


def _import_lm_eval() -> Any:
    try:
        import lm_eval.tasks
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "lm_eval":
            raise LmEvalTaskError("the lm_eval task needs lm-evaluation-harness: pip install "
                                  "'adaptive-decoding[eval]' (or pip install lm-eval)") from None
        raise
    return lm_eval.tasks


def _load_lm_task(name: str, include_path: Optional[str], include_defaults: bool) -> Any:
    tasks = _import_lm_eval()
    manager = tasks.TaskManager(include_path=include_path, include_defaults=include_defaults)
    if name not in manager.all_tasks:
        import difflib

        close = difflib.get_close_matches(name, manager.all_tasks, n=3)
        raise LmEvalTaskError(f"lm_eval.task={name!r} is not an lm-eval task" + (f"; did you mean {close}?" if close
                              else "") + (f" (include_path={include_path!r})" if include_path else
                                          "; give include_path=DIR for a task of your own"))
    with offline_datasets():
        try:
            loaded = manager.load([name])["tasks"]
        except (ConnectionError, FileNotFoundError, OSError) as exc:
            raise LmEvalTaskError(f"lm_eval.task={name!r}: its data is neither local nor in the Hugging Face datasets "
                                  f"cache ({type(exc).__name__}: {exc}); run lm-eval once on a machine with network "
                                  f"(or point its dataset_path: json at local data_files)") from None
    if len(loaded) != 1:
        raise LmEvalTaskError(f"lm_eval.task={name!r} is a group of {len(loaded)} tasks ({', '.join(loaded)}); "
                              f"allowed: one task (list each as its own task)")
    return next(iter(loaded.values()))


def _check_scorable(lm_task: Any, name: str) -> None:
    from lm_eval.api.metrics import mean

    if lm_task.get_config("output_type") != "generate_until":
        raise LmEvalTaskError(f"lm_eval.task={name!r} is a {lm_task.get_config('output_type')} task; allowed: "
                              f"generate_until tasks (a diffusion decoder generates text)")
    if (lm_task.get_config("repeats") or 1) != 1:
        raise LmEvalTaskError(f"lm_eval.task={name!r} samples {lm_task.get_config('repeats')} generations per "
                              f"document; allowed: repeats 1")
    not_mean = [m for m, agg in lm_task.aggregation().items() if agg is not mean]
    if not_mean:
        raise LmEvalTaskError(f"lm_eval.task={name!r}: metric(s) {', '.join(not_mean)} are not averaged over "
                              f"documents, so a per-item score cannot reproduce them; allowed: mean-aggregated metrics")


def _contexts(lm_task: Any, docs: Any, split: str) -> list[tuple[int, dict, str, dict]]:
    """``(doc_id, doc, context, generation kwargs)`` of ``docs``; the test split through lm-eval's own
    ``build_all_requests``, the others through its ``fewshot_context`` with the same settings."""
    if split == "test":
        lm_task.build_all_requests()
        return [(inst.doc_id, inst.doc, inst.args[0], dict(inst.args[1])) for inst in lm_task.instances]
    kwargs = dict(lm_task.config.generation_kwargs or {})
    shots = lm_task.get_config("num_fewshot") or 0
    return [(i, doc, lm_task.fewshot_context(doc, num_fewshot=shots, gen_prefix=lm_task.doc_to_prefix(doc)), kwargs)
            for i, doc in enumerate(docs)]


@lru_cache(maxsize=8)
def load_lm_eval_task(name: str, include_path: Optional[str], include_defaults: bool, num_fewshot: Optional[int],
                      fewshot_seed: int) -> LoadedLmEvalTask:
    """lm-eval's task ``name`` configured as ``simple_evaluate`` does (``num_fewshot``, the few-shot seed),
    with its evaluation requests built."""
    lm_task = _load_lm_task(name, include_path, include_defaults)
    _check_scorable(lm_task, name)
    if num_fewshot is not None and lm_task.get_config("num_fewshot") != 0:
        lm_task.set_config(key="num_fewshot", value=num_fewshot)
    elif lm_task.get_config("num_fewshot") is None:
        lm_task.set_config(key="num_fewshot", value=0)
    lm_task.set_fewshot_seed(seed=fewshot_seed)
    out = LoadedLmEvalTask(task=lm_task)
    out.docs["test"] = _contexts(lm_task, lm_task.eval_docs, "test")
    uses_test = lm_task.has_test_docs()
    if lm_task.has_validation_docs() and uses_test:
        out.docs["validation"] = _contexts(lm_task, lm_task.validation_docs(), "validation")
    if lm_task.has_training_docs():
        out.docs["train"] = _contexts(lm_task, lm_task.training_docs(), "train")
    return out


def lm_eval_scores(lm_task: Any, doc: dict, context: str, kwargs: dict, output: str) -> dict[str, float]:
    """lm-eval's figures for one output: cut at ``until``, the task's filters, its ``process_results``;
    keys ``metric,filter`` as lm-eval reports them, in filter order."""
    from lm_eval.api.instance import Instance

    inst = Instance(request_type="generate_until", doc=doc, arguments=(context, kwargs), idx=0,
                    metadata=(lm_task.config.task, 0, 1))
    inst.resps.append(cut_at_stops(output, kwargs.get("until")))
    for ensemble in getattr(lm_task, "_filters", []):  # what lm-eval's Task.apply_filters runs
        ensemble.apply([inst])
    out: dict[str, float] = {}
    for key, value in inst.filtered_resps.items():
        for metric, figure in lm_task.process_results(doc, [value]).items():
            out[f"{metric},{key}"] = float(figure)
    return out


class LmEvalTask(Task):
    """An lm-evaluation-harness generate_until task, prompted and scored by lm-eval's own code."""

    metric = "the lm-eval task's first metric under its first filter (as lm-eval reports it)"
    params = {
        "task": Param(str, doc="an lm-eval task name (lm-eval's own or one under include_path)"),
        "include_path": Param(str, nullable=True, doc="a folder of your own lm-eval task YAML files"),
        "include_defaults": Param(bool, doc="also index lm-eval's built-in tasks (slower to start)"),
        "num_fewshot": Param(int, low=0, nullable=True, doc="few-shot examples; null = the task's own"),
        "fewshot_seed": Param(int, doc="lm-eval's fewshot_random_seed"),
        "gen_length": Param(int, low=1, high=8192, doc="tokens generated per item (G)"),
        "block_length": Param(int, low=1, high=8192, doc="semi-autoregressive block length"),
        "headline": Param(str, nullable=True, doc="the figure scored as accuracy, 'metric,filter'; null = first"),
    }

    def __init__(self, task: str = "", include_path: Optional[str] = None, include_defaults: bool = True,
                 num_fewshot: Optional[int] = None, fewshot_seed: int = 1234, gen_length: int = 256,
                 block_length: int = 32, headline: Optional[str] = None) -> None:
        self.task, self.include_path, self.include_defaults = task, include_path, include_defaults
        self.num_fewshot, self.fewshot_seed = num_fewshot, fewshot_seed
        self.gen_length, self.block_length, self.headline = gen_length, block_length, headline

    gen_length = None  # type: ignore[assignment]  (a parameter here, a property in Task)

    def check_combination(self) -> None:
        if not self.task:
            raise LmEvalTaskError("lm_eval.task is required: an lm-eval task name, e.g. task=gsm8k")
        if self.include_path is not None:
            from pathlib import Path

            if not Path(self.include_path).expanduser().is_dir():
                raise LmEvalTaskError(f"lm_eval.include_path={self.include_path!r} is not a folder; allowed: a folder "
                                      f"of lm-eval task YAML files")
        self.loaded()

    def loaded(self) -> LoadedLmEvalTask:
        return load_lm_eval_task(self.task, self.include_path, bool(self.include_defaults), self.num_fewshot,
                                 int(self.fewshot_seed))

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """The first ``n`` documents of ``split`` in lm-eval's order (``--limit n``); ``seed`` is unused."""
        self._check_split(split)
        docs = self.loaded().docs
        if split not in docs:
            raise LmEvalTaskError(f"lm-eval task {self.task!r} has no {split} documents apart from its test "
                                  f"documents; allowed splits: {', '.join(docs)}")
        rows = docs[split]
        if not isinstance(n, int) or n < 0 or n > len(rows):
            raise LmEvalTaskError(f"n={n!r}: lm-eval task {self.task!r} has {len(rows)} {split} documents; "
                                  f"allowed: 0 ≤ n ≤ {len(rows)}")
        lm_task = self.loaded().task
        return [Example(id=f"lm_eval-{self.task}-{split}-{doc_id}", prompt=ctx, answer=str(lm_task.doc_to_target(doc)),
                        meta={"doc_id": doc_id, "split": split, "until": list(kw.get("until") or [])})
                for doc_id, doc, ctx, kw in rows[:n]]

    def _request(self, example: Example) -> tuple[dict, str, dict]:
        loaded = self.loaded()
        split, doc_id = example.meta.get("split"), example.meta.get("doc_id")
        if split not in loaded.docs or doc_id not in loaded.index(split):
            raise LmEvalTaskError(f"{example.id}: not a document of lm-eval task {self.task!r} (its meta names "
                                  f"split={split!r}, doc_id={doc_id!r})")
        _, doc, ctx, kw = loaded.docs[split][loaded.index(split)[doc_id]]
        return doc, ctx, kw

    def scores(self, example: Example, output_text: str) -> dict[str, float]:
        """lm-eval's figures (``metric,filter``) for one output, the headline first."""
        doc, ctx, kw = self._request(example)
        out = lm_eval_scores(self.loaded().task, doc, ctx, kw, output_text)
        key = self.headline or next(iter(out))
        if key not in out:
            raise LmEvalTaskError(f"lm_eval.headline={key!r} is not a figure of {self.task!r}; allowed: "
                                  f"{', '.join(out)}")
        return {key: out[key], **{k: v for k, v in out.items() if k != key}}

    def stop_strings(self, example: Example) -> list[str]:
        """The request's ``until`` (lm-eval cuts the output at the first of them)."""
        return list(example.meta.get("until") or [])

    def score(self, example: Example, output_text: str) -> float:
        """The headline figure (lm-eval's first metric under its first filter, or ``headline``)."""
        return next(iter(self.scores(example, output_text).values()))

    @property
    def max_prompt_length(self) -> int:
        """Longest test context in characters (tokens are the model's)."""
        return max(len(ctx) for _, _, ctx, _ in self.loaded().docs["test"])

    @property
    def default_block_length(self) -> int:
        return min(self.block_length, self.gen_length)

    @property
    def tokenizer(self) -> Any:
        raise LmEvalTaskError("the lm_eval task has no vocabulary of its own: its prompts are tokenized by the "
                              "model's tokenizer (loaded.tokenizer)")

    def score_ids(self, example: Example, generated_ids: Any) -> float:  # pragma: no cover - needs the model
        raise LmEvalTaskError("lm_eval task: score the decoded text (score(example, loaded.tokenizer.decode(ids)))")


def _register() -> None:
    if "lm_eval" not in TASKS:
        TASKS.add("lm_eval", LmEvalTask)


_register()
