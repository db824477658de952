"""The lookahead sweep of the benchmark: accuracy, coherence and NFE as lookahead width/depth grow."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from adaptive_decoding.framework.core.measure import tokens_per_forward
from adaptive_decoding.framework.core.options import ExampleDraw, IntListParam, Options
from adaptive_decoding.framework.core.params import Param
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.lookahead.facade import Lookahead


@dataclass(repr=False, eq=False)
class SweepGrid(Options):
    """The sweep's settings: every lookahead width W of ``widths`` with every depth cap d of
    ``depths`` (``max_depth``), and first, with ``include_baseline``, no lookahead (W = d = 0)."""

    section = "sweep"
    params = {
        "widths": IntListParam(low=1, doc="lookahead widths W swept"),
        "depths": IntListParam(low=1, doc="depth caps d (max_depth) swept"),
        "include_baseline": Param(bool, doc="first decode without lookahead (width = depth = 0)"),
    }

    widths: list = field(default_factory=lambda: [2, 4])
    depths: list = field(default_factory=lambda: [1, 2, 4])
    include_baseline: bool = True


#: the sweep's examples by default: 100 of the test split, 50 prompts at a time
SWEEP_DRAW = {"n": 100, "batch_size": 50}


def lookahead_sweep(loaded: Any, task: Any, controller: Any, config: Any, *, lookahead: Optional[Lookahead] = None,
                    grid: Optional[SweepGrid] = None, draw: Optional[ExampleDraw] = None) -> list[dict[str, Any]]:
    """Accuracy, joint coherence, NFE and peak memory of ``controller`` as lookahead width/depth grow.

    One row per setting of ``grid`` (``width = depth = 0``: no lookahead), each decoding the same
    examples (``draw``; default :data:`SWEEP_DRAW` of the test split) with the same per-item seeds. Each
    setting's lookahead is ``lookahead`` (its scorer, ``budget`` capping the extra NFE per sample and the
    other keys; ``None``: the defaults) with ``width`` = W and ``max_depth`` = d. ``depth`` caps the
    controller's ``Decision.depth``, so use a controller that asks for deep lookahead (e.g.
    ``confidence_ladder`` with ``d_max ≥ max(depths)``). Decoding gets each batch's
    ``DecodeContext.for_batch`` (the tokenizer, each example's prompt text and meta, the task's spans), so
    text scorers and ``compliance(numbers=meta)`` see them.

    Row keys: ``width, depth, accuracy, nfe, lookahead_nfe, tpf, fallbacks, peak_mem_mb,
    seconds`` and, for tasks with ``joint_coherence`` (pairs), ``valid_slots`` and
    ``incoherent_slots`` (fractions of the answer slots).
    """
    grid = SweepGrid.build() if grid is None else grid
    draw = ExampleDraw.build(**SWEEP_DRAW) if draw is None else draw
    base = (Lookahead() if lookahead is None else lookahead).get_params()
    examples = task.examples(draw.split, draw.n, seed=draw.data_seed)
    settings = [(0, 0)] if grid.include_baseline else []
    settings += [(w, d) for w in grid.widths for d in grid.depths]
    rows = []
    for w, d in settings:
        la = None if w == 0 else Lookahead.build(**{**base, "width": w, "max_depth": d})
        rows.append({"width": w, "depth": d, **_sweep_point(loaded, task, controller, config, la, examples,
                                                            draw.batch_size)})
    return rows


def _sweep_point(loaded: Any, task: Any, controller: Any, config: Any, la: Any, examples: list,
                 batch_size: int) -> dict[str, Any]:
    """One setting of the sweep: decode ``examples`` with lookahead ``la`` (or none) and measure it."""
    from adaptive_decoding.framework.core.measure import PeakMemory
    from adaptive_decoding.framework.engine.evaluate import answer_token_counts, item_seeds
    from adaptive_decoding.framework.engine.loop import decode

    tok = loaded.tokenizer
    texts: list[str] = []
    nfe, la_nfe, fb, results = [], [], [], []
    t0 = time.perf_counter()
    with PeakMemory(getattr(loaded.denoiser, "device", "cpu")) as pm:
        for i in range(0, len(examples), batch_size):
            chunk = examples[i : i + batch_size]
            res = decode(loaded.denoiser, [tok.encode(e.prompt) for e in chunk], controller, config,
                         seeds=item_seeds([e.id for e in chunk], config.seed), lookahead=la,
                         context=DecodeContext.for_batch(tok, chunk, task=task, gen_length=config.gen_length))
            texts += [tok.decode(g.tolist(), stop_at_eos=True) for g in res.generated]
            results.append(res)
            nfe.append(res.nfe)
            la_nfe.append(res.lookahead_nfe)
            fb.append(res.fallbacks)
    nfe_t = torch.cat(nfe).float()
    row: dict[str, Any] = {
        "n": len(examples),
        "accuracy": sum(task.score(e, t) for e, t in zip(examples, texts)) / max(1, len(examples)),
        "nfe": float(nfe_t.mean()), "lookahead_nfe": float(torch.cat(la_nfe).float().mean()),
        "tpf": tokens_per_forward(answer_token_counts(task, examples, results, tok), nfe_t),
        "fallbacks": int(torch.cat(fb).sum()), "peak_mem_mb": pm.peak_mb,
        "seconds": time.perf_counter() - t0,
    }
    if hasattr(task, "joint_coherence"):
        counts = [task.joint_coherence(e, t) for e, t in zip(examples, texts)]
        slots = max(1, sum(c["slots"] for c in counts))
        row["valid_slots"] = sum(c["valid"] for c in counts) / slots
        row["incoherent_slots"] = sum(c["incoherent"] for c in counts) / slots
    return row
