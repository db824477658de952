"""Matched accuracy: each curve's most parallel point no more than 1 point below the reference.

The targets compare strategies *at matched accuracy*: the quality of one-token-per-step
decoding (the task's row of kind ``reference``) less ``tolerance`` (0.01, one point of a fraction in
[0, 1]). Per task:

* the **matched point** of a curve (a sweep's points share ``curve``; a single strategy is a curve of
  one point) is its point with the most tokens per forward whose quality is ≥ reference − 0.01
  (ties: the better quality); a curve none of whose points qualifies has none;
* **baseline spread**: the best baseline's tokens per forward at its matched point over the worst
  baseline's (baselines without a matched point left out; needs two), target ≥ 2×;
* **oracle room**: the oracle's tokens per forward (at its matched point; it reproduces the
  reference) over the best baseline's, target ≥ 2× (room for better controllers);
* per controller kind (heuristic, tuned, learned) present: its best curve over the best baseline,
  target > 1× (the controller beats every published sampler at matched accuracy);
* with a learned curve: the best learned curve over the best non-learned one (baseline,
  heuristic or tuned), target ≥ 1× (not below it); over the best hand rule (heuristic), target
  ≥ 0.9×; and over the oracle, for scale (no target: the oracle is a per-position hindsight bound).

Tokens per forward is the mean over samples of G / NFE; each ratio line also gives the same two
points' ratio of mean NFE (total tokens over total forwards), which a curve with a ragged NFE cannot
inflate, where the two differ. The targets are judged on tokens per forward.

Only a higher-is-better quality that is a fraction in [0, 1] is matched; any other task (perplexity,
a task without a reference) gets a note instead of a table.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from experiments.plots import KIND_ORDER, curves_of

TOLERANCE = 0.01
SPREAD_TARGET = 2.0
ROOM_TARGET = 2.0
CONTROLLER_KINDS = ("heuristic", "tuned", "learned")
#: the learned-controller targets at matched accuracy: the best learned curve not below the best non-learned
#: one (baseline, heuristic or tuned), and at least 90 % of the best hand rule's (heuristic) tokens per forward
NON_LEARNED = ("baseline", "heuristic", "tuned")
LEARNED_TARGET = 1.0
LEARNED_HAND_RULE_SHARE = 0.9
NONE_WITHIN = "no point within 1 point"
_EPS = 1e-9  # "no more than 1 point below" includes exactly 1 point below, whatever the float rounding


def format_figure(v: Any, digits: int) -> str:
    """``v`` with ``digits`` decimals, or an en dash when it is missing or not finite."""
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def _target(num: Optional[dict], den: Optional[dict], target: Optional[float],
            strict: bool = False) -> dict[str, Any]:
    """``num``'s tokens per forward over ``den``'s against ``target`` (``strict``: ratio > target;
    ``None``: a ratio shown for scale, ``met`` ``None``)."""
    value = num["tpf"] / den["tpf"] if num and den and den["tpf"] else None
    met = None if target is None else \
        value is not None and (value > target + _EPS if strict else value >= target - _EPS)
    forwards = den["nfe"] / num["nfe"] if num and den and num.get("nfe") and den.get("nfe") else None
    return {"value": value, "target": target, "met": met, "forwards": forwards,
            "of": num["curve"] if num else None, "over": den["curve"] if den else None,
            "of_tpf": num["tpf"] if num else None, "over_tpf": den["tpf"] if den else None}


def matched_points(rows: Sequence[dict], aups: Optional[dict] = None,
                   tolerance: float = TOLERANCE) -> dict[str, Any]:
    """One task's matched table: ``{"reference": strategy, "threshold", "note", "points": [...],
    "targets": {"baseline_spread", "oracle_room", "controllers": {kind: ...}}}``.

    ``points`` has one entry per curve of kind reference, baseline, heuristic, tuned, learned or oracle
    (by kind, then most tokens per forward first): ``{"curve", "kind", "strategy", "quality",
    "accuracy", "nfe", "tpf", "aup"}``, ``strategy`` and the numbers ``None`` where no point is within
    ``tolerance``. A target is ``{"value": ratio or None, "target", "met", "of", "over", "of_tpf",
    "over_tpf"}``. Without a table (``note`` says why) ``points`` is empty and ``targets`` ``{}``."""
    aups = aups or {}
    out: dict[str, Any] = {"reference": None, "threshold": None, "note": None, "points": [], "targets": {},
                           "noise": None, "n_examples": None}
    ref = next((r for r in rows if r["kind"] == "reference" and r.get("quality") is not None), None)
    q = rows[0]["quality_metric"] if rows else "accuracy"
    if ref is None:
        out["note"] = "no matched-accuracy table: no reference (one-token-per-step) row on this task"
        return out
    if not ref["higher_is_better"]:
        out["note"] = f"no matched-accuracy table: {q} is lower-is-better, matching needs an accuracy"
        return out
    curves = curves_of(rows)
    if any(not -_EPS <= r["quality"] <= 1 + _EPS for pts in curves.values() for r in pts):
        out["note"] = f"no matched-accuracy table: {q} is not a fraction in [0, 1]"
        return out
    threshold = ref["quality"] - tolerance
    out["reference"], out["threshold"] = ref["strategy"], threshold
    out["noise"], out["n_examples"] = noise_points(ref["quality"], ref.get("n")), ref.get("n")
    points = []
    for curve, pts in curves.items():
        kind = pts[0]["kind"]
        if kind not in KIND_ORDER:
            continue
        ok = [r for r in pts if r["quality"] >= threshold - _EPS and r["tpf"] is not None]
        best = max(ok, key=lambda r: (r["tpf"], r["quality"]), default=None)
        points.append({"curve": curve, "kind": kind, "strategy": best["strategy"] if best else None,
                       **{k: (best[k] if best else None) for k in ("quality", "accuracy", "nfe", "tpf")},
                       "aup": aups.get(curve)})
    points.sort(key=lambda p: (KIND_ORDER.index(p["kind"]), p["tpf"] is None, -(p["tpf"] or 0.0)))
    out["points"] = points

    def best_of(kind: str, worst: bool = False) -> Optional[dict]:
        sel = [p for p in points if p["kind"] == kind and p["tpf"]]
        return (min if worst else max)(sel, key=lambda p: p["tpf"], default=None)

    baselines = [p for p in points if p["kind"] == "baseline" and p["tpf"]]
    top = best_of("baseline")
    out["targets"] = {
        "baseline_spread": _target(top, best_of("baseline", worst=True) if len(baselines) > 1 else None,
                                   SPREAD_TARGET),
        "oracle_room": _target(best_of("oracle"), top, ROOM_TARGET),
        "controllers": {k: _target(best_of(k), top, 1.0, strict=True)
                        for k in CONTROLLER_KINDS if any(p["kind"] == k for p in points)},
    }
    if any(p["kind"] == "learned" for p in points):  # the targets for the learned controllers
        hand = max((p for p in points if p["kind"] in NON_LEARNED and p["tpf"]), key=lambda p: p["tpf"],
                   default=None)
        out["targets"]["learned"] = {
            "over_non_learned": _target(best_of("learned"), hand, LEARNED_TARGET),
            "of_hand_rule": _target(best_of("learned"), best_of("heuristic"), LEARNED_HAND_RULE_SHARE),
            "of_oracle": _target(best_of("learned"), best_of("oracle"), None),
        }
    return out


def noise_points(p: float, n: Optional[int]) -> Optional[float]:
    """Half-width in points of a 95% interval for an accuracy ``p`` measured on ``n`` examples
    (normal approximation, 1.96·√(p(1 − p)/n)); ``None`` without ``n``."""
    if not n or n <= 0:
        return None
    return 100.0 * 1.96 * math.sqrt(max(p * (1.0 - p), 0.0) / n)


def both_met(matched: dict) -> bool:
    t = matched.get("targets") or {}
    return bool(t) and t["baseline_spread"]["met"] and t["oracle_room"]["met"]


def _mark(t: dict) -> str:
    return "" if t["met"] is None else "✓" if t["met"] else "✗"


def noise_sentence(half: Optional[float], n: Optional[int], quality: str = "accuracy") -> str:
    """Why a 1-point match is fragile at this sample size ('' when the size is unknown)."""
    if half is None or not n:
        return ""
    return (f" On {n} examples a cell's {quality} has a 95% interval of about ±{half:.1f} points at the "
            f"reference's value (unpaired; two strategies on the same examples differ by less)"
            + (", wider than the 1-point tolerance: a curve's matched point is partly its luckiest one; "
               "repeat close comparisons on more examples." if half > 1.0 else "."))


def _ratio_line(label: str, t: dict, target_text: Optional[str], missing: str) -> str:
    """One target line: the two points, the ratio, the target (``None``: for scale) and the mark."""
    target = f"target {target_text}" if target_text else "for scale, no target"
    if t["value"] is None:
        return f"- {label}: – ({missing}; {target}) {_mark(t) or '–'}".rstrip()
    shown = t.get("forwards") and f"{t['forwards']:.2f}" != f"{t['value']:.2f}"  # only where the two differ
    forwards = f"; in total forwards (mean NFE) {t['forwards']:.2f}×" if shown else ""
    return (f"- {label}: {t['of']} ({format_figure(t['of_tpf'], 2)}) / {t['over']} "
            f"({format_figure(t['over_tpf'], 2)}) = {t['value']:.2f}× ({target}{forwards}) "
            f"{_mark(t)}").rstrip()


def matched_markdown(name: str, matched: dict, quality_metric: str = "accuracy") -> list[str]:
    """The task's matched-accuracy section (a table and the target lines, or the note)."""
    md = [f"### {name}: matched accuracy", ""]
    if matched["note"]:
        return md + [matched["note"][0].upper() + matched["note"][1:] + ".", ""]
    qname = "accuracy" if quality_metric == "accuracy" else quality_metric
    md += [f"Each curve's most parallel point no more than 1 point below the reference "
           f"({matched['reference']}: {qname} ≥ {matched['threshold']:.3f}); tokens per forward compared at "
           f"that point."
           + noise_sentence(matched.get("noise"), matched.get("n_examples"), qname), ""]
    head = ["curve", "kind", "matched point", qname, *([] if qname == "accuracy" else ["accuracy"]),
            "NFE", "tokens per forward", "AUP of the curve"]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in matched["points"]:
        vals = [p["curve"], p["kind"], p["strategy"] or NONE_WITHIN, format_figure(p["quality"], 3)]
        if qname != "accuracy":
            vals.append(format_figure(p["accuracy"], 3))
        vals += [format_figure(p["nfe"], 2), format_figure(p["tpf"], 2), format_figure(p["aup"], 1)]
        md.append("| " + " | ".join(v.replace("|", "\\|") for v in vals) + " |")
    t = matched["targets"]
    md += ["", _ratio_line("baseline spread (best / worst baseline)", t["baseline_spread"], "≥ 2×",
                           "needs two baselines within 1 point"),
           _ratio_line("oracle room (oracle / best baseline)", t["oracle_room"], "≥ 2×",
                       "needs the oracle and a baseline within 1 point")]
    for kind, ct in t["controllers"].items():
        md.append(_ratio_line(f"best {kind} / best baseline", ct, "> 1×",
                              f"needs a {kind} curve and a baseline within 1 point"))
    if "learned" in t:
        md += [_ratio_line("best learned / best non-learned (baseline, heuristic, tuned)",
                           t["learned"]["over_non_learned"],
                           f"≥ {LEARNED_TARGET:g}×",
                           "needs a learned and a non-learned curve within 1 point"),
               _ratio_line("best learned / best hand rule (heuristic)", t["learned"]["of_hand_rule"],
                           f"≥ {LEARNED_HAND_RULE_SHARE:g}×", "needs a learned and a heuristic curve within 1 point"),
               _ratio_line("best learned / oracle", t["learned"]["of_oracle"], None,
                           "needs a learned curve within 1 point and the oracle")]
    return md + [""]


def matched_summary(tasks: dict[str, dict]) -> dict[str, Any]:
    """Over the tasks' ``matched`` entries: how many have a table, meet each target, meet both."""
    with_table = [n for n, t in tasks.items() if t.get("matched", {}).get("targets")]
    met = {k: [n for n in with_table if tasks[n]["matched"]["targets"][k]["met"]]
           for k in ("baseline_spread", "oracle_room")}
    both = [n for n in with_table if both_met(tasks[n]["matched"])]
    return {"tasks": len(tasks), "with_table": len(with_table),
            "baseline_spread_met": len(met["baseline_spread"]),
            "oracle_room_met": len(met["oracle_room"]), "both_met": len(both), "both_met_on": both}


def summary_line(s: dict) -> str:
    on = f": {', '.join(s['both_met_on'])}" if s["both_met_on"] else ""
    return (f"- **Matched accuracy** (targets: baseline spread and oracle room, at no more than 1 point "
            f"below one token per step): both targets met on {s['both_met']} of {s['with_table']} task(s) "
            f"with a matched table{on} (baseline spread ≥ 2× on {s['baseline_spread_met']}, oracle room ≥ "
            f"2× on {s['oracle_room_met']}; the goal: at least 3 tasks)")
