"""Real English text: a corpus that ships with installed packages, a word tokenizer, the ``text`` task.

Corpus (no download, no new dependency; see docs/text.md for the choice):

* ``python-docs``: the prose paragraphs of ``pydoc_data.topics``, the Python Language Reference
  and library topics that every CPython ships for ``help()`` (about 30 000 words);
* ``sklearn-descr``: the dataset descriptions that scikit-learn ships in
  ``sklearn/datasets/descr/*.rst`` (a few thousand words of scientific prose).

Only running prose is kept: a paragraph must start at column 0, be at least 12 words long and be
at least 90 % letters and spaces (code blocks, grammar rules and tables are dropped); it is then
lower-cased and reduced to :data:`CHARS`. The split of a paragraph (80 % train, 10 % validation,
10 % test) is a hash of its text, so windows of one paragraph never straddle two splits.

Tokens are characters (as text8 in MDLM and SEDD): the corpus is small (about 170 000 characters
of training text), and characters give a tiny model dense statistics where words would not.

The ``text`` task: a window of a paragraph that starts at a word; the prompt is its first
``prompt_length`` characters, the answer the next ``gen_length`` (fewer at the end of a paragraph,
then ``[EOS]``). Free text has no single right continuation, so the task's own score is ``1 − r₂``
with r₂ the fraction of repeated word bigrams of the continuation (a degenerate "is is is" scores
0); experiments judge it by the generative perplexity and the repetition metrics of
:mod:`adaptive_decoding.experiments.metrics`. Decoding is semi-autoregressive by default (blocks of 8 characters).

The tiny denoiser (``tiny-text``) is trained by :func:`adaptive_decoding.framework.training.train_denoiser`, the same
Lightning module as the task models, and loaded by :func:`load_text_model`.
"""

from __future__ import annotations

import hashlib
import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.tasks.base import TASKS, Example, Task

SOURCES: tuple[str, ...] = ("python-docs", "sklearn-descr")
SPECIALS: tuple[str, ...] = ("[PAD]", "[MASK]", "[EOS]", "[UNK]")
#: the characters of the vocabulary (text is lower-cased; quotation marks and other symbols are
#: dropped: the Python docs quote every keyword, which an undertrained model would otherwise repeat)
CHARS: str = " abcdefghijklmnopqrstuvwxyz0123456789.,;:()!?'-"
_SPECIAL_RE = re.compile(r"\[(?:PAD|MASK|EOS|UNK)\]")
TEXT_MODEL = "tiny-text"


def normalise(text: str) -> str:
    """Lower-case, keep :data:`CHARS` only, collapse whitespace (the corpus's canonical form)."""
    kept = " ".join("".join(c if c in CHARS else " " for c in text.lower()).split())
    return re.sub(r"\( ", "(", re.sub(r" ([.,;:)!?])", r"\1", kept))


# ====================================================================== corpus
def _prose(paragraphs: Sequence[str]) -> list[str]:
    out = []
    for p in paragraphs:
        if not p or p[0].isspace() or re.search(r"^[*=\-~^#`]{3,}\s*$", p, re.M) or p.lstrip().startswith(".."):
            continue
        p = " ".join(p.split())
        if len(p.split()) < 12 or sum(c.isalpha() or c == " " for c in p) / len(p) < 0.9:
            continue
        out.append(p)
    return out


def _python_docs() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # pragma: no cover - every CPython ships it, some distros split it off
        raise RuntimeError("corpus source 'python-docs' needs the standard library's pydoc_data "
                           "(Debian: apt-get install libpython3-stdlib)") from exc
    return _prose([p for key in sorted(topics) for p in re.split(r"\n\s*\n", topics[key])])


def _sklearn_descr() -> list[str]:
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # locate the files without importing scikit-learn
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover
        raise RuntimeError("corpus source 'sklearn-descr' needs scikit-learn")
    folder = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "descr"
    paras: list[str] = []
    for f in sorted(folder.glob("*.rst")):
        paras += re.split(r"\n\s*\n", f.read_text(encoding="utf-8"))
    return _prose(paras)


@lru_cache(maxsize=None)
def load_corpus(sources: tuple[str, ...] = SOURCES) -> tuple[str, ...]:
    """Prose paragraphs of the installed sources (see the module docstring), in a fixed order."""
    loaders = {"python-docs": _python_docs, "sklearn-descr": _sklearn_descr}
    out: list[str] = []
    for s in sources:
        if s not in loaders:
            raise ValueError(f"unknown corpus source {s!r}; allowed: {', '.join(SOURCES)}")
        out += loaders[s]()
    seen: set[str] = set()
    out = [normalise(p) for p in out]
    return tuple(p for p in out if not (p in seen or seen.add(p)))


def split_of_paragraph(paragraph: str) -> str:
    """train / validation / test by a hash of the paragraph (80 / 10 / 10)."""
    bucket = int.from_bytes(hashlib.sha256(paragraph.encode()).digest()[:4], "big") % 10
    return "train" if bucket < 8 else ("validation" if bucket == 8 else "test")


def words(text: str) -> list[str]:
    """The words of ``text`` (its normalised form split at spaces; punctuation stays on its word)."""
    return normalise(text).split()


def corpus_fingerprint(sources: tuple[str, ...] = SOURCES) -> str:
    """A short hash of the corpus text and the tokenizer's pattern (the text changes with the Python and
    scikit-learn versions)."""
    return hashlib.sha256((CHARS + "\n" + "\n".join(load_corpus(sources))).encode()).hexdigest()[:16]


# ====================================================================== tokenizer
class TextTokenizer:
    """Character-level tokenizer of the corpus (follows :class:`adaptive_decoding.framework.models.protocol.Tokenizer`).

    Character level, as text8 in MDLM / SEDD: a corpus of a few hundred thousand characters gives
    a tiny model dense statistics, where a word vocabulary would leave most words seen a handful of
    times. Vocabulary: ``[PAD] [MASK] [EOS] [UNK]`` then :data:`CHARS`. ``encode`` normalises the
    text first (:func:`normalise`), reads ``_`` as the mask and ``[EOS]``-style names as their
    specials; ``encode(decode(ids)) == ids`` for every id list.
    """

    name = "text-chars-v1"

    def __init__(self) -> None:
        self.vocab: tuple[str, ...] = SPECIALS + tuple(CHARS)
        self._ids = {t: i for i, t in enumerate(self.vocab)}
        self.pad_token_id, self.mask_token_id, self.eos_token_id, self.unk_token_id = 0, 1, 2, 3
        self.vocab_size = len(self.vocab)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode() expects a str, got {type(text).__name__}")
        ids: list[int] = []
        pos = 0
        for m in _SPECIAL_RE.finditer(text):
            ids += self._chars(text[pos : m.start()])
            ids.append(self._ids[m.group()])
            pos = m.end()
        return ids + self._chars(text[pos:])

    def _chars(self, text: str) -> list[int]:
        out = []
        for part in text.split("_"):
            out += [self._ids[c] for c in _keep_spaces(part)]
            out.append(self.mask_token_id)
        return out[:-1]

    def decode(self, ids: "Sequence[int] | torch.Tensor", stop_at_eos: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        out: list[str] = []
        for raw in ids:
            i = int(raw)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i == self.eos_token_id and stop_at_eos:
                break
            out.append("_" if i == self.mask_token_id else self.vocab[i])
        return "".join(out)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"TextTokenizer(vocab_size={self.vocab_size})"


def _keep_spaces(text: str) -> str:
    """Like :func:`normalise` but keeps single leading / trailing spaces (a prompt may end with one)."""
    kept = "".join(c if c in CHARS else " " for c in text.lower())
    return re.sub(r" {2,}", " ", kept)


@lru_cache(maxsize=None)
def get_text_tokenizer() -> TextTokenizer:
    return TextTokenizer()


def repeated_ngram_rate(tokens: Sequence[Any], n: int = 2) -> float:
    """Fraction of the n-grams of ``tokens`` that repeat an earlier n-gram (0 for < n tokens)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


# ====================================================================== the task
class TextTask(Task):
    """Continue a passage of real English prose (Python and scikit-learn docs), character level."""

    metric = "1 − repeated word-bigram rate (judge with gen_perplexity, repetition)"
    params = {
        "prompt_length": Param(int, low=1, high=256, doc="characters of the passage shown as the prompt"),
        "gen_length": Param(int, low=2, high=256, doc="characters to generate (the answer slot G)"),
    }

    def __init__(self, prompt_length: int = 32, gen_length: int = 32) -> None:
        self.prompt_length = prompt_length
        self.gen_length = gen_length  # type: ignore[misc]  (a parameter here, a property in Task)

    # Task declares gen_length a property; here it is a plain validated parameter
    gen_length = None  # type: ignore[assignment]

    @property
    def max_prompt_length(self) -> int:
        return self.prompt_length

    @property
    def default_block_length(self) -> int:
        """Semi-autoregressive blocks of 8 characters (LLaDA's recipe for free text)."""
        return 8 if self.gen_length % 8 == 0 else self.gen_length

    @property
    def tokenizer(self) -> TextTokenizer:  # type: ignore[override]
        return get_text_tokenizer()

    def iter_examples(self, split: str, seed: int = 0) -> Iterator[Example]:
        """Endless windows ``(prompt, continuation)`` starting at a word, deterministic in ``seed``."""
        self._check_split(split)
        self.validate()
        P, G = self.prompt_length, self.gen_length
        paras = [p for p in _split_paragraphs(split) if len(p) > P]
        if not paras:
            raise ValueError(f"text task: no {split} paragraph is longer than prompt_length={P}")
        # a window starts at a word where a full continuation fits (or at 0 in a short paragraph)
        starts = [[i for i in range(max(1, len(p) - P - G + 1)) if i == 0 or p[i - 1] == " "] for p in paras]
        weights = [len(x) for x in starts]
        rng = random.Random(f"text|{sorted(self.get_params().items())}|{split}|{seed}")
        while True:
            j = rng.choices(range(len(paras)), weights=weights)[0]
            start = rng.choice(starts[j])
            text = paras[j]
            yield self._example(text[start : start + P], text[start + P : start + P + G],
                                {"paragraph": j, "start": start, "split": split})

    def _sample(self, rng: random.Random) -> tuple[str, str, dict]:  # pragma: no cover - iter_examples overrides
        raise NotImplementedError("TextTask draws windows in iter_examples")

    def split_of(self, prompt: str) -> str:  # pragma: no cover - splits are by paragraph
        raise NotImplementedError("text splits are by paragraph (split_of_paragraph)")

    def designed_answers(self, example: Example) -> tuple[str, str]:
        """Four distinct words (no repeated bigram: 1.0) and a single word (0.0): the scorer
        measures repetition, not the reference continuation."""
        return "the model reads text", "text"

    def score(self, example: Example, output_text: str) -> float:
        """``1 − r₂`` of the continuation's words; an output of fewer than 2 words scores 0."""
        toks = words(output_text)
        if len(toks) < 2:
            return 0.0
        return 1.0 - repeated_ngram_rate(toks, 2)


@lru_cache(maxsize=None)
def _split_paragraphs(split: str) -> tuple[str, ...]:
    return tuple(p for p in load_corpus() if split_of_paragraph(p) == split)


def _register() -> None:
    if "text" not in TASKS:  # an entry point may already have registered it
        TASKS.add("text", TextTask, aliases=("english",))


_register()


def corpus_stats() -> dict[str, Any]:
    """Paragraphs, characters and words per split, and the vocabulary size (for docs/text.md)."""
    out: dict[str, Any] = {"sources": list(SOURCES), "vocab_size": get_text_tokenizer().vocab_size,
                           "fingerprint": corpus_fingerprint()}
    for split in ("train", "validation", "test"):
        paras = _split_paragraphs(split)
        out[split] = {"paragraphs": len(paras), "characters": sum(len(p) for p in paras),
                      "words": sum(len(p.split()) for p in paras)}
    return out
