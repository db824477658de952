"""Word-and-character vocabularies of the tasks, and their tokenizer.

A task declares its vocabulary on its class (``Task.vocabulary``); a saved model stores the
vocabulary it was trained with, so a new task or a new word never changes the ids of another model.
The built-in tasks (addition, sorting, sudoku, pairs) share :data:`VOCAB` (``task-vocab-v1``), which
is also the vocabulary of a saved folder that predates stored vocabularies (:data:`LEGACY_VOCAB`):

* specials ``[PAD]`` (0), ``[MASK]`` (1), ``[EOS]`` (2);
* digits ``0``–``9`` and the symbols ``+ = , : | . - > ? ( )``, one token per character;
* whole words (the task keywords and the words of the paired-phrase task, e.g. ``New``, ``York``).

Text conventions (:meth:`TaskTokenizer.encode` / :meth:`TaskTokenizer.decode`):

* whitespace separates tokens and is otherwise ignored; a run of letters is one word, which must
  be in the vocabulary;
* ``_`` is the mask token (shown as ``_`` when decoding, so a half-decoded canvas reads
  ``"12+34=_6"``); ``[MASK]``, ``[EOS]`` and ``[PAD]`` may also be written literally;
* decoding joins tokens without spaces except between two words (``"New York,Hong Kong"``), so
  ``encode(decode(ids, stop_at_eos=False)) == ids`` for every id list;
* ``decode(..., stop_at_eos=True)`` stops at the first ``[EOS]``; ``[PAD]`` is written ``[PAD]``.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import torch

SPECIALS: tuple[str, ...] = ("[PAD]", "[MASK]", "[EOS]")
DIGITS: tuple[str, ...] = tuple("0123456789")
SYMBOLS: tuple[str, ...] = tuple("+=,:|.->?()")
MASK_CHAR = "_"

#: Task keywords (prompts) and the words of the paired-phrase task.
WORDS: tuple[str, ...] = (
    "sort", "usa", "asia", "west", "south", "world", "coast",
    "New", "York", "San", "Francisco", "Los", "Angeles",
    "Hong", "Kong", "Delhi", "Kuala", "Lumpur",
    "Diego", "Las", "Vegas", "Santa", "Fe",
    "Orleans", "Antonio", "El", "Paso",
    "Buenos", "Aires", "Tel", "Aviv", "Cape", "Town",
    "Jose", "Cruz", "Long", "Beach",
)

VOCAB: tuple[str, ...] = SPECIALS + DIGITS + SYMBOLS + WORDS
#: the vocabulary a saved folder without a ``vocab`` entry was trained with (frozen: never edit)
LEGACY_VOCAB: tuple[str, ...] = VOCAB


def make_vocabulary(words: Sequence[str] = (), symbols: Sequence[str] = SYMBOLS) -> tuple[str, ...]:
    """A task vocabulary: the specials (ids 0, 1, 2), the digits, ``symbols`` (one character each)
    and ``words`` (runs of ASCII letters). Fails on a duplicate or a malformed token."""
    vocab = SPECIALS + DIGITS + tuple(symbols) + tuple(words)
    check_vocabulary(vocab)
    return vocab


def check_vocabulary(vocab: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``vocab`` starts with the specials and every other token is one
    non-letter character (not ``_``, ``[``, ``]`` or whitespace) or a run of ASCII letters, each once."""
    if tuple(vocab[:3]) != SPECIALS:
        raise ValueError(f"a vocabulary must start with {', '.join(SPECIALS)}; got {list(vocab[:3])}")
    seen: set[str] = set()
    for tok in vocab[3:]:
        if not isinstance(tok, str) or not tok:
            raise ValueError(f"vocabulary token {tok!r} must be a non-empty string")
        word = tok.isascii() and tok.isalpha()
        char = len(tok) == 1 and not tok.isalpha() and not tok.isspace() and tok not in "_[]"
        if not (word or char):
            raise ValueError(f"vocabulary token {tok!r} is neither a word of ASCII letters nor one "
                             f"character other than a letter, whitespace, '_', '[' or ']'")
        if tok in seen:
            raise ValueError(f"vocabulary token {tok!r} appears twice")
        seen.add(tok)


class TaskTokenizer:
    """Tokenizer of a task vocabulary (follows :class:`adaptive_decoding.framework.models.protocol.Tokenizer`).

    Args:
        vocab: every token string, index = id (default :data:`VOCAB`, the built-in tasks' one);
            checked by :func:`check_vocabulary`.

    Attributes:
        vocab: every token string, index = id.
        pad_token_id, mask_token_id, eos_token_id: ids of ``[PAD]``, ``[MASK]``, ``[EOS]``.
        vocab_size: ``len(vocab)``.
    """

    name = "task-vocab-v1"

    def __init__(self, vocab: Sequence[str] = VOCAB) -> None:
        check_vocabulary(vocab)
        self.vocab: tuple[str, ...] = tuple(vocab)
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}
        self.words: tuple[str, ...] = tuple(t for t in self.vocab[3:] if t.isalpha())
        self.symbols: str = "".join(t for t in self.vocab[3:] if not t.isalpha() and not t.isdigit())
        self.pad_token_id: int = self._ids["[PAD]"]
        self.mask_token_id: int = self._ids["[MASK]"]
        self.eos_token_id: int = self._ids["[EOS]"]
        self.vocab_size: int = len(self.vocab)
        if self.vocab != VOCAB:
            self.name = f"task-vocab-{len(self.vocab)}-{_digest(self.vocab)}"

    # ------------------------------------------------------------------ text -> ids
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; an unknown character or word raises ``ValueError`` with its position."""
        if not isinstance(text, str):
            raise TypeError(f"encode() expects a str, got {type(text).__name__}")
        ids: list[int] = []
        i, n = 0, len(text)
        while i < n:
            ch = text[i]
            if ch.isspace():
                i += 1
            elif ch == MASK_CHAR:
                ids.append(self.mask_token_id)
                i += 1
            elif ch == "[":
                end = text.find("]", i)
                special = text[i : end + 1] if end >= 0 else ""
                if special not in SPECIALS:
                    raise ValueError(
                        f"unknown special token {text[i:end + 1] if end >= 0 else '['!r} at position {i} "
                        f"of {text!r}; allowed: {', '.join(SPECIALS)}"
                    )
                ids.append(self._ids[special])
                i = end + 1
            elif ch.isascii() and ch.isalpha():
                j = i
                while j < n and text[j].isascii() and text[j].isalpha():
                    j += 1
                word = text[i:j]
                if word not in self._ids:
                    raise ValueError(
                        f"unknown word {word!r} at position {i} of {text!r}; known words: {', '.join(self.words)}"
                    )
                ids.append(self._ids[word])
                i = j
            elif ch in self._ids:
                ids.append(self._ids[ch])
                i += 1
            else:
                raise ValueError(
                    f"unknown character {ch!r} at position {i} of {text!r}; allowed: digits, "
                    f"the symbols {self.symbols}, '_' (mask), whitespace and the words {', '.join(self.words)}"
                )
        return ids

    # ------------------------------------------------------------------ ids -> text
    def decode(self, ids: "Sequence[int] | torch.Tensor", stop_at_eos: bool = True) -> str:
        """Text of ``ids``; stops at the first ``[EOS]`` when ``stop_at_eos``; mask shows as ``_``."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        parts: list[str] = []
        prev_word = False
        for raw in ids:
            i = int(raw)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i == self.eos_token_id and stop_at_eos:
                break
            tok = MASK_CHAR if i == self.mask_token_id else self.vocab[i]
            is_word = tok.isalpha()
            if is_word and prev_word:
                parts.append(" ")
            parts.append(tok)
            prev_word = is_word
        return "".join(parts)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"TaskTokenizer(vocab_size={self.vocab_size})"


def _digest(vocab: Sequence[str]) -> str:
    return hashlib.sha256("\x00".join(vocab).encode()).hexdigest()[:8]


_TOKENIZERS: dict[tuple[str, ...], TaskTokenizer] = {}


def tokenizer_for(vocab: Sequence[str]) -> TaskTokenizer:
    """The one :class:`TaskTokenizer` of ``vocab`` (memoised, so a task and a model trained on it share it)."""
    key = tuple(vocab)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = TaskTokenizer(key)
    return _TOKENIZERS[key]


def get_tokenizer() -> TaskTokenizer:
    """The :class:`TaskTokenizer` of :data:`VOCAB`, the built-in tasks' shared vocabulary."""
    return tokenizer_for(VOCAB)
