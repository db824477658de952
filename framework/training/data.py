"""Lightning data for the built-in tasks: prompt + answer slot as fixed-length tensors.

One row has the layout the decoding loop uses (:func:`adaptive_decoding.framework.engine.loop.layout`)::

    [prompt (n tokens) | answer + [EOS] padding (G tokens) | [PAD] ... up to task.canvas_length]

so the denoiser sees at training time exactly the canvas it will decode. A batch is a dict:

* ``input_ids`` long ``[B, L]``, the clean sequence x_0;
* ``attention_mask`` long ``[B, L]``, 0 on trailing padding;
* ``prompt_mask`` bool ``[B, L]``, the prompt (never masked by the forward process);
* ``answer_mask`` bool ``[B, L]``, the G answer positions (the only ones the loss sees);
* ``prompt_length`` long ``[B]``;
* ``examples`` the :class:`adaptive_decoding.framework.tasks.Example` objects (an :class:`ExampleBatch`, for scoring).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Optional, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from adaptive_decoding.framework.tasks.base import Example, Task


def encode_example(task: Task, example: Example, length: Optional[int] = None) -> dict[str, torch.Tensor]:
    """Tensors of one example, right-padded with ``[PAD]`` to ``length`` (default ``task.canvas_length``)."""
    tok = task.tokenizer
    prompt = task.prompt_ids(example)
    target = task.target_ids(example)
    length = length or task.canvas_length
    n, g = len(prompt), len(target)
    if n + g > length:
        raise ValueError(f"example {example.id} needs {n + g} tokens, more than length={length}")
    ids = torch.full((length,), tok.pad_token_id, dtype=torch.long)
    ids[:n] = torch.as_tensor(prompt, dtype=torch.long)
    ids[n : n + g] = torch.as_tensor(target, dtype=torch.long)
    pos = torch.arange(length)
    return {
        "input_ids": ids,
        "attention_mask": (pos < n + g).long(),
        "prompt_mask": pos < n,
        "answer_mask": (pos >= n) & (pos < n + g),
        "prompt_length": torch.tensor(n, dtype=torch.long),
    }


class ExampleBatch:
    """The examples of a batch, opaque to Lightning's device transfer (which would try to copy them)."""

    def __init__(self, examples: Sequence[Example]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, i: Any) -> Any:
        return self.examples[i]


def collate(task: Task, examples: Sequence[Example]) -> dict[str, Any]:
    """Stack encoded examples into one batch (see the module docstring)."""
    rows = [encode_example(task, ex) for ex in examples]
    batch: dict[str, Any] = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    batch["examples"] = ExampleBatch(examples)
    return batch


class _ExampleList(Dataset):
    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]


class _ExampleStream(IterableDataset):
    """Endless seeded stream of training examples; each DDP rank / worker gets its own seed."""

    def __init__(self, task: Task, seed: int) -> None:
        self.task = task
        self.seed = seed

    def __iter__(self) -> Iterator[Example]:
        rank = torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        return self.task.iter_examples("train", seed=self.seed * 1_000_003 + rank * 101 + worker)


class _Cycle(IterableDataset):
    """A fixed training set, reshuffled every pass, endlessly (so steps, not epochs, count)."""

    def __init__(self, examples: list[Example], seed: int) -> None:
        self.examples = examples
        self.seed = seed

    def __iter__(self) -> Iterator[Example]:
        g = torch.Generator().manual_seed(self.seed)
        for _ in itertools.count():
            for i in torch.randperm(len(self.examples), generator=g).tolist():
                yield self.examples[i]


class TaskDataModule(pl.LightningDataModule):
    """Training stream and validation set of one task.

    Args:
        task: a :class:`adaptive_decoding.framework.tasks.Task`.
        batch_size: rows per training batch.
        train_size: ``None`` = an endless stream of fresh problems (the default: never the same
            problem twice, for tasks with a large problem space); an int = that many distinct
            training problems, cycled (for tasks whose generation is slow, or data-limited runs).
        val_size: validation problems (exact-match is measured on them).
        val_batch_size: rows per validation batch (default ``batch_size``).
        seed: seed of the data streams.
    """

    def __init__(
        self,
        task: Task,
        batch_size: int = 256,
        train_size: Optional[int] = None,
        val_size: int = 256,
        val_batch_size: Optional[int] = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.task = task
        self.batch_size = batch_size
        self.train_size = train_size
        self.val_size = val_size
        self.val_batch_size = val_batch_size
        self.seed = seed
        self.val_examples: list[Example] = []
        self.train_examples: Optional[list[Example]] = None

    def setup(self, stage: Optional[str] = None) -> None:
        if not self.val_examples and self.val_size:
            self.val_examples = self.task.examples("validation", self.val_size, seed=self.seed)
        if self.train_size is not None and self.train_examples is None:
            self.train_examples = self.task.examples("train", self.train_size, seed=self.seed)

    def _collate(self, examples: Sequence[Example]) -> dict[str, Any]:
        return collate(self.task, examples)

    def train_dataloader(self) -> DataLoader:
        if self.train_size is None:
            data: IterableDataset = _ExampleStream(self.task, self.seed)
        else:
            self.setup()
            data = _Cycle(self.train_examples or [], self.seed)
        return DataLoader(data, batch_size=self.batch_size, collate_fn=self._collate, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(
            _ExampleList(self.val_examples), batch_size=self.val_batch_size or self.batch_size,
            shuffle=False, collate_fn=self._collate, num_workers=0,
        )
