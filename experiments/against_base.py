"""Lookahead and revocable decoding against the same controller without them.

A **variant** curve is compared with its **base** curve on the same task:

* a curve labelled ``"X + …"`` (``margin_topk + lookahead``) has base ``X`` when that is a curve of
  the task; a temperature label keeps its suffix (``margin_topk (T=1) + lookahead`` → ``margin_topk (T=1)``);
* a curve of a revocable wrapper (``verified``: parameters ``inner`` and ``inner_params``) has as
  base the task's curve of that inner controller with the same inner parameters and decoding
  options (the swept knob aside): the same drafter without re-masking; none if the task has none;
* a curve of another revocable controller (``wino``, ``remdm``: ``Controller.revocable``) has base
  ``fast_dllm`` with the same suffix (``wino (T=1)`` → ``fast_dllm (T=1)``): without re-masking both
  are Fast-dLLM's threshold rule.

Each variant point is matched against the base curve's points without interpolation:

* **at equal NFE**: the base's best accuracy among its points with NFE ≤ the variant's; Δ in points;
* **at equal accuracy**: the base's most tokens per forward among its points with accuracy ≥ the
  variant's; the variant's tokens per forward over it. Tokens per forward is the mean over samples
  of G / NFE, which rewards a curve whose NFE varies a lot between samples (a lazy lookahead spends
  little on easy ones); so beside it stands the **forwards ratio**: the fewest mean NFE of a base
  point with accuracy ≥ the variant's over the variant's mean NFE (total tokens over total forwards).

The targets, per task: some lookahead or revocable point gains ≥ 5 points at equal NFE or
reaches ≥ 1.2× tokens per forward at equal accuracy, by both ratios (goal: two tasks); no lookahead point
loses more
than 1 point at equal NFE; WINO's curve has a higher AUP than Fast-dLLM's (goal: one task).
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional, Sequence

GAIN_POINTS = 5.0
TPF_RATIO = 1.2
LOOKAHEAD_LOSS = 1.0
_SUFFIX = re.compile(r"^(?P<stem>.*?)(?P<suffix> \(T=[^)]*\))?$")


def _revocable(controller: Optional[str]) -> bool:
    if not controller:
        return False
    try:
        from framework.engine.controller import CONTROLLERS

        return bool(getattr(CONTROLLERS.get(controller), "revocable", False))
    except Exception:  # noqa: BLE001 - an unknown controller is simply no revocable one
        return False


def base_of(curve: str, controller: Optional[str], curves: set[str], row: Optional[dict] = None,
            by_curve: Optional[dict[str, list[dict]]] = None) -> Optional[str]:
    """The base curve of ``curve`` among ``curves`` (see the module doc), or ``None``; ``row`` (one of
    the curve's rows) and ``by_curve`` (every curve's rows) find a wrapper's inner curve."""
    if " + " in curve:
        head = curve.split(" + ", 1)[0]
        if head in curves and head != curve:
            return head
    params = (row or {}).get("params") or {}
    if isinstance(params, dict) and "inner" in params and _revocable(controller):
        return _inner_curve(curve, row or {}, by_curve or {})
    if _revocable(controller):
        m = _SUFFIX.match(curve.split(" + ", 1)[0])
        base = "fast_dllm" + ((m.group("suffix") or "") if m else "")
        if base in curves:
            return base
    return None


def _inner_curve(curve: str, row: dict, by_curve: dict[str, list[dict]]) -> Optional[str]:
    """The curve whose controller is ``row``'s inner one, with the same inner parameters and decoding."""
    params = row["params"]
    inner, inner_params = params["inner"], dict(params.get("inner_params") or {})
    swept = {k.split(".", 1)[1] for k in (row.get("sweep") or {}) if k.startswith("inner_params.")}
    for other, rows in by_curve.items():
        r = rows[0]
        same_decode = (r.get("decode") or {}) == (row.get("decode") or {})
        if other == curve or r.get("controller") != inner or not same_decode:
            continue
        ignore = swept | set(r.get("sweep") or {})
        if ({k: v for k, v in (r.get("params") or {}).items() if k not in ignore}
                == {k: v for k, v in inner_params.items() if k not in ignore}):
            return other
    return None


def best_accuracy_within(base: Sequence[dict], nfe: float) -> Optional[dict]:
    """The point of ``base`` with the best accuracy among those with NFE ≤ ``nfe`` (fewer NFE on a tie)."""
    pts = [p for p in base if p["nfe"] <= nfe + 1e-9]
    return max(pts, key=lambda p: (p["accuracy"], -p["nfe"])) if pts else None


def most_tpf_reaching(base: Sequence[dict], acc: float) -> Optional[dict]:
    """The point of ``base`` with the most tokens per forward among those with accuracy ≥ ``acc``."""
    pts = [p for p in base if p["accuracy"] >= acc - 1e-9]
    return max(pts, key=lambda p: (p["tpf"], p["accuracy"])) if pts else None


def fewest_nfe_reaching(base: Sequence[dict], acc: float) -> Optional[dict]:
    """The point of ``base`` with the fewest mean NFE among those with accuracy ≥ ``acc``."""
    pts = [p for p in base if p["accuracy"] >= acc - 1e-9 and p["nfe"]]
    return min(pts, key=lambda p: (p["nfe"], -p["accuracy"])) if pts else None


def match_point(p: dict, pool: Sequence[dict], name: str) -> dict[str, Any]:
    """Point ``p`` against the points of ``pool``, unmatched by interpolation: ``{name}_at_nfe`` (the
    pool's best accuracy with NFE ≤ p's) with its ``{name}_acc_at_nfe`` and ``delta_points``;
    ``{name}_at_acc`` (the pool's most tokens per forward with accuracy ≥ p's) with its
    ``{name}_tpf_at_acc`` and ``tpf_ratio``; ``nfe_ratio``, the pool's fewest mean NFE reaching p's
    accuracy over p's. ``None`` where the pool has no such point."""
    at_nfe, at_acc = best_accuracy_within(pool, p["nfe"]), most_tpf_reaching(pool, p["accuracy"])
    fewest = fewest_nfe_reaching(pool, p["accuracy"])
    return {
        f"{name}_at_nfe": at_nfe["strategy"] if at_nfe else None,
        f"{name}_acc_at_nfe": at_nfe["accuracy"] if at_nfe else None,
        "delta_points": 100.0 * (p["accuracy"] - at_nfe["accuracy"]) if at_nfe else None,
        f"{name}_at_acc": at_acc["strategy"] if at_acc else None,
        f"{name}_tpf_at_acc": at_acc["tpf"] if at_acc else None,
        "tpf_ratio": p["tpf"] / at_acc["tpf"] if at_acc and at_acc["tpf"] else None,
        "nfe_ratio": fewest["nfe"] / p["nfe"] if fewest and p["nfe"] else None,
    }


def compare(rows: Sequence[dict], aups: Optional[dict] = None) -> dict[str, Any]:
    """One task's comparison: ``{"points": [...], "targets": {...}}`` (rows of one task)."""
    aups = aups or {}
    curves = {r["curve"] for r in rows}
    by_curve: dict[str, list[dict]] = {}
    for r in rows:
        by_curve.setdefault(r["curve"], []).append(r)
    points = []
    for curve, pts in by_curve.items():
        base = base_of(curve, pts[0].get("controller"), curves, pts[0], by_curve)
        looks = any(p.get("lookahead") for p in pts)
        if base is None or not (looks or _revocable(pts[0].get("controller"))):
            continue  # e.g. "fast_dllm + eos_fill": a variant, but neither lookahead nor revocable
        kind = "lookahead" if looks else "revocable"
        for p in sorted(pts, key=lambda q: q["tpf"]):
            points.append({"variant": p["strategy"], "curve": curve, "base": base, "kind": kind,
                           "accuracy": p["accuracy"], "nfe": p["nfe"], "tpf": p["tpf"],
                           **match_point(p, by_curve[base], "base")})
    gains = [q for q in points if (q["delta_points"] or -math.inf) >= GAIN_POINTS - 1e-9
             or min(q["tpf_ratio"] or 0.0, q["nfe_ratio"] or 0.0) >= TPF_RATIO - 1e-9]
    losses = [q for q in points if q["kind"] == "lookahead" and q["delta_points"] is not None
              and q["delta_points"] < -LOOKAHEAD_LOSS - 1e-9]
    wino = {c: aups[c] for c in curves if c.startswith("wino") and c in aups}
    wins = [c for c, v in wino.items() if (b := base_of(c, "wino", curves)) and b in aups and v > aups[b]]
    return {"points": points, "targets": {
        "gain": {"met": bool(gains), "by": [q["variant"] for q in gains]},
        "lookahead_no_loss": {"met": not losses, "checked": sum(q["kind"] == "lookahead" for q in points),
                              "by": [q["variant"] for q in losses]},
        "wino_over_fast_dllm": {"met": bool(wins), "by": wins,
                                "aups": {c: (v, aups.get(base_of(c, "wino", curves) or ""))
                                         for c, v in wino.items()}},
    }}


def _f(v: Any, digits: int, signed: bool = False) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "–"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def compare_markdown(name: str, result: dict) -> list[str]:
    """The task's section: the table and the three target lines (empty without variants)."""
    if not result["points"]:
        return []
    md = [f"### {name}: lookahead and revocable decoding against their base", "",
          "Each point against its base curve, unmatched by interpolation: at equal NFE the base's best "
          "accuracy with no more NFE; at equal accuracy the base's most tokens per forward with at least "
          "that accuracy (tokens per forward: the mean of G / NFE over samples), and the forwards ratio: the "
          "fewest mean NFE of a base point with at least that accuracy over the variant's (total tokens "
          "over total forwards).",
          "",
          "| variant | base | accuracy | NFE | tokens/forward | base at ≤ NFE | Δ accuracy (points) "
          "| base at ≥ accuracy | tokens/forward ratio | forwards ratio |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for q in result["points"]:
        vals = [q["variant"], q["base"], _f(q["accuracy"], 3), _f(q["nfe"], 2), _f(q["tpf"], 2),
                f"{q['base_at_nfe'] or '–'} ({_f(q['base_acc_at_nfe'], 3)})",
                _f(q["delta_points"], 1, signed=True),
                f"{q['base_at_acc'] or '–'} ({_f(q['base_tpf_at_acc'], 2)})", _f(q["tpf_ratio"], 2),
                _f(q["nfe_ratio"], 2)]
        md.append("| " + " | ".join(v.replace("|", "\\|") for v in vals) + " |")
    t = result["targets"]
    mark = lambda ok: "✓" if ok else "✗"  # noqa: E731
    md += ["", f"- a gain (≥ +{GAIN_POINTS:g} points at equal NFE or ≥ {TPF_RATIO:g}× tokens per forward at "
               f"equal accuracy, by both ratios): {', '.join(t['gain']['by']) or 'none'} "
               f"{mark(t['gain']['met'])}",
           f"- lookahead never more than {LOOKAHEAD_LOSS:g} point below its base at equal NFE "
           f"({t['lookahead_no_loss']['checked']} points): "
           + (f"below: {', '.join(t['lookahead_no_loss']['by'])}" if t['lookahead_no_loss']['by']
              else "none below")
           + f" {mark(t['lookahead_no_loss']['met'])}",
           "- WINO's AUP over Fast-dLLM's: "
           + ("; ".join(f"{c} {_f(v, 1)} vs {_f(b, 1)}"
                        for c, (v, b) in t["wino_over_fast_dllm"]["aups"].items())
              or "no WINO curve") + f" {mark(t['wino_over_fast_dllm']['met'])}", ""]
    return md


def compare_summary(tasks: dict[str, dict]) -> str:
    """One headline line over the tasks' ``against_base`` entries."""
    have = {n: t["against_base"] for n, t in tasks.items() if t.get("against_base", {}).get("points")}
    if not have:
        return ""
    gain = [n for n, r in have.items() if r["targets"]["gain"]["met"]]
    loss = [n for n, r in have.items() if not r["targets"]["lookahead_no_loss"]["met"]]
    wino = [n for n, r in have.items() if r["targets"]["wino_over_fast_dllm"]["met"]]
    return (f"- **Lookahead and revocable decoding** (targets: a gain at equal NFE or accuracy, never a "
            f"loss, against the same controller without them): a gain on {len(gain)} of {len(have)} "
            f"task(s){': ' + ', '.join(gain) if gain else ''} (goal: 2); lookahead more than 1 point below "
            f"its base at equal NFE on {len(loss)}{': ' + ', '.join(loss) if loss else ''} (goal: none); "
            f"WINO's AUP above Fast-dLLM's on {len(wino)}{': ' + ', '.join(wino) if wino else ''} (goal: 1)")
