"""Toy denoisers with designed answers and confidences, for exact tests of commit decisions.

Importable by third-party plugin authors too: ``adaptive_decoding.framework.testing.conformance`` runs its checks on these.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn


class ToyDenoiser(nn.Module):
    """Predicts a fixed answer with designed confidences, independent of context.

    Vocabulary: ``0..V-1`` with ``mask_token_id = V-1``, ``eos_token_id = V-2``, ``pad = V-3``.
    At generation position ``i`` (counted from each row's first generated position, found as the
    first mask or first non-prompt token of the canvas) the distribution puts ``conf[i]`` on
    ``answer[i]``, ``second[i]`` on ``alt[i]`` (default ``(answer[i] + 1) % (V - 3)``) and spreads
    the rest uniformly over the other ordinary tokens. Prompt positions predict themselves.

    Args:
        answer: the target tokens, length G.
        conf: p(answer[i]) per position, length G.
        second: p(alt[i]) per position (default: the remainder's half).
        prompt_length: where generation starts in every row (rows must share it); ``None`` =
            at each row's first mask token at the first call.
    """

    def __init__(
        self,
        answer: Sequence[int],
        conf: Sequence[float],
        vocab_size: int = 16,
        second: Optional[Sequence[float]] = None,
        alt: Optional[Sequence[int]] = None,
        prompt_length: int = 2,
    ) -> None:
        super().__init__()
        g = len(answer)
        if len(conf) != g:
            raise ValueError("answer and conf must have the same length")
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_id = vocab_size - 2
        self.pad_token_id = vocab_size - 3
        self.prompt_length = prompt_length
        n_ord = vocab_size - 3
        self.register_buffer("answer", torch.as_tensor(answer, dtype=torch.long))
        conf_t = torch.as_tensor(conf, dtype=torch.float64)
        alt_t = torch.as_tensor(alt, dtype=torch.long) if alt is not None else (self.answer + 1) % n_ord
        sec_t = torch.as_tensor(second, dtype=torch.float64) if second is not None else (1 - conf_t) / 2
        probs = torch.zeros(g, vocab_size, dtype=torch.float64)
        others = n_ord - 2
        for i in range(g):
            rest = max(0.0, 1.0 - float(conf_t[i]) - float(sec_t[i]))
            probs[i, :n_ord] = rest / others if others > 0 else 0.0
            probs[i, int(alt_t[i])] = float(sec_t[i])
            probs[i, int(self.answer[i])] = float(conf_t[i])
            if self.answer[i] >= n_ord:  # answer may be EOS
                probs[i, int(self.answer[i])] = float(conf_t[i])
        probs = probs / probs.sum(-1, keepdim=True)
        self.register_buffer("gen_logits", probs.clamp(min=1e-12).log().float())
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        self.calls += 1
        b, seq_len = input_ids.shape
        out = torch.full((b, seq_len, self.vocab_size), -30.0)
        out.scatter_(2, input_ids.unsqueeze(-1), 0.0)  # prompt/committed positions predict themselves
        g = self.answer.numel()
        p = self.prompt_length
        out[:, p : p + g] = self.gen_logits[None, : min(g, seq_len - p)]
        return out


class CouplingDenoiser(nn.Module):
    """Two answers that are only right together ("New York" / "San Francisco").

    Positions 0 and 1 of the generation: while both are masked, each is 50/50 between its two
    options (slightly favouring ``a`` at position 0 and ``b`` at position 1, so that committing
    both at once gives the incoherent pair); once one is committed, the other follows it with
    probability ``follow``.
    """

    def __init__(self, vocab_size: int = 8, prompt_length: int = 1, follow: float = 0.99) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_id = vocab_size - 2
        self.pad_token_id = vocab_size - 3
        self.prompt_length = prompt_length
        self.follow = follow
        # pair A = (0, 1) ("New", "York"), pair B = (2, 3) ("San", "Francisco")
        self.pairs = ((0, 1), (2, 3))

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, seq_len = input_ids.shape
        p = self.prompt_length
        probs = torch.full((b, seq_len, self.vocab_size), 1e-6)
        probs.scatter_(2, input_ids.unsqueeze(-1), 1.0)
        first, second = input_ids[:, p], input_ids[:, p + 1]
        m = self.mask_token_id
        both = (first == m) & (second == m)
        f = self.follow
        row0 = torch.zeros(b, self.vocab_size) + 1e-6
        row1 = torch.zeros(b, self.vocab_size) + 1e-6
        # both masked: position 0 prefers pair A's first, position 1 prefers pair B's second
        row0[:, 0], row0[:, 2] = 0.52, 0.48
        row1[:, 1], row1[:, 3] = 0.48, 0.52
        # one committed: the other follows
        a_first = first == 0
        b_first = first == 2
        row1 = torch.where(a_first[:, None], _onehot(b, self.vocab_size, 1, f, 3), row1)
        row1 = torch.where(b_first[:, None], _onehot(b, self.vocab_size, 3, f, 1), row1)
        a_second = second == 1
        b_second = second == 3
        row0 = torch.where(a_second[:, None], _onehot(b, self.vocab_size, 0, f, 2), row0)
        row0 = torch.where(b_second[:, None], _onehot(b, self.vocab_size, 2, f, 0), row0)
        probs[:, p] = torch.where((first == m)[:, None], row0, probs[:, p])
        probs[:, p + 1] = torch.where((second == m)[:, None], row1, probs[:, p + 1])
        del both
        return (probs / probs.sum(-1, keepdim=True)).log()


def _onehot(b: int, v: int, idx: int, p: float, other: int) -> torch.Tensor:
    row = torch.full((b, v), 1e-6)
    row[:, idx] = p
    row[:, other] = 1 - p
    return row


class ContextToyDenoiser(nn.Module):
    """Answers and confidences that depend on the whole visible context of a row.

    The conformance suite's batch-invariance toy: a different prompt, or a different token
    committed earlier, changes what every masked position predicts and how confident it is, so a
    controller that leaks information across rows (or across decode calls) shows up.

    For row ``b`` let ``key_b = Σ_j mix64((x_bj + 1)·φ + j)`` over the visible (attention mask 1),
    unmasked positions ``j`` (order-free, wrapping int64 arithmetic). A masked position ``i`` puts
    ``p1 = low + (high − low)·u1`` on ``answer = h mod (V−3)`` and ``min(p1, 1 − p1)·u2`` on a
    second token, the rest spread over the other ordinary tokens, where ``h, u1, u2`` are SplitMix64
    hashes of ``(key_b, i, salt)``. Unmasked positions predict themselves. Padding (attention
    mask 0) is ignored, so a row's logits do not depend on how far the batch is padded.

    Vocabulary: ``mask_token_id = V−1``, ``eos_token_id = V−2``, ``pad_token_id = V−3``; EOS is
    never predicted.
    """

    def __init__(self, vocab_size: int = 16, low: float = 0.3, high: float = 0.99, salt: int = 0) -> None:
        super().__init__()
        if vocab_size < 6:
            raise ValueError(f"vocab_size={vocab_size} is too small; allowed: ≥ 6")
        if not 0.0 < low <= high < 1.0:
            raise ValueError(f"need 0 < low ≤ high < 1, got low={low}, high={high}")
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_id = vocab_size - 2
        self.pad_token_id = vocab_size - 3
        self.low, self.high, self.salt = low, high, salt
        self.calls = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        from adaptive_decoding.framework.core.rng import GOLDEN_GAMMA, mix64, shift_right_logical

        self.calls += 1
        b, seq_len = input_ids.shape
        n_ord = self.vocab_size - 3
        visible = torch.ones_like(input_ids,
                                  dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        known = visible & (input_ids != self.mask_token_id)
        pos = torch.arange(seq_len, dtype=torch.int64, device=input_ids.device)[None, :]
        terms = mix64((input_ids.long() + 1) * GOLDEN_GAMMA + pos)
        key = torch.where(known, terms, torch.zeros_like(terms)).sum(1, keepdim=True)  # [b, 1]
        h = mix64(key + mix64(pos * 7919 + self.salt))  # [b, seq_len]
        h1, h2 = mix64(h + 1), mix64(h + 2)
        unit = lambda x: shift_right_logical(x, 11).double() / float(1 << 53)  # noqa: E731
        answer = shift_right_logical(h, 1) % n_ord
        second_id = (answer + 1 + shift_right_logical(h1, 1) % (n_ord - 1)) % n_ord
        p1 = self.low + (self.high - self.low) * unit(h1)
        p2 = torch.minimum(p1, 1.0 - p1) * unit(h2)
        rest = ((1.0 - p1 - p2) / (n_ord - 2)).clamp(min=1e-12)
        probs = torch.zeros(b, seq_len, self.vocab_size, dtype=torch.float64, device=input_ids.device)
        probs[..., :n_ord] = rest[..., None]
        probs.scatter_(2, second_id[..., None], p2[..., None].clamp(min=1e-12))
        probs.scatter_(2, answer[..., None], p1[..., None])
        probs[..., n_ord:] = 1e-12
        own = torch.full_like(probs, 1e-12)
        own.scatter_(2, input_ids.long().clamp(0, self.vocab_size - 1)[..., None], 1.0)
        probs = torch.where(known[..., None], own, probs)
        return probs.log().float()


class JointDenoiser(nn.Module):
    """An exact denoiser for a designed joint distribution over whole answers.

    ``answers`` ``[M, G]`` with weights ``w_m``: at a masked generation position i the model puts
    ``p(v) = Σ_m w_m [a_m,i = v] · c_m / Σ_m w_m c_m``, where ``c_m`` says whether answer m agrees
    with every decided generation position of the row (the exact conditional marginal); with no
    consistent answer it is uniform over the ordinary tokens. Decided positions predict themselves.

    Greedy parallel decoding follows the marginals and can be provably worse than the joint mode:
    with answers ``(a, x)`` 0.26, ``(a, y)`` 0.26, ``(b, z)`` 0.48 the first position's top-1 is
    ``a`` (0.52), after which the second is a coin flip (0.5), so any greedy path has joint
    probability 0.26, while ``(b, z)`` has 0.48. The lookahead tests use it.

    Vocabulary: ``mask_token_id = V−1``, ``eos_token_id = V−2``, ``pad_token_id = V−3``;
    generation starts at ``prompt_length`` in every row.
    """

    def __init__(self, answers: Sequence[Sequence[int]], weights: Sequence[float], vocab_size: int = 12,
                 prompt_length: int = 1) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.mask_token_id = vocab_size - 1
        self.eos_token_id = vocab_size - 2
        self.pad_token_id = vocab_size - 3
        self.prompt_length = prompt_length
        self.register_buffer("answers", torch.as_tensor(answers, dtype=torch.long))
        w = torch.as_tensor(weights, dtype=torch.float64)
        if self.answers.dim() != 2 or w.shape != (self.answers.shape[0],) or bool((w <= 0).any()):
            raise ValueError("answers must be [M, G] with M positive weights")
        self.register_buffer("weights", w / w.sum())
        self.calls = 0
        self.rows_seen = 0

    def joint(self, generated: torch.Tensor) -> torch.Tensor:
        """Probability ``[B]`` of each generated answer ``[B, G]`` under the designed joint."""
        match = (generated[:, None, :] == self.answers[None]).all(-1).double()
        return match @ self.weights

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        self.calls += 1
        b, seq_len = input_ids.shape
        self.rows_seen += b
        g = self.answers.shape[1]
        p = self.prompt_length
        gen = input_ids[:, p : p + g]
        decided = gen != self.mask_token_id
        agree = (~decided[:, None, :] | (gen[:, None, :] == self.answers[None])).all(-1)  # [b, M]
        w = agree.double() * self.weights[None]  # [b, M]
        onehot = torch.nn.functional.one_hot(self.answers, self.vocab_size).double()  # [M, G, V]
        mass = torch.einsum("bm,mgv->bgv", w, onehot)
        n_ord = self.vocab_size - 3
        uniform = torch.zeros(self.vocab_size, dtype=torch.float64)
        uniform[:n_ord] = 1.0 / n_ord
        tot = mass.sum(-1, keepdim=True)
        gen_probs = torch.where(tot > 0, mass / tot.clamp(min=1e-300), uniform)
        probs = torch.full((b, seq_len, self.vocab_size), 1e-12, dtype=torch.float64)
        probs.scatter_(2, input_ids.unsqueeze(-1), 1.0)
        masked = (input_ids[:, p : p + g] == self.mask_token_id)[..., None]
        probs[:, p : p + g] = torch.where(masked, gen_probs.clamp(min=1e-12), probs[:, p : p + g])
        return (probs / probs.sum(-1, keepdim=True)).log().float()


class CharTokenizer:
    """A character-level tokenizer for scorer tests (follows :class:`adaptive_decoding.framework.models.protocol.Tokenizer`).

    Ids follow the toy denoisers' convention: one id per character of ``alphabet`` (``0..n−1``),
    then ``[PAD]`` = n, ``[EOS]`` = n+1, ``[MASK]`` = n+2 (= ``vocab_size − 1``), so
    ``ToyDenoiser(vocab_size=CharTokenizer().vocab_size)`` decodes text. ``decode`` writes the
    mask as ``_`` and skips PAD.
    """

    #: the default characters: space, letters, digits and common punctuation
    ALPHABET = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?+=-'%$"

    def __init__(self, alphabet: str = ALPHABET) -> None:
        self.alphabet = alphabet
        n = len(alphabet)
        self.pad_token_id, self.eos_token_id, self.mask_token_id = n, n + 1, n + 2
        self._ids = {ch: i for i, ch in enumerate(alphabet)}
        self.vocab_size = n + 3

    def encode(self, text: str) -> list[int]:
        out = []
        for i, ch in enumerate(text):
            if ch not in self._ids:
                raise ValueError(f"unknown character {ch!r} at position {i} of {text!r}")
            out.append(self._ids[ch])
        return out

    def decode(self, ids: "Sequence[int] | torch.Tensor", stop_at_eos: bool = True) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_token_id and stop_at_eos:
                break
            if i == self.mask_token_id:
                out.append("_")
            elif 0 <= i < len(self.alphabet):
                out.append(self.alphabet[i])
        return "".join(out)


class TokenCache:
    """The "KV cache" of :class:`CachedToy`: the token each canvas column's keys were computed from."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def select(self, rows: torch.Tensor) -> "TokenCache":
        return TokenCache(self.tokens[rows].clone())

    def update_rows(self, rows: torch.Tensor, other: "TokenCache") -> None:
        self.tokens[rows] = other.tokens


class CachedToy(nn.Module):
    """Any plain toy denoiser served through the windowed, cached call of the engine
    (:mod:`adaptive_decoding.framework.engine.denoise`), with a cache whose staleness is visible.

    A refresh shows the model the whole canvas and keeps it as the cache; a cached step writes the
    query columns' current tokens into that kept canvas and shows the model the result. So with
    ``cache='dual'`` the model sees the suffix as it was at the last refresh (stale keys), with
    ``prefix`` the prefix as it was then: a designed model's answers change with the cache mode
    exactly where a transformer's would, which lets the conformance suite run every controller
    under every cache mode.
    """

    supports_kv_cache = True

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.vocab_size, self.mask_token_id = model.vocab_size, model.mask_token_id
        self.eos_token_id = getattr(model, "eos_token_id", None)
        self.pad_token_id = getattr(model, "pad_token_id", None)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.model(input_ids, attention_mask=attention_mask)

    def window_logits(self, x: torch.Tensor, attention_mask: Optional[torch.Tensor], out_cols: torch.Tensor,
                      *, cache: Optional[TokenCache] = None, query_cols: Optional[torch.Tensor] = None,
                      query_valid: Optional[torch.Tensor] = None, use_cache: bool = False) -> tuple:
        if cache is None:
            seen, cache = x, (TokenCache(x.clone()) if use_cache else None)
        else:
            valid = torch.ones_like(query_cols,
                                    dtype=torch.bool) if query_valid is None else query_valid.bool()
            r, c = valid.nonzero(as_tuple=True)
            cache.tokens[r, query_cols[r, c]] = x[r, query_cols[r, c]]
            seen = cache.tokens
        from adaptive_decoding.framework.engine.denoise import gather_columns

        return gather_columns(self.model(seen, attention_mask=attention_mask), out_cols), cache


class BlockCausalToy(nn.Module):
    """Any plain toy denoiser made block-causal (LLaDA2.x, SDAR, Fast-dLLM v2's attention), with the
    visible cache of :class:`CachedToy` for ``cache='block'``.

    Column c is predicted from the canvas with every column of a later block than ``c // block_size``
    hidden (the mask token, attention 0); a cached step writes the query columns' tokens into the
    kept canvas and predicts from it. So a loop that let a block read a later one, or that forgot
    to store a finished block's final tokens, decodes differently here than with ``cache='none'``:
    the conformance suite runs every controller on it under both modes.
    """

    supports_kv_cache = True
    block_causal = True

    def __init__(self, model: Any, block_size: int) -> None:
        super().__init__()
        self.model, self.block_size = model, int(block_size)
        self.vocab_size, self.mask_token_id = model.vocab_size, model.mask_token_id
        self.eos_token_id = getattr(model, "eos_token_id", None)
        self.pad_token_id = getattr(model, "pad_token_id", None)

    def _logits_at(self, seen: torch.Tensor, attention_mask: Optional[torch.Tensor], cols: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, W, V]`` at ``cols``, each from the canvas up to the end of its own block."""
        L = seen.shape[1]
        attn = torch.ones_like(seen) if attention_mask is None else attention_mask
        out = None
        for k in torch.unique(cols // self.block_size).tolist():
            later = torch.arange(L, device=seen.device)[None, :] >= (k + 1) * self.block_size
            view = torch.where(later, torch.full_like(seen, self.mask_token_id), seen)
            logits = self.model(view, attention_mask=torch.where(later, torch.zeros_like(attn), attn))
            got = logits.gather(1, cols[:, :, None].expand(-1, -1, logits.shape[-1]))
            out = got if out is None else torch.where((cols // self.block_size == k)[:, :, None], got, out)
        return out  # type: ignore[return-value]

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        cols = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
        return self._logits_at(input_ids, attention_mask, cols)

    def window_logits(self, x: torch.Tensor, attention_mask: Optional[torch.Tensor], out_cols: torch.Tensor,
                      *, cache: Optional[TokenCache] = None, query_cols: Optional[torch.Tensor] = None,
                      query_valid: Optional[torch.Tensor] = None, use_cache: bool = False) -> tuple:
        if cache is None:
            seen, cache = x, (TokenCache(x.clone()) if use_cache else None)
        else:
            valid = torch.ones_like(query_cols, dtype=torch.bool) if query_valid is None else query_valid.bool()
            r, c = valid.nonzero(as_tuple=True)
            cache.tokens[r, query_cols[r, c]] = x[r, query_cols[r, c]]
            seen = cache.tokens
        return self._logits_at(seen, attention_mask, out_cols), cache
