"""Counter-based random numbers that are per sample, so results do not depend on batching.

A ``torch.Generator`` shared by a batch makes sample ``b``'s noise depend on how many rows came
before it, so a batch of N would not equal N single runs, and a resumed job would not equal an
uninterrupted one. Instead every random draw here is a pure function of
``(sample seed, step, salt, element index)`` through the SplitMix64 finaliser, computed as int64
tensor arithmetic (wrapping multiplication, masked logical shifts).
"""

from __future__ import annotations

import hashlib

import torch

_M64 = (1 << 64) - 1


def _signed(x: int) -> int:
    x &= _M64
    return x - (1 << 64) if x >= (1 << 63) else x


_C1 = _signed(0xBF58476D1CE4E5B9)
_C2 = _signed(0x94D049BB133111EB)
#: SplitMix64's increment (2^64 / golden ratio) as a signed int64: spreads consecutive counters apart.
GOLDEN_GAMMA = _signed(0x9E3779B97F4A7C15)


def shift_right_logical(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 tensors."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser on an int64 tensor (a bijection on 64-bit words)."""
    x = x ^ shift_right_logical(x, 30)
    x = x * _C1
    x = x ^ shift_right_logical(x, 27)
    x = x * _C2
    return x ^ shift_right_logical(x, 31)


def stable_seed(*parts: object) -> int:
    """A 63-bit seed derived from any printable parts (e.g. global seed and an item id)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def uniform(
    seeds: torch.Tensor, step: int | torch.Tensor, salt: int, shape: tuple[int, ...],
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniform(0, 1) floats of shape ``[B, *shape]``, row ``b`` a function of ``seeds[b]`` only.

    Args:
        seeds: int64 tensor [B], one seed per sample.
        step: decoding step (int, or int64 tensor [B] for per-sample step counters).
        salt: distinguishes independent streams in one step (Gumbel noise, random remasking, ...).
        shape: trailing shape, e.g. ``(L,)`` or ``(L, V)``.
    """
    device = device if device is not None else seeds.device
    seeds = seeds.to(device=device, dtype=torch.int64)
    b = seeds.shape[0]
    n = 1
    for s in shape:
        n *= s
    step_t = torch.as_tensor(step, dtype=torch.int64, device=device).expand(b)
    key = mix64(mix64(seeds ^ (step_t * GOLDEN_GAMMA)) + _signed(int(salt) * 0x94D049BB133111EB))  # [B]
    idx = torch.arange(n, dtype=torch.int64, device=device)
    bits = mix64(key[:, None] + (idx[None, :] + 1) * GOLDEN_GAMMA)
    mant = shift_right_logical(bits, 11).to(torch.float64) * (1.0 / (1 << 53))
    out = mant.clamp_(1e-12, 1.0 - 1e-12).to(torch.float32)
    return out.view(b, *shape)


def gumbel(seeds: torch.Tensor, step: int | torch.Tensor, salt: int, shape: tuple[int, ...],
           device: torch.device | str | None = None) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log U)`` with :func:`uniform`'s per-sample guarantee."""
    u = uniform(seeds, step, salt, shape, device).to(torch.float64)
    return (-torch.log(-torch.log(u))).to(torch.float32)


def uniform_at(
    seeds: torch.Tensor, step: int | torch.Tensor, salt: int, index: torch.Tensor,
) -> torch.Tensor:
    """Uniform(0, 1) float64 at explicit element indices ``index`` ``[B, N]`` (int64, e.g. positions
    in the generation), row ``b`` a function of ``(seeds[b], step[b], salt, index[b, n])`` only.

    :func:`uniform` numbers elements by their place in the requested shape; this keys them by a
    caller's index instead, so the draw at a generation position does not depend on which window
    or layout it was requested in.
    """
    device = index.device
    seeds = seeds.to(device=device, dtype=torch.int64)
    b = seeds.shape[0]
    step_t = torch.as_tensor(step, dtype=torch.int64, device=device).expand(b)
    key = mix64(mix64(seeds ^ (step_t * GOLDEN_GAMMA)) + _signed(int(salt) * 0x94D049BB133111EB))  # [B]
    bits = mix64(key[:, None] + (index.to(torch.int64) + 1) * GOLDEN_GAMMA)
    return (shift_right_logical(bits, 11).to(torch.float64) * (1.0 / (1 << 53))).clamp_(1e-12, 1.0 - 1e-12)


def gumbel_at(seeds: torch.Tensor, step: int | torch.Tensor, salt: int, index: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise at explicit indices, with :func:`uniform_at`'s guarantee (float32)."""
    return (-torch.log(-torch.log(uniform_at(seeds, step, salt, index)))).to(torch.float32)
