"""The lookahead sweep of the benchmark: accuracy, coherence and NFE as lookahead width/depth grow."""

from __future__ import annotations

import time
from typing import Any

import torch

from framework.core.measure import tokens_per_forward
from framework.engine.context import DecodeContext
from framework.engine.lookahead.facade import Lookahead
from framework.engine.scorer import Scorer


def lookahead_sweep(
    loaded: Any, task: Any, controller: Any, config: Any, *, scorer: "Scorer | str" = "logprob",
    widths: tuple[int, ...] = (2, 4), depths: tuple[int, ...] = (1, 2, 4), n: int = 100, split: str = "test",
    batch_size: int = 50, include_baseline: bool = True, data_seed: int = 0, **lookahead_params: Any,
) -> list[dict[str, Any]]:
    """Accuracy, joint coherence, NFE and peak memory of ``controller`` as lookahead width/depth grow.

    One row per setting (``width = depth = 0``: no lookahead), each decoding the same ``n``
    examples of ``split`` with the same per-item seeds. ``depth`` caps the controller's
    ``Decision.depth`` (``max_depth``), so use a controller that asks for deep lookahead (e.g.
    ``confidence_ladder`` with ``d_max ≥ max(depths)``); the other :class:`Lookahead` keys come in
    ``lookahead_params`` (``budget`` caps the extra NFE per sample). Decoding gets each batch's
    ``DecodeContext.for_batch`` (the tokenizer, each example's prompt text and meta, the task's spans), so
    text scorers and ``compliance(numbers=meta)`` see them.

    Row keys: ``width, depth, accuracy, nfe, lookahead_nfe, tpf, fallbacks, peak_mem_mb,
    seconds`` and, for tasks with ``joint_coherence`` (pairs), ``valid_slots`` and
    ``incoherent_slots`` (fractions of the answer slots).
    """
    examples = task.examples(split, n, seed=data_seed)
    settings = [(0, 0)] if include_baseline else []
    settings += [(w, d) for w in widths for d in depths]
    rows = []
    for w, d in settings:
        la = None if w == 0 else Lookahead.build(scorer=scorer, width=w, max_depth=d, **lookahead_params)
        rows.append({"width": w, "depth": d, **_sweep_point(loaded, task, controller, config, la, examples,
                                                            batch_size)})
    return rows


def _sweep_point(loaded: Any, task: Any, controller: Any, config: Any, la: Any, examples: list,
                 batch_size: int) -> dict[str, Any]:
    """One setting of the sweep: decode ``examples`` with lookahead ``la`` (or none) and measure it."""
    from framework.core.measure import PeakMemory
    from framework.engine.evaluate import answer_token_counts, item_seeds
    from framework.engine.loop import decode

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
