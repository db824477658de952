"""The task contract (:class:`Task`, :class:`Example`), seeded disjoint splits and the ``TASKS``
registry.

A task is one class, and everything else reads its declarations from it: its vocabulary
(:attr:`Task.vocabulary`), the recipe of the tiny denoiser trained on it (:attr:`Task.recipe`, a
:class:`Recipe`), the built-in model of that name (:attr:`Task.model_name`, listed in
``adaptive_decoding.framework.models.zoo.MODELS``) and the attention structure such a denoiser may use
(:attr:`Task.attention_structure`). Registering it (``@TASKS.register("name")``) is the only other step.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Iterator, Optional, Sequence

from adaptive_decoding.framework.core.options import SPLITS  # noqa: F401  (re-exported: tasks name their splits here)
from adaptive_decoding.framework.core.params import Configurable, Param
from adaptive_decoding.framework.core.registry import Registry, package_modules
from adaptive_decoding.framework.tasks.vocab import TaskTokenizer, tokenizer_for

#: cumulative bucket bounds (out of 1000) of the train / validation / test splits
_SPLIT_BOUNDS = {"train": (0, 800), "validation": (800, 900), "test": (900, 1000)}


@dataclass(frozen=True)
class ModelVariant:
    """A further built-in model of a task: ``name``, warm-started from the built-in model
    ``init_from`` (or trained from scratch when ``None``), with the tiny denoiser's ``block_size``
    (block diffusion; ``None``: bidirectional) and the :class:`Recipe` fields in ``recipe`` replaced."""

    name: str
    description: str = ""
    block_size: Optional[int] = None
    init_from: Optional[str] = None
    recipe: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Recipe:
    """How the tiny denoiser of a task is trained by default (every field can be overridden by
    ``adaptive_decoding.framework.training.masked_diffusion.train_denoiser``): architecture preset ``size``, the step
    and wall-time budgets, AdamW's ``lr`` / ``weight_decay`` / ``warmup_steps``, the smallest masking
    probability ``eps``, the data sizes and how many test problems measure the saved model."""

    size: str = "small"
    max_minutes: float = 9.0
    max_steps: int = 3000
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 200
    eps: float = 1e-3
    train_size: Optional[int] = None
    val_size: int = 256
    val_every: int = 500
    n_test: int = 1000

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Example:
    """One problem: ``prompt`` text, exact ``answer`` text, task-specific ``meta``."""

    id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class Task(Configurable):
    """Base of every task. Subclasses implement :meth:`_sample` and the length properties.

    A task is a :class:`~adaptive_decoding.framework.core.params.Configurable`: its size knobs (``digits``, ``max_blanks``)
    are validated keyword parameters, so ``get_task("addition", digits=4)`` is a different task.
    """

    params: ClassVar[dict[str, Param]] = {}
    #: what :meth:`score` measures, one line for ``adec list tasks``
    metric: ClassVar[str] = "exact match"
    #: every token string, index = id (specials first, see :func:`adaptive_decoding.framework.tasks.vocab.make_vocabulary`);
    #: ``None`` for a task that overrides :attr:`tokenizer` (its own tokenizer, or the model's)
    vocabulary: ClassVar[Optional[tuple[str, ...]]] = None
    #: the default training recipe of its tiny denoiser; ``None``: :class:`Recipe` defaults
    recipe: ClassVar[Optional[Recipe]] = None
    #: the built-in model trained on this task's defaults (``tiny-addition``), ``None`` for none;
    #: read from the class that declares it (a subclass does not inherit it)
    model_name: ClassVar[Optional[str]] = None
    #: one line for ``adec list models``
    model_description: ClassVar[str] = ""
    #: further built-in models of this task (:class:`ModelVariant`), e.g. a block-diffusion one;
    #: read from the declaring class like :attr:`model_name`
    model_variants: ClassVar[tuple["ModelVariant", ...]] = ()

    # ------------------------------------------------------------------ to implement
    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:  # pragma: no cover
        """One ``(prompt, answer, meta)`` drawn from ``rng``, ignoring splits."""
        raise NotImplementedError

    @property
    def gen_length(self) -> int:  # pragma: no cover
        """Answer slot length G (answers are padded with ``[EOS]`` to it)."""
        raise NotImplementedError

    @property
    def max_prompt_length(self) -> int:  # pragma: no cover
        """Longest prompt in tokens."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared API
    @property
    def name(self) -> str:
        return self.display_name()

    @property
    def default_block_length(self) -> int:
        """Semi-autoregressive block length the benchmarks use by default (``gen_length``)."""
        return self.gen_length

    @property
    def canvas_length(self) -> int:
        """Longest canvas ``prompt + gen_length`` in tokens."""
        return self.max_prompt_length + self.gen_length

    @property
    def attention_structure(self) -> Optional[dict]:
        """Where the cells of a structured canvas lie, for a denoiser whose attention follows it
        (:mod:`adaptive_decoding.framework.models.structure`); ``None`` (default): full bidirectional attention."""
        return None

    @property
    def tokenizer(self) -> TaskTokenizer:
        """The tokenizer of :attr:`vocabulary` (shared by every task declaring the same one)."""
        if self.vocabulary is None:
            raise NotImplementedError(f"task {self.name!r} declares no vocabulary; declare "
                                      f"`vocabulary = make_vocabulary(words=...)` or override `tokenizer`")
        return tokenizer_for(self.vocabulary)

    @classmethod
    def training_recipe(cls) -> Recipe:
        """:attr:`recipe`, or the :class:`Recipe` defaults when the task declares none."""
        return cls.recipe if cls.recipe is not None else Recipe()

    def describe(self) -> str:
        return (type(self).__doc__ or "").strip().splitlines()[0]

    def split_of(self, prompt: str) -> str:
        """The split a prompt belongs to (a hash of the task name and the prompt)."""
        digest = hashlib.sha256(f"{self.name}\x00{prompt}".encode()).digest()
        bucket = int.from_bytes(digest[:4], "big") % 1000
        for split, (lo, hi) in _SPLIT_BOUNDS.items():
            if lo <= bucket < hi:
                return split
        raise AssertionError(bucket)  # pragma: no cover

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r} for task {self.name!r}; allowed: {', '.join(SPLITS)}")

    def _example(self, prompt: str, answer: str, meta: dict) -> Example:
        digest = hashlib.sha256(f"{prompt}\x00{answer}".encode()).hexdigest()[:12]
        return Example(id=f"{self.name}-{digest}", prompt=prompt, answer=answer, meta=meta)

    def iter_examples(self, split: str, seed: int = 0) -> Iterator[Example]:
        """Endless stream of examples of ``split`` (repeats possible), deterministic in ``seed``."""
        self._check_split(split)
        self.validate()
        rng = random.Random(f"{self.name}|{sorted(self.get_params().items())}|{split}|{seed}")
        while True:
            drawn = self._sample_for(split, rng)
            if drawn is not None and self.split_of(drawn[0]) == split:
                yield self._example(*drawn)

    def _sample_for(self, split: str, rng: random.Random) -> Optional[tuple[str, str, dict]]:
        """One draw for ``split`` (``None`` = rejected, draw again); by default :meth:`_sample`. A task
        whose training examples are drawn differently, or whose test examples are filtered, overrides it."""
        return self._sample(rng)

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """``n`` distinct examples of ``split`` (train, validation or test), deterministic in ``seed``."""
        self._check_split(split)
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n={n!r} must be a non-negative integer")
        out: list[Example] = []
        seen: set[tuple[str, str]] = set()
        attempts, limit = 0, 50 * n + 10_000
        for ex in self.iter_examples(split, seed):
            if len(out) >= n:
                break
            attempts += 1
            if attempts > limit:
                raise ValueError(
                    f"task {self.name!r} has fewer than n={n} distinct {split} examples "
                    f"(found {len(out)}); ask for fewer"
                )
            key = (ex.prompt, ex.answer)
            if key not in seen:
                seen.add(key)
                out.append(ex)
        return out

    def prompt_ids(self, example: Example) -> list[int]:
        return self.tokenizer.encode(example.prompt)

    def target_ids(self, example: Example) -> list[int]:
        """Answer ids padded with ``[EOS]`` to ``gen_length``."""
        ids = self.tokenizer.encode(example.answer)
        if len(ids) > self.gen_length:
            raise ValueError(
                f"answer {example.answer!r} has {len(ids)} tokens, more than gen_length={self.gen_length}"
            )
        return ids + [self.tokenizer.eos_token_id] * (self.gen_length - len(ids))

    def span_mask(self, example: Example, gen_length: int) -> Optional[list[bool]]:
        """The generation positions (of ``gen_length``) that form spans of this example's answer, known
        from the prompt alone (``number_guard``'s ``rule=meta`` commits one position per span and step);
        ``None``: the task marks none. :meth:`adaptive_decoding.framework.engine.context.DecodeContext.for_batch` reads it."""
        return None

    def score(self, example: Example, output_text: str) -> float:
        """1.0 if ``output_text`` (decoded up to the first EOS) is exactly the answer, else 0.0."""
        return float(fold_whitespace(output_text) == example.answer)

    def stop_strings(self, example: Example) -> list[str]:
        """The strings at which an output ends for scoring (lm-eval's ``until``); none by default.
        Tokens per forward counts an answer's positions up to the first of them."""
        return []

    def completable(self, example: Example, tokens: Sequence[int], committed: Sequence[bool]) -> Optional[bool]:
        """Whether a partly decided answer can still end correct: some output that :meth:`score` gives
        1.0 agrees with ``tokens[i]`` wherever ``committed[i]`` (positions of the generation). The
        verifier of a *set* of commitments, for labels and bounds only, since it reads the answer.
        Default, for exact-match tasks: the committed tokens up to the answer's first ``[EOS]`` equal
        :meth:`target_ids` (what follows the first ``[EOS]`` is not read). ``None``: cannot tell."""
        if type(self).score is not Task.score:
            return None
        target = self.target_ids(example)
        end = len(self.tokenizer.encode(example.answer))
        return all(int(tokens[i]) == target[i] for i in range(min(end + 1, len(target))) if committed[i])

    def score_ids(self, example: Example, generated_ids: Any) -> float:
        """:meth:`score` of generated token ids (decoded up to the first EOS)."""
        return self.score(example, self.tokenizer.decode(generated_ids, stop_at_eos=True))

    def designed_answers(self, example: Example) -> tuple[str, str]:
        """An output :meth:`score` must give 1.0 and one it must give 0.0 (for the conformance
        suite, :mod:`adaptive_decoding.framework.testing.task_conformance`). Default: the exact answer, and the answer
        with its first token replaced by the next vocabulary token of the same kind (digit by digit,
        word by word, symbol by symbol). A task whose scorer is not exact match overrides it."""
        tok = self.tokenizer
        ids = tok.encode(example.answer)
        if self.vocabulary is None or not ids:  # a tokenizer of its own: the answer twice is not the answer
            return example.answer, f"{example.answer} {example.answer}" if example.answer else "0"
        kind = _token_kind(tok.vocab[ids[0]])
        same = [i for i in range(3, tok.vocab_size) if _token_kind(tok.vocab[i]) == kind]
        ids[0] = same[(same.index(ids[0]) + 1) % len(same)]
        return example.answer, tok.decode(ids, stop_at_eos=False)


def _token_kind(token: str) -> str:
    return "digit" if token.isdigit() else "word" if token.isalpha() else "symbol"


def fold_whitespace(text: str) -> str:
    return " ".join(text.split())


#: the modules whose decorators register the built-in tasks (imported on first lookup): every
#: module of the package but the contract, found by scanning it
#: (:func:`adaptive_decoding.framework.core.registry.package_modules`), so a new task file registers itself without
#: being listed anywhere
BUILTIN_TASK_MODULES = tuple(f"adaptive_decoding.framework.tasks.{m}" for m in package_modules("adaptive_decoding.framework.tasks", skip=("base",)))

TASKS: Registry[Task] = Registry("task", base=Task, entry_point_group="adaptive_decoding.tasks",
                                 builtin_modules=BUILTIN_TASK_MODULES)


def get_task(name: str, **params: Any) -> Task:
    """A validated task instance by registered name (unknown names list the known ones)."""
    return TASKS.get(name).build(**params)  # type: ignore[return-value]


def recipe_for(task_name: str) -> Recipe:
    """The default training recipe of a registered task (:meth:`Task.training_recipe`); an unknown
    name gets the :class:`Recipe` defaults."""
    if task_name not in TASKS:
        return Recipe()
    return TASKS.get(task_name).training_recipe()


def builtin_model_variants() -> list[tuple[str, ModelVariant]]:
    """``(task name, variant)`` of every :attr:`Task.model_variants` a registered task declares."""
    return [(name, v) for name in TASKS.names() for v in vars(TASKS.get(name)).get("model_variants", ())]


def builtin_models() -> list[tuple[str, str, str]]:
    """``(model name, task name, description)`` of every registered task that declares a
    :attr:`Task.model_name` on its own class."""
    out = []
    for name in TASKS.names():
        cls = TASKS.get(name)
        model = vars(cls).get("model_name")
        if model:
            out.append((model, name, vars(cls).get("model_description", "")))
    return out
