"""Structured attention for the tiny denoisers: which canvas positions may attend to which.

A task with a known structure can ask for it (``Task.attention_structure``); the denoiser keeps it
in its config (``TinyConfig.structure``) and applies it as a boolean mask on top of the padding
mask, by canvas position, so it holds with and without the KV cache. Measured here (see
docs/benchmark.md): a 9×9 Sudoku denoiser trained in minutes on CPU stays at chance with full
attention and learns with attention restricted to a cell's row, column and box.

Kinds:

* ``{"kind": "sudoku", "size": 9, "offsets": [o1, o2, ...]}``: ``size²`` cells lie row-major at
  positions ``o + cell`` for each offset (the puzzle in the prompt, the grid in the answer). A cell
  position attends to the positions of the cells that share its row, column or box, itself and
  its copies included; every other position (separators, ``[EOS]``, padding) attends everywhere
  and is attended by everyone.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import torch

KINDS: tuple[str, ...] = ("sudoku",)


@lru_cache(maxsize=8)
def sudoku_peers(size: int) -> torch.Tensor:
    """``[C, C]`` bool: cells ``i`` and ``j`` of a ``size``×``size`` Sudoku, row-major, share a row, a
    column or a box (``C = size²``; each cell is its own peer); ``ValueError`` for a side that is not
    a square number."""
    box = math.isqrt(size)
    if box * box != size:
        raise ValueError(f"sudoku structure: size={size} is not a square number (allowed: 4, 9, 16, ...)")
    idx = torch.arange(size * size)
    r, c = idx // size, idx % size
    b = (r // box) * box + c // box
    return (r[:, None] == r[None]) | (c[:, None] == c[None]) | (b[:, None] == b[None])


def generation_structure(structure: Optional[dict], prompt_length: int) -> Optional[dict]:
    """The part of a canvas ``structure`` that lies in the generation: ``{"kind", "size", "offset"}``
    with ``offset`` the generation position of cell 0 (the first grid of ``offsets`` at or after a
    prompt of ``prompt_length`` tokens), or ``None`` when there is no structure or no grid there."""
    if not structure:
        return None
    starts = [o - prompt_length for o in structure.get("offsets", [0]) if o >= prompt_length]
    if not starts:
        return None
    return {"kind": structure.get("kind"), "size": int(structure.get("size", 9)), "offset": min(starts)}


def task_generation_structure(task: object) -> Optional[dict]:
    """:func:`generation_structure` of a task's declared ``attention_structure`` after its prompt
    (``max_prompt_length`` tokens); ``None`` for a task that declares none."""
    structure = getattr(task, "attention_structure", None)
    if not structure:
        return None
    return generation_structure(structure, int(getattr(task, "max_prompt_length", 0) or 0))


def generation_peers(structure: Optional[dict], gen_length: int) -> Optional[torch.Tensor]:
    """``[G, G]`` bool over generation positions: True where two cells of ``structure`` (a
    :func:`generation_structure`) constrain each other, never on the diagonal; positions off the grid
    have no peers. ``None`` for no structure; ``ValueError`` naming the field for a bad one."""
    if not structure:
        return None
    return _generation_peers(str(structure.get("kind")), int(structure.get("size", 9)),
                             int(structure.get("offset", 0)), int(gen_length))


@lru_cache(maxsize=16)
def _generation_peers(kind: str, size: int, offset: int, gen_length: int) -> torch.Tensor:
    if kind not in KINDS:
        raise ValueError(f"structure kind={kind!r} is unknown; allowed: {', '.join(KINDS)}")
    cells = sudoku_peers(size) & ~torch.eye(size * size, dtype=torch.bool)
    n = size * size
    if offset < 0 or offset + n > gen_length:
        raise ValueError(f"structure offset={offset} puts {n} cells beyond the generation of {gen_length}")
    peers = torch.zeros(gen_length, gen_length, dtype=torch.bool)
    peers[offset:offset + n, offset:offset + n] = cells
    return peers


def window_peers(peers: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``[B, W, W]`` bool: ``peers`` (``[G, G]``, over generation positions) looked up by the window
    slots' generation ``position`` ``[B, W]``; a slot outside ``peers``' range has no peers."""
    g = peers.shape[0]
    inside = (position >= 0) & (position < g)
    p = position.clamp(0, g - 1)
    return peers.to(position.device)[p[:, :, None], p[:, None, :]] & inside[:, :, None] & inside[:, None, :]


def structure_mask(structure: Optional[dict], length: int) -> Optional[torch.Tensor]:
    """``[length, length]`` bool (True = may attend) for ``structure``, or ``None`` for full attention.

    Raises ``ValueError`` naming the field for an unknown kind or cells beyond ``length``.
    """
    if not structure:
        return None
    kind = structure.get("kind")
    if kind not in KINDS:
        raise ValueError(f"attention structure kind={kind!r} is unknown; allowed: {', '.join(KINDS)}")
    size = int(structure.get("size", 9))
    cells = sudoku_peers(size)
    n = size * size
    cell_of = torch.full((length,), -1, dtype=torch.long)
    for off in structure.get("offsets", [0]):
        if off < 0 or off + n > length:
            raise ValueError(f"attention structure offset {off} puts {n} cells beyond the context of {length}")
        cell_of[off : off + n] = torch.arange(n)
    free = cell_of < 0
    ci = cell_of.clamp(min=0)
    allowed = cells[ci[:, None], ci[None, :]]
    return allowed | free[:, None] | free[None, :]
