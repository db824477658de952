"""Every learned and lookahead point against the best non-learned curve of its task.

:mod:`experiments.against_base` compares a lookahead or revocable curve with the controller it is
built on; this compares each point of every **learned** curve (kind ``learned``) with the pool of
all non-learned points of the task (kinds baseline, heuristic, tuned: the published decoders, the
hand rules and their lookahead curves), and each point of every non-learned **lookahead** curve with
the same pool less the lookahead curves (what lookahead buys over the best decoder without it),
unmatched by interpolation:

* **at equal NFE**: the pool's best accuracy among its points with NFE ≤ the point's; Δ in points;
* **at equal accuracy**: the pool's most tokens per forward among its points with accuracy ≥ the
  point's, and the point's tokens per forward over it; beside it the **forwards ratio**, the pool's
  fewest mean NFE reaching that accuracy over the point's mean NFE (total tokens over total forwards,
  which a curve with a ragged NFE cannot inflate).
"""

from __future__ import annotations

from typing import Any, Sequence

from experiments.against_base import match_point
from experiments.matched import NON_LEARNED, format_figure


def is_contender(row: dict) -> bool:
    """A point compared with the pool: a learned controller's, or one that decodes with lookahead."""
    return row.get("kind") == "learned" or bool(row.get("lookahead"))


def against_best(rows: Sequence[dict]) -> dict[str, Any]:
    """One task's comparison: ``{"points": [...], "pool": n, "pool_with_lookahead": m}``; each point
    names the pool's point it is matched with at equal NFE and at equal accuracy, with Δ points and
    both ratios (a learned point against all ``m`` non-learned points, a lookahead one against the
    ``n`` without lookahead)."""
    every = [r for r in rows if r.get("kind") in NON_LEARNED]
    pool = [r for r in every if not r.get("lookahead")]
    points = []
    for p in sorted((r for r in rows if is_contender(r)), key=lambda r: (r["curve"], r["tpf"])):
        against = every if p.get("kind") == "learned" else pool
        points.append({"strategy": p["strategy"], "curve": p["curve"], "kind": p["kind"],
                       "lookahead": bool(p.get("lookahead")), "accuracy": p["accuracy"], "nfe": p["nfe"],
                       "tpf": p["tpf"], **match_point(p, against, "best")})
    return {"points": points, "pool": len(pool), "pool_with_lookahead": len(every)}


def against_best_markdown(name: str, result: dict) -> list[str]:
    """The task's section (empty without learned or lookahead points)."""
    if not result["points"]:
        return []
    md = [f"### {name}: learned and lookahead points against the best non-learned curve", "",
          f"Each learned point against the pool of the task's "
          f"{result.get('pool_with_lookahead', result['pool'])} non-learned points (published baselines, hand "
          f"rules, tuned, and their lookahead curves), each non-learned lookahead point against the "
          f"{result['pool']} of them without lookahead, unmatched by interpolation: at equal NFE the pool's best "
          "accuracy with no more NFE; at equal accuracy the pool's most tokens per forward with at least that "
          "accuracy, and the forwards ratio (the pool's fewest mean NFE reaching it over the point's).", "",
          "| point | kind | accuracy | NFE | tokens/forward | best non-learned at ≤ NFE | Δ accuracy (points) "
          "| best non-learned at ≥ accuracy | tokens/forward ratio | forwards ratio |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for q in result["points"]:
        kind = q["kind"] + (" + lookahead" if q["lookahead"] and q["kind"] != "learned" else "")
        delta = "–" if q["delta_points"] is None else f"{q['delta_points']:+.1f}"
        vals = [q["strategy"], kind, format_figure(q["accuracy"], 3), format_figure(q["nfe"], 2),
                format_figure(q["tpf"], 2),
                f"{q['best_at_nfe'] or '–'} ({format_figure(q['best_acc_at_nfe'], 3)})", delta,
                f"{q['best_at_acc'] or '–'} ({format_figure(q['best_tpf_at_acc'], 2)})",
                format_figure(q["tpf_ratio"], 2), format_figure(q["nfe_ratio"], 2)]
        md.append("| " + " | ".join(v.replace("|", "\\|") for v in vals) + " |")
    return md + [""]
