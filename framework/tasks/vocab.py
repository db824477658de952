"""The shared vocabulary of the built-in tasks (addition, sorting, sudoku, pairs).

One small vocabulary serves every task, so every tiny denoiser has the same ids:

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

from typing import Iterable, Optional, Sequence

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


class TaskTokenizer:
    """Tokenizer of the built-in tasks (follows :class:`framework.models.protocol.Tokenizer`).

    Attributes:
        vocab: every token string, index = id.
        pad_token_id, mask_token_id, eos_token_id: ids of ``[PAD]``, ``[MASK]``, ``[EOS]``.
        vocab_size: ``len(vocab)``.
    """

    name = "task-vocab-v1"

    def __init__(self) -> None:
        self.vocab: tuple[str, ...] = VOCAB
        self._ids = {tok: i for i, tok in enumerate(VOCAB)}
        self.pad_token_id: int = self._ids["[PAD]"]
        self.mask_token_id: int = self._ids["[MASK]"]
        self.eos_token_id: int = self._ids["[EOS]"]
        self.vocab_size: int = len(VOCAB)

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
                        f"unknown word {word!r} at position {i} of {text!r}; known words: {', '.join(WORDS)}"
                    )
                ids.append(self._ids[word])
                i = j
            elif ch in self._ids:
                ids.append(self._ids[ch])
                i += 1
            else:
                raise ValueError(
                    f"unknown character {ch!r} at position {i} of {text!r}; allowed: digits, "
                    f"the symbols {''.join(SYMBOLS)}, '_' (mask), whitespace and the words {', '.join(WORDS)}"
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


_SHARED: Optional[TaskTokenizer] = None


def get_tokenizer() -> TaskTokenizer:
    """The shared :class:`TaskTokenizer` instance."""
    global _SHARED
    if _SHARED is None:
        _SHARED = TaskTokenizer()
    return _SHARED
