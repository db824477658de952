"""Per-position features of one decoding step (the controllers' only view of the model).

For every position the step computes, from the denoiser's logits:

* ``x0``          the predicted token (argmax; at temperature T > 0 a sample of softmax(z / T),
  drawn by inverse CDF from one counter-based uniform per position, :func:`sample_tokens`),
* ``confidence``  p(x0), the probability of the predicted token (LLaDA's / Fast-dLLM's "confidence"),
* ``top1_prob``, ``top2_prob`` and ``margin = top1 - top2`` (Dream's ``topk_margin``, the margin
  top-k controller's η test),
* ``entropy``     the exact H = -Σ p log p, computed as lse − Σ p·z (no clamp, no log over the
  vocabulary; Dream's ``entropy`` alg, EB-sampler, and the entropy top-k controller's
  ``k = k_base + α·H/τ``),
* position features: ``position`` (index in the generation), ``position_in_block`` in [0, 1),
* progress features: ``frac_masked`` and ``progress`` per sample.

``eligible`` marks what may be committed now: still masked and inside the current block (with
multi-block decoding, inside any active block; ``block_of`` says which).

Every per-position tensor covers the step's **window** ``[B, W]``: each row's current block,
gathered per row by the loop (``window_index`` holds each slot's canvas column, ``position`` its
index in the generation), so nothing of size ``[B, L, V]`` is built. Slots past a row's block
(rows with shorter blocks) are never eligible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from adaptive_decoding.framework.core.options import Options
from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.core.rng import uniform_at

#: the salt of the sampling uniforms (``uniform_at(seed, step, SAMPLE_SALT, position)``); changing
#: it changes every sample drawn at temperature > 0
SAMPLE_SALT = 0x5A17


@dataclass
class StepFeatures:
    """Tensors of one step; per-position ones are ``[B, W]`` (the window), per-sample ones ``[B]``."""

    x0: torch.Tensor
    confidence: torch.Tensor
    top1_prob: torch.Tensor
    top2_prob: torch.Tensor
    top1_id: torch.Tensor
    top2_id: torch.Tensor
    margin: torch.Tensor
    entropy: torch.Tensor
    eligible: torch.Tensor
    masked: torch.Tensor
    position: torch.Tensor
    position_in_block: torch.Tensor
    frac_masked: torch.Tensor
    step: torch.Tensor
    block_step: torch.Tensor
    block_index: torch.Tensor
    block_start: torch.Tensor
    block_end: torch.Tensor
    block_masked_at_start: torch.Tensor
    n_eligible: torch.Tensor
    window_index: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = field(default=None, repr=False)
    #: revocable decoding: decided slots this decode committed (they may be re-masked), ``[B, W]``
    revocable: Optional[torch.Tensor] = None
    #: for controllers that verify: p(current token) at revocable slots with the slot hidden
    #: (WINO's shadow block), NaN elsewhere, ``[B, W]``
    verify_prob: Optional[torch.Tensor] = None
    #: with it: the largest probability of any token at those slots with the slot hidden (the
    #: shadow's favourite), NaN elsewhere, ``[B, W]``; equals ``verify_prob`` where the token is it
    verify_top_prob: Optional[torch.Tensor] = None
    #: the block each slot is in, relative to the row's first active block (0, 1, …), ``[B, W]``;
    #: all 0 unless multi-block decoding (``block_add_threshold``) keeps several blocks active
    block_of: Optional[torch.Tensor] = None

    @property
    def progress(self) -> torch.Tensor:
        """Fraction of the generation already decided, per sample ``[B]``."""
        return 1.0 - self.frac_masked

    @property
    def batch_size(self) -> int:
        return self.x0.shape[0]

    def rows(self, index: torch.Tensor) -> "StepFeatures":
        """The features of a subset of samples (index into the batch dimension)."""
        kw = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            kw[name] = value[index] if isinstance(value, torch.Tensor) else value
        return StepFeatures(**kw)


#: positions per chunk of the statistics: bounds the float temporaries to [B, chunk, V]
STAT_CHUNK = 4


def _chunk_stats(z: torch.Tensor, u: Optional[torch.Tensor], temperature: float) -> tuple[torch.Tensor, ...]:
    """top-2 probabilities and ids, entropy, and (with uniforms ``u``) a sample and its probability,
    for one chunk of logits ``[B, c, V]``: one softmax, one top-2, one dot product per position."""
    zf = z.float()
    p = torch.softmax(zf, dim=-1)
    if p.shape[-1] >= 2:
        top = p.topk(2, dim=-1)
        tv, ti = top.values, top.indices
    else:
        tv = torch.cat([p, torch.zeros_like(p)], -1)
        ti = torch.zeros_like(tv, dtype=torch.long)
    # H = lse − Σ p·z with lse = z_top1 − log p_top1 (exact; no log over the vocabulary)
    lse = zf.gather(-1, ti[..., :1]).squeeze(-1) - tv[..., 0].log()
    pz = (p.unsqueeze(-2) @ zf.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    if not torch.isfinite(pz).all():  # -inf logits (p = 0 there): 0·(-inf) is NaN, so clamp them
        pz = (p.unsqueeze(-2) @ zf.clamp_min(torch.finfo(torch.float32).min).unsqueeze(-1)).squeeze(-1).squeeze(-1)
    entropy = (lse - pz).clamp_min(0.0)
    if u is None:
        return tv, ti, entropy, None, None
    pt = p if temperature == 1.0 else torch.softmax(zf / temperature, dim=-1)
    cdf = pt.to(torch.float64).cumsum_(-1)
    x0 = torch.searchsorted(cdf, (u * cdf[..., -1]).unsqueeze(-1)).squeeze(-1).clamp_(max=p.shape[-1] - 1)
    return tv, ti, entropy, x0, p.gather(-1, x0.unsqueeze(-1)).squeeze(-1)


def _window_stats(logits: torch.Tensor, u: Optional[torch.Tensor] = None, temperature: float = 0.0,
                  chunk: int = STAT_CHUNK) -> tuple[torch.Tensor, ...]:
    w = logits.shape[1]
    parts = [_chunk_stats(logits[:, i:i + chunk], None if u is None else u[:, i:i + chunk], temperature)
             for i in range(0, w, chunk)] if w else [_chunk_stats(logits, u, temperature)]
    return tuple(None if parts[0][j] is None else torch.cat([q[j] for q in parts], dim=1) for j in range(5))


def token_statistics(logits: torch.Tensor, chunk: int = STAT_CHUNK) -> dict[str, torch.Tensor]:
    """top-1/top-2 probabilities and ids, margin and entropy from logits ``[B, W, V]`` (or ``[W, V]``).

    Per chunk of ``chunk`` positions: one float32 softmax, a top-2 and a dot product, so the
    temporaries are ``[B, chunk, V]`` whatever the window and the logits' dtype. ``entropy`` is
    the exact Shannon entropy H = −Σ p log p = lse − Σ p·z (lse from the top-1 logit and its
    probability), with no log over the vocabulary; it is what Dream's ``entropy`` alg and the
    EB-sampler rank by.
    """
    if logits.dim() == 2:
        return {k: v[0] for k, v in token_statistics(logits[None], chunk).items()}
    tv, ti, entropy, _, _ = _window_stats(logits, chunk=chunk)
    return {
        "top1_prob": tv[..., 0],
        "top2_prob": tv[..., 1],
        "top1_id": ti[..., 0],
        "top2_id": ti[..., 1],
        "margin": tv[..., 0] - tv[..., 1],
        "entropy": entropy,
    }


def sample_tokens(
    logits: torch.Tensor, temperature: float, seeds: torch.Tensor, step: torch.Tensor, position: torch.Tensor,
    chunk: int = STAT_CHUNK,
) -> torch.Tensor:
    """A sample ``x0 ~ softmax(logits / T)`` per position, counter-based per sample.

    The same distribution as LLaDA's and Fast-dLLM's float64 Gumbel-max
    (``argmax exp(z) / (-log u)^T``), drawn by inverse CDF: one uniform per position, keyed by
    ``(sample seed, step, generation position)`` (:func:`adaptive_decoding.framework.core.rng.uniform_at`), so a
    row's sample never depends on the rest of the batch or on the window's layout; the
    cumulative sum and the search run in float64. The cost is one cumulative sum over the window
    instead of V hashed Gumbel draws per position.
    """
    u = uniform_at(seeds, step, SAMPLE_SALT, position)
    return _window_stats(logits, u, temperature, chunk)[3]


@dataclass
class StepWindow:
    """The step's window, what :func:`compute_features` reads besides the logits.

    Per position ``[B, W]``: ``eligible`` (may be committed now), ``masked``, ``rel`` (index in the
    generation), ``window_index`` (each slot's canvas column; ``None``: the identity, a window that is
    the whole canvas) and ``block_of`` (each slot's block relative to the first active one; ``None``:
    0, the window is one block). Per row ``[B]``: ``block_start``/``block_end`` (bounding the whole
    window either way), ``block_index``, ``block_masked_at_start``, ``step``, ``block_step``, ``seeds``
    (needed at temperature > 0) and ``n_masked`` (masked generation positions outside the window too;
    ``None``: those in it).
    """

    eligible: torch.Tensor
    masked: torch.Tensor
    rel: torch.Tensor
    block_start: torch.Tensor
    block_end: torch.Tensor
    block_index: torch.Tensor
    block_masked_at_start: torch.Tensor
    step: torch.Tensor
    block_step: torch.Tensor
    seeds: Optional[torch.Tensor] = None
    window_index: Optional[torch.Tensor] = None
    n_masked: Optional[torch.Tensor] = None
    block_of: Optional[torch.Tensor] = None


@dataclass(repr=False, eq=False)
class FeatureOptions(Options):
    """How the features are computed: ``gen_length`` G (``frac_masked`` = masked / G; the default is
    :class:`~adaptive_decoding.framework.engine.config.DecodeConfig`'s), ``temperature`` T (> 0: x0 is a sample of
    softmax(z / T)) and ``keep_logits`` (keep the window's logits on :class:`StepFeatures`). The loop
    builds it from its validated ``DecodeConfig`` each step."""

    section = "features"
    params = {
        "gen_length": Param(int, low=1, doc="generation length G (frac_masked = masked / G)"),
        "temperature": Param(float, low=0.0, doc="sampling temperature T (0 = argmax)"),
        "keep_logits": Param(bool, doc="keep the window's logits on the features"),
    }

    gen_length: int = 32
    temperature: float = 0.0
    keep_logits: bool = True


def compute_features(logits: torch.Tensor, window: StepWindow, options: FeatureOptions) -> StepFeatures:
    """Build :class:`StepFeatures` from the window's logits ``[B, W, V]``.

    The window is what the step can commit (each row's current block, gathered per row by the
    loop); every per-position tensor of ``window`` is ``[B, W]`` in the same order (see
    :class:`StepWindow` for each and its default). At ``options.temperature > 0`` the prediction is a
    sample of ``softmax(logits / T)`` (:func:`sample_tokens`) and ``confidence = p(x0)`` under the
    un-tempered softmax, as LLaDA does.
    """
    w = window
    x0, confidence, stats = _predictions(logits, float(options.temperature), w.seeds, w.step, w.rel)
    blen = (w.block_end - w.block_start).clamp(min=1).float()
    pos_in_block = ((w.rel - w.block_start[:, None]).float() / blen[:, None]).clamp(0.0, 1.0)
    n_masked = w.masked.sum(1) if w.n_masked is None else w.n_masked
    window_index = torch.arange(x0.shape[1], device=x0.device).expand_as(x0) if w.window_index is None \
        else w.window_index
    block_of = torch.zeros_like(x0) if w.block_of is None else w.block_of
    return StepFeatures(
        x0=x0, confidence=confidence, eligible=w.eligible, masked=w.masked, position=w.rel,
        position_in_block=pos_in_block, frac_masked=n_masked.float() / float(options.gen_length), step=w.step,
        block_step=w.block_step, block_index=w.block_index, block_start=w.block_start, block_end=w.block_end,
        block_masked_at_start=w.block_masked_at_start, n_eligible=w.eligible.sum(1), window_index=window_index,
        logits=logits if options.keep_logits else None, block_of=block_of, **stats,
    )


def _predictions(logits: torch.Tensor, temperature: float, seeds: Optional[torch.Tensor], step: torch.Tensor,
                 rel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """x0 and its confidence p(x0) (the argmax and top-1 probability; at ``temperature > 0`` a sample
    keyed by (seed, step, position) and its un-tempered probability), and :func:`token_statistics`."""
    u = None
    if temperature > 0:
        if seeds is None:
            raise ValueError("temperature > 0 needs per-sample seeds")
        u = uniform_at(seeds, step, SAMPLE_SALT, rel)
    tv, ti, entropy, sampled, sampled_p = _window_stats(logits, u, temperature)
    stats = {"top1_prob": tv[..., 0], "top2_prob": tv[..., 1], "top1_id": ti[..., 0], "top2_id": ti[..., 1],
             "margin": tv[..., 0] - tv[..., 1], "entropy": entropy}
    if temperature > 0:
        return sampled, sampled_p, stats
    return stats["top1_id"], stats["top1_prob"], stats
