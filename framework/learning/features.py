"""The learned policies' feature vector φ per eligible position (:data:`FEATURE_NAMES`).

The first 13 columns describe a position by itself (its confidence, where it lies, how far decoding
is). The next eight expose *dependence*, what a per-position score cannot see: whether the slots
next to it are still guesses, and how confident the nearest other uncertain position of the step's
window is ("uncertain": eligible with confidence below :data:`UNCERTAIN`). Two uncertain neighbours
are often the two halves of one choice ("New" / "York"): committing both at once risks "New
Francisco", committing the more confident one is safe and makes the other certain.

The last four (:data:`PEER_FEATURES`) read the task's *declared* structure instead of adjacency: the
positions that constrain each other (a Sudoku cell's row, column and box;
:func:`adaptive_decoding.framework.models.structure.generation_peers`). They say how many of a position's peers are
still guesses, how confident the best of them is, whether this position leads them, and how
confident the most confident eligible peer that predicts the *same* token is (two peers with one
digit cannot both be right). Without a declared structure a position has no peers (0, 0, 1, 0).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import rank_within
from adaptive_decoding.framework.models.structure import generation_peers, window_peers

#: φ, in column order. Every entry is per position; per-sample ones are broadcast over the row.
SELF_FEATURES: tuple[str, ...] = (
    "confidence",          # p(x0)
    "margin",              # top1 − top2
    "entropy",             # H = −Σ p log p (nats)
    "top2_prob",           # p of the runner-up
    "position_in_block",   # (i − block_start) / block length, in [0, 1)
    "position_frac",       # i / G
    "progress",            # fraction of the G positions already decided
    "block_progress",      # 1 − eligible / masked-at-block-start
    "confidence_rank",     # rank by confidence among the eligible / #eligible (0 = most confident)
    "relative_confidence",  # confidence / the row's highest eligible confidence
    "left_decided",        # position i − 1 is not masked (prompt or committed)
    "right_decided",       # position i + 1 is not masked (committed, padding or past the end)
    "eligible_frac",       # #eligible / G
)
DEPENDENCE_FEATURES: tuple[str, ...] = (
    "left_confidence",     # confidence of position i − 1 if it is eligible now, else 1 (decided or not in play)
    "right_confidence",    # the same for i + 1
    "left_uncertain",      # i − 1 is eligible with confidence < UNCERTAIN
    "right_uncertain",     # i + 1 likewise
    "nearest_uncertain_distance",    # |i − j| / (the row's block length) to the nearest other uncertain j, 1 if none
    "nearest_uncertain_confidence",  # that j's confidence, 0 if none
    "nearest_uncertain_gap",         # p(x0_i) − that confidence, 0 if none
    "nearest_uncertain_leads",       # 1 if p(x0_i) > that confidence or there is none, 0.5 on a tie, else 0
)
PEER_FEATURES: tuple[str, ...] = (
    "peer_uncertain_frac",         # uncertain peers in the window / all peers of i in the structure
    "peer_best_confidence",        # the highest confidence of an uncertain peer, 0 if none
    "peer_leads",                  # 1 if p(x0_i) > that confidence or there is none, 0.5 on a tie, else 0
    "peer_same_guess_confidence",  # the highest confidence of an eligible peer predicting x0_i too, 0 if none
)
FEATURE_NAMES: tuple[str, ...] = SELF_FEATURES + DEPENDENCE_FEATURES + PEER_FEATURES
#: the groups a feature list may name instead of its columns (``--features self,dependence``)
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {"self": SELF_FEATURES, "dependence": DEPENDENCE_FEATURES,
                                              "peer": PEER_FEATURES}


def parse_features(spec: "str | Sequence[str]") -> tuple[str, ...]:
    """The columns a policy reads, from names and group names (:data:`FEATURE_GROUPS`), comma separated
    or a list, in :data:`FEATURE_NAMES` order (so ``confidence``, which set labels rank by and a
    residual network starts from, comes first). ``ValueError`` naming an unknown name, or a list
    without ``confidence``."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    unknown = [s for s in items if s not in FEATURE_NAMES and s not in FEATURE_GROUPS]
    if unknown or not items:
        raise ValueError(f"features={','.join(unknown) or '(none)'}: unknown; allowed: the groups "
                         f"{', '.join(FEATURE_GROUPS)} or the columns {', '.join(FEATURE_NAMES)}")
    chosen = {n for s in items for n in FEATURE_GROUPS.get(s, (s,))}
    if "confidence" not in chosen:
        raise ValueError(f"features={','.join(items)}: 'confidence' is required (set labels rank by it "
                         f"and a residual policy starts from it); add it or the group 'self'")
    return tuple(n for n in FEATURE_NAMES if n in chosen)


def default_features(structure: Optional[dict]) -> tuple[str, ...]:
    """Every column, less the peer ones when there is no declared ``structure`` (they would be constant)."""
    return FEATURE_NAMES if structure else SELF_FEATURES + DEPENDENCE_FEATURES

#: below this confidence an eligible position counts as uncertain in the dependence features
UNCERTAIN = 0.9


def feature_matrix(f: StepFeatures, gen_length: int, structure: Optional[dict] = None) -> torch.Tensor:
    """φ for every position, float32 ``[B, W, len(FEATURE_NAMES)]`` (meaningful where eligible);
    ``structure``: the generation's declared structure (:func:`adaptive_decoding.framework.models.structure.generation_peers`),
    read by the peer columns."""
    el = f.eligible
    n_el = f.n_eligible.clamp(min=1).float()[:, None]
    conf = f.confidence.float()
    best = torch.where(el, conf, torch.zeros_like(conf)).amax(1, keepdim=True).clamp(min=1e-12)
    rank = rank_within(conf, el).float() / n_el
    decided = ~f.masked
    left = torch.ones_like(decided)
    left[:, 1:] = decided[:, :-1]
    right = torch.ones_like(decided)
    right[:, :-1] = decided[:, 1:]
    block_prog = 1.0 - f.n_eligible.float() / f.block_masked_at_start.clamp(min=1).float()
    shape = conf.shape
    row = lambda t: t.float()[:, None].expand(shape)  # noqa: E731
    cols = [
        conf, f.margin.float(), f.entropy.float(), f.top2_prob.float(), f.position_in_block.float(),
        f.position.float() / float(gen_length), row(f.progress), row(block_prog), rank,
        conf / best, left.float(), right.float(), row(f.n_eligible.float() / float(gen_length)),
        *dependence_columns(f), *peer_columns(f, generation_peers(structure, gen_length)),
    ]
    return torch.stack(cols, dim=-1)


def row_block_length(f: StepFeatures, window: int) -> torch.Tensor:
    """Each row's own block length ``[B, 1]`` (not the padded window's, which depends on the batch);
    the window width where the features carry no block bounds."""
    start, end = getattr(f, "block_start", None), getattr(f, "block_end", None)
    if start is None or end is None:
        return torch.full((1, 1), float(max(1, window)))
    return (end - start).clamp(min=1).float()[:, None]


def dependence_columns(f: StepFeatures) -> list[torch.Tensor]:
    """The eight dependence columns of :data:`FEATURE_NAMES`, each float ``[B, W]``: neighbours' confidence
    and uncertainty, and the distance to, confidence of and confidence gap to the nearest other
    uncertain position, and which of the two leads. The gap between two guesses of about 1/3 each is a
    few thousandths, too small to read once standardised; its sign, the last column, says which
    guess leads at any size.
    Neighbours are found by generation position, so a ragged or padded window is read correctly."""
    el, conf, pos = f.eligible, f.confidence.float(), f.position
    unc = el & (conf < UNCERTAIN)
    same = pos[:, :, None] - pos[:, None, :]  # [B, W, W]: i − j
    neigh_conf, neigh_unc = [], []
    for offset in (1, -1):  # j = i − 1, then j = i + 1
        at = (same == offset) & el[:, None, :]
        neigh_conf.append(torch.where(at, conf[:, None, :], torch.ones_like(conf)[:, None, :]).amin(2))
        neigh_unc.append((at & unc[:, None, :]).any(2).float())
    dist = same.abs().float()
    other = unc[:, None, :] & ~torch.eye(pos.shape[1], dtype=torch.bool, device=pos.device)[None]
    dist = torch.where(other, dist, torch.full_like(dist, float("inf")))
    nearest, j = dist.min(2)
    width = row_block_length(f, pos.shape[1])
    found = torch.isfinite(nearest)
    near_dist = torch.where(found, nearest / width, torch.ones_like(nearest))
    near_conf = torch.where(found, conf.gather(1, j), torch.zeros_like(nearest))
    near_gap = torch.where(found, conf - near_conf, torch.zeros_like(nearest))
    leads = torch.where(found, (torch.sign(near_gap) + 1.0) / 2.0, torch.ones_like(nearest))
    return [neigh_conf[0], neigh_conf[1], neigh_unc[0], neigh_unc[1], near_dist, near_conf, near_gap, leads]


def peer_columns(f: StepFeatures, peers: Optional[torch.Tensor]) -> list[torch.Tensor]:
    """The four :data:`PEER_FEATURES`, each float ``[B, W]``, over ``peers`` ``[G, G]`` (True where two
    generation positions constrain each other, never on the diagonal; ``None``: no structure, so no
    peers). Peers are looked up by generation position, so any window or cache layout reads the same."""
    el, conf, pos = f.eligible, f.confidence.float(), f.position
    if peers is None:
        zero = torch.zeros_like(conf)
        return [zero, zero, torch.ones_like(conf), zero]
    rel = window_peers(peers, pos)  # [B, W, W]: j is i's peer
    degree = peers.to(pos.device).sum(1)[pos.clamp(0, peers.shape[0] - 1)].clamp(min=1).float()
    unc_peer = rel & (el & (conf < UNCERTAIN))[:, None, :]
    frac = unc_peer.sum(2).float() / degree
    best = torch.where(unc_peer, conf[:, None, :], torch.zeros_like(conf)[:, None, :]).amax(2)
    leads = torch.where(unc_peer.any(2), (torch.sign(conf - best) + 1.0) / 2.0, torch.ones_like(conf))
    same = rel & el[:, None, :] & (f.x0[:, :, None] == f.x0[:, None, :])
    same_conf = torch.where(same, conf[:, None, :], torch.zeros_like(conf)[:, None, :]).amax(2)
    return [frac, best, leads, same_conf]
