"""The report's comparison layer: typed points, one matcher, and the three comparisons built on it.

A result row (:func:`adaptive_decoding.experiments.report.aggregate`, or ``adec bench``'s) becomes a :class:`Point`.
:func:`match` finds the point of a pool that best meets **one bound**, without interpolation:

* under an **accuracy floor**: the most tokens per forward among the points whose accuracy (or
  quality) is at least the floor (``objective="nfe"``: the fewest mean NFE);
* under an **NFE budget**: the best accuracy among the points with no more NFE than the budget.

Three comparisons use it, each with a markdown section and the targets of the experiment file
(:mod:`adaptive_decoding.experiments.targets`; without them every ratio is shown for scale, unjudged):

* **matched accuracy** (:func:`matched_points`): per curve (a sweep's points share ``curve``; a
  single strategy is a curve of one point) its most parallel point no more than 1 point below the
  one-token-per-step reference (the task's row of kind ``reference``; ties: the better quality),
  and the ratios of tokens per forward at those points: the best baseline over the worst
  (*baseline spread*), the oracle over the best baseline (*oracle room*), the best curve of each
  controller kind over the best baseline, and with a learned curve the best learned one over the best
  non-learned one (baseline, heuristic or tuned), over the best hand rule (heuristic) and over the
  oracle (for scale: a per-position hindsight bound). Each ratio line also gives the same two
  points' ratio of mean NFE (total forwards) where the two differ. Only a higher-is-better quality
  that is a fraction in [0, 1] is matched; another task gets a note instead;
* **against the base** (:func:`against_base`): a lookahead or revocable curve against the same
  controller without them (:func:`base_of`): each point at equal NFE (Δ accuracy in points) and at
  equal accuracy (the tokens-per-forward ratio, and the forwards ratio: the base's fewest mean NFE
  reaching that accuracy over the point's);
* **against the best** (:func:`against_best`): every learned point against the pool of all
  non-learned points of its task, every non-learned lookahead point against the same pool without
  the lookahead curves, matched as against the base.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from adaptive_decoding.experiments.plots import KIND_ORDER, curves_of
from adaptive_decoding.experiments.tables import MISSING, figure, markdown_table
from adaptive_decoding.experiments.targets import AgainstBaseTargets, MatchedTargets

TOLERANCE = 0.01
CONTROLLER_KINDS = ("heuristic", "tuned", "learned")
NON_LEARNED = ("baseline", "heuristic", "tuned")
NONE_WITHIN = "no point within 1 point"
EPS = 1e-9  # "no more than 1 point below" includes exactly 1 point below, whatever the float rounding
_SUFFIX = re.compile(r"^(?P<stem>.*?)(?P<suffix> \(T=[^)]*\))?$")


# ====================================================================== the typed point and the matcher
@dataclass
class Point:
    """One strategy's result on one task, as the comparisons read it.

    ``tpf`` is the tokens per forward every comparison uses; ``tpf_mean`` (the per-sample mean)
    is carried where a row has it. ``get`` and ``[]`` read a field by name, so code written for
    result rows (:func:`adaptive_decoding.experiments.plots.curves_of`) takes points too."""

    strategy: str
    curve: str
    kind: str = "heuristic"
    task: str = ""
    accuracy: Optional[float] = None
    quality: Optional[float] = None
    nfe: Optional[float] = None
    tpf: Optional[float] = None
    tpf_mean: Optional[float] = None
    aup: Optional[float] = None
    lookahead: bool = False
    controller: Optional[str] = None
    params: dict = field(default_factory=dict)
    sweep: Optional[dict] = None
    decode: dict = field(default_factory=dict)
    quality_metric: str = "accuracy"
    higher_is_better: bool = True
    n: Optional[int] = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> "Point":
        """The point of a result row (a ``quality`` defaults to the ``accuracy``, a ``curve`` to the
        strategy)."""
        accuracy = row.get("accuracy")
        quality = row.get("quality")
        return cls(strategy=row["strategy"], curve=row.get("curve") or row["strategy"],
                   kind=row.get("kind") or "heuristic", task=row.get("task") or "", accuracy=accuracy,
                   quality=accuracy if quality is None else quality, nfe=row.get("nfe"), tpf=row.get("tpf"),
                   tpf_mean=row.get("tpf_mean"), aup=row.get("aup"), lookahead=bool(row.get("lookahead")),
                   controller=row.get("controller"), params=dict(row.get("params") or {}),
                   sweep=row.get("sweep"), decode=dict(row.get("decode") or {}),
                   quality_metric=row.get("quality_metric") or "accuracy",
                   higher_is_better=bool(row.get("higher_is_better", True)), n=row.get("n"))

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)


Rows = Sequence[Union[Point, Mapping[str, Any]]]


def as_points(rows: Rows) -> list[Point]:
    """``rows`` as points (a point is kept as it is)."""
    return [r if isinstance(r, Point) else Point.of(r) for r in rows]


def _last(value: Optional[float], worst: float = -math.inf) -> float:
    return worst if value is None else value


def match(pool: Iterable[Point], *, floor: Optional[float] = None, budget: Optional[float] = None,
          on: str = "accuracy", objective: str = "tpf", higher_is_better: bool = True) -> Optional[Point]:
    """The point of ``pool`` that best meets one bound (exactly one of ``floor`` and ``budget``).

    * ``floor``: among the points whose ``on`` (``"accuracy"`` or ``"quality"``) is at least ``floor``
      (at most, when ``higher_is_better`` is false), the one with the most tokens per forward
      (``objective="tpf"``) or the fewest mean NFE (``objective="nfe"``, a positive NFE);
    * ``budget``: among the points with NFE at most ``budget``, the one with the best ``on``.

    Ties go to the better ``on``, then the fewer NFE (the more tokens per forward), then the first in
    ``pool``. A point lacking the bounded figure or the objective is left out; ``None`` when no point
    qualifies."""
    if (floor is None) == (budget is None):
        raise ValueError("match needs exactly one bound: an accuracy floor or an NFE budget")
    sign = 1.0 if higher_is_better else -1.0

    def score(p: Point) -> Optional[float]:
        value = getattr(p, on)
        return None if value is None else sign * value

    if budget is not None:
        ok = [p for p in pool if p.nfe is not None and p.nfe <= budget + EPS and score(p) is not None]
        return max(ok, key=lambda p: (score(p), -p.nfe, _last(p.tpf)), default=None)
    ok = [p for p in pool if score(p) is not None and score(p) >= sign * floor - EPS]
    if objective == "nfe":
        ok = [p for p in ok if p.nfe]
        return max(ok, key=lambda p: (-p.nfe, score(p), _last(p.tpf)), default=None)
    ok = [p for p in ok if p.tpf is not None]
    return max(ok, key=lambda p: (p.tpf, score(p), -_last(p.nfe, math.inf)), default=None)


def match_point(p: Point, pool: Sequence[Point], name: str) -> dict[str, Any]:
    """Point ``p`` against ``pool``: ``{name}_at_nfe`` (the pool's best accuracy within p's NFE) with
    its ``{name}_acc_at_nfe`` and ``delta_points``; ``{name}_at_acc`` (the pool's most tokens per
    forward at p's accuracy or more) with its ``{name}_tpf_at_acc`` and ``tpf_ratio``; ``nfe_ratio``,
    the pool's fewest mean NFE reaching p's accuracy over p's. ``None`` where the pool has no such point."""
    at_nfe, at_acc = match(pool, budget=p.nfe), match(pool, floor=p.accuracy)
    fewest = match(pool, floor=p.accuracy, objective="nfe")
    return {
        f"{name}_at_nfe": at_nfe.strategy if at_nfe else None,
        f"{name}_acc_at_nfe": at_nfe.accuracy if at_nfe else None,
        "delta_points": 100.0 * (p.accuracy - at_nfe.accuracy) if at_nfe else None,
        f"{name}_at_acc": at_acc.strategy if at_acc else None,
        f"{name}_tpf_at_acc": at_acc.tpf if at_acc else None,
        "tpf_ratio": p.tpf / at_acc.tpf if at_acc and at_acc.tpf else None,
        "nfe_ratio": fewest.nfe / p.nfe if fewest and p.nfe else None,
    }


def _mark(met: Optional[bool]) -> str:
    return "" if met is None else "✓" if met else "✗"


def _quality_name(metric: str) -> str:
    return "accuracy" if metric == "accuracy" else metric


# ====================================================================== matched accuracy
def _ratio(num: Optional[dict], den: Optional[dict], target: Optional[float],
           strict: bool = False) -> dict[str, Any]:
    """``num``'s tokens per forward over ``den``'s against ``target`` (``strict``: ratio > target;
    ``None``: no target, ``met`` ``None``)."""
    value = num["tpf"] / den["tpf"] if num and den and den["tpf"] else None
    met = None if target is None else \
        value is not None and (value > target + EPS if strict else value >= target - EPS)
    forwards = den["nfe"] / num["nfe"] if num and den and num.get("nfe") and den.get("nfe") else None
    return {"value": value, "target": target, "met": met, "forwards": forwards,
            "of": num["curve"] if num else None, "over": den["curve"] if den else None,
            "of_tpf": num["tpf"] if num else None, "over_tpf": den["tpf"] if den else None}


def _no_table(ref: Optional[Point], points: Sequence[Point]) -> Optional[str]:
    """Why a task gets no matched table (``None``: it gets one)."""
    q = points[0].quality_metric if points else "accuracy"
    if ref is None:
        return "no matched-accuracy table: no reference (one-token-per-step) row on this task"
    if not ref.higher_is_better:
        return f"no matched-accuracy table: {q} is lower-is-better, matching needs an accuracy"
    if any(not -EPS <= p.quality <= 1 + EPS for pts in curves_of(points).values() for p in pts):
        return f"no matched-accuracy table: {q} is not a fraction in [0, 1]"
    return None


def _matched_point(curve: str, pts: Sequence[Point], threshold: float, aups: dict) -> dict[str, Any]:
    """One curve's matched point (its numbers ``None`` when no point is within the tolerance)."""
    best = match(pts, floor=threshold, on="quality")
    return {"curve": curve, "kind": pts[0].kind, "strategy": best.strategy if best else None,
            **{k: (getattr(best, k) if best else None) for k in ("quality", "accuracy", "nfe", "tpf", "tpf_mean")},
            "aup": aups.get(curve)}


def _matched_targets(points: list[dict], targets: MatchedTargets) -> dict[str, Any]:
    """The ratios at the matched points, each judged against its target."""
    def best(kind: str, worst: bool = False) -> Optional[dict]:
        sel = [p for p in points if p["kind"] == kind and p["tpf"]]
        return (min if worst else max)(sel, key=lambda p: p["tpf"], default=None)

    top = best("baseline")
    two = sum(p["kind"] == "baseline" and bool(p["tpf"]) for p in points) > 1
    out = {"baseline_spread": _ratio(top, best("baseline", worst=True) if two else None, targets.baseline_spread),
           "oracle_room": _ratio(best("oracle"), top, targets.oracle_room),
           "controllers": {k: _ratio(best(k), top, targets.controller_over_baseline, strict=True)
                           for k in CONTROLLER_KINDS if any(p["kind"] == k for p in points)}}
    if any(p["kind"] == "learned" for p in points):
        hand = max((p for p in points if p["kind"] in NON_LEARNED and p["tpf"]), key=lambda p: p["tpf"],
                   default=None)
        out["learned"] = {
            "over_non_learned": _ratio(best("learned"), hand, targets.learned_over_non_learned),
            "of_hand_rule": _ratio(best("learned"), best("heuristic"), targets.learned_over_hand_rule),
            "of_oracle": _ratio(best("learned"), best("oracle"), None),
        }
    return out


def matched_points(rows: Rows, aups: Optional[dict] = None, tolerance: float = TOLERANCE,
                   targets: Optional[MatchedTargets] = None) -> dict[str, Any]:
    """One task's matched table: ``{"reference": strategy, "threshold", "note", "noise", "n_examples",
    "points": [...], "targets": {"baseline_spread", "oracle_room", "controllers": {kind: ...},
    "learned"?}}``. ``points``: one per curve of a kind of :data:`KIND_ORDER` (by kind, then most tokens
    per forward first), ``{"curve", "kind", "strategy", "quality", "accuracy", "nfe", "tpf", "tpf_mean",
    "aup"}``. A ratio: ``{"value", "target", "met", "forwards", "of", "over", "of_tpf", "over_tpf"}``.
    Without a table (``note`` says why) ``points`` is empty and ``targets`` ``{}``."""
    points = as_points(rows)
    out: dict[str, Any] = {"reference": None, "threshold": None, "note": None, "points": [], "targets": {},
                           "noise": None, "n_examples": None}
    ref = next((p for p in points if p.kind == "reference" and p.quality is not None), None)
    out["note"] = _no_table(ref, points)
    if out["note"]:
        return out
    threshold = ref.quality - tolerance
    out["reference"], out["threshold"] = ref.strategy, threshold
    out["noise"], out["n_examples"] = noise_points(ref.quality, ref.n), ref.n
    matched = [_matched_point(c, pts, threshold, aups or {}) for c, pts in curves_of(points).items()
               if pts[0].kind in KIND_ORDER]
    matched.sort(key=lambda p: (KIND_ORDER.index(p["kind"]), p["tpf"] is None, -(p["tpf"] or 0.0)))
    out["points"] = matched
    out["targets"] = _matched_targets(matched, targets or MatchedTargets())
    return out


def noise_points(p: float, n: Optional[int]) -> Optional[float]:
    """Half-width in points of a 95% interval for an accuracy ``p`` measured on ``n`` examples
    (normal approximation, 1.96·√(p(1 − p)/n)); ``None`` without ``n``."""
    if not n or n <= 0:
        return None
    return 100.0 * 1.96 * math.sqrt(max(p * (1.0 - p), 0.0) / n)


def noise_sentence(half: Optional[float], n: Optional[int], quality: str = "accuracy") -> str:
    """Why a 1-point match is fragile at this sample size ('' when the size is unknown)."""
    if half is None or not n:
        return ""
    return (f" On {n} examples a cell's {quality} has a 95% interval of about ±{half:.1f} points at the "
            f"reference's value (unpaired; two strategies on the same examples differ by less)"
            + (", wider than the 1-point tolerance: a curve's matched point is partly its luckiest one; "
               "repeat close comparisons on more examples." if half > 1.0 else "."))


def _ratio_line(label: str, t: dict, missing: str, strict: bool = False) -> str:
    """One ratio line: the two points, the ratio, the target (none: for scale) and the mark."""
    target = "for scale, no target" if t["target"] is None else f"target {'>' if strict else '≥'} {t['target']:g}×"
    if t["value"] is None:
        return f"- {label}: – ({missing}; {target}) {_mark(t['met']) or '–'}".rstrip()
    shown = t.get("forwards") and f"{t['forwards']:.2f}" != f"{t['value']:.2f}"  # only where the two differ
    forwards = f"; in total forwards (mean NFE) {t['forwards']:.2f}×" if shown else ""
    return (f"- {label}: {t['of']} ({figure(t['of_tpf'], 2)}) / {t['over']} "
            f"({figure(t['over_tpf'], 2)}) = {t['value']:.2f}× ({target}{forwards}) {_mark(t['met'])}").rstrip()


def _matched_lines(t: dict) -> list[str]:
    """The ratio lines under the matched table."""
    md = [_ratio_line("baseline spread (best / worst baseline)", t["baseline_spread"],
                      "needs two baselines within 1 point"),
          _ratio_line("oracle room (oracle / best baseline)", t["oracle_room"],
                      "needs the oracle and a baseline within 1 point")]
    md += [_ratio_line(f"best {kind} / best baseline", ct, f"needs a {kind} curve and a baseline within 1 point",
                       strict=True) for kind, ct in t["controllers"].items()]
    if "learned" in t:
        md += [_ratio_line("best learned / best non-learned (baseline, heuristic, tuned)",
                           t["learned"]["over_non_learned"], "needs a learned and a non-learned curve within 1 point"),
               _ratio_line("best learned / best hand rule (heuristic)", t["learned"]["of_hand_rule"],
                           "needs a learned and a heuristic curve within 1 point"),
               _ratio_line("best learned / oracle", t["learned"]["of_oracle"],
                           "needs a learned curve within 1 point and the oracle")]
    return md


def matched_markdown(name: str, matched: dict, quality_metric: str = "accuracy") -> list[str]:
    """The task's matched-accuracy section (a table and the ratio lines, or the note)."""
    md = [f"### {name}: matched accuracy", ""]
    if matched["note"]:
        return md + [matched["note"][0].upper() + matched["note"][1:] + ".", ""]
    qname = _quality_name(quality_metric)
    md += [f"Each curve's most parallel point no more than 1 point below the reference "
           f"({matched['reference']}: {qname} ≥ {matched['threshold']:.3f}); tokens per forward compared at "
           f"that point." + noise_sentence(matched.get("noise"), matched.get("n_examples"), qname), ""]
    extra = qname != "accuracy"
    head = ["curve", "kind", "matched point", qname, *(["accuracy"] if extra else []),
            "NFE", "tokens per forward", "AUP of the curve"]
    body = [[p["curve"], p["kind"], p["strategy"] or NONE_WITHIN, figure(p["quality"], 3),
             *([figure(p["accuracy"], 3)] if extra else []), figure(p["nfe"], 2), figure(p["tpf"], 2),
             figure(p["aup"], 1)] for p in matched["points"]]
    return md + markdown_table(head, body) + [""] + _matched_lines(matched["targets"]) + [""]


def both_met(matched: dict) -> bool:
    """Whether a task's matched table meets both the baseline-spread and the oracle-room target."""
    t = matched.get("targets") or {}
    return bool(t) and bool(t["baseline_spread"]["met"]) and bool(t["oracle_room"]["met"])


def matched_summary(tasks: dict[str, dict]) -> dict[str, Any]:
    """Over the tasks' ``matched`` entries: how many have a table, meet each target, meet both."""
    with_table = [n for n, t in tasks.items() if t.get("matched", {}).get("targets")]
    met = {k: [n for n in with_table if tasks[n]["matched"]["targets"][k]["met"]]
           for k in ("baseline_spread", "oracle_room")}
    both = [n for n in with_table if both_met(tasks[n]["matched"])]
    return {"tasks": len(tasks), "with_table": len(with_table),
            "baseline_spread_met": len(met["baseline_spread"]),
            "oracle_room_met": len(met["oracle_room"]), "both_met": len(both), "both_met_on": both}


def _values(values: Iterable[Any], form: str = "{}") -> str:
    """The distinct declared values (``None`` left out), formatted and joined: '' when there is none."""
    found = sorted({v for v in values if v is not None})
    return " / ".join(form.format(v) for v in found)


def summary_line(s: dict, targets: Sequence[MatchedTargets] = ()) -> str:
    """The headline's matched-accuracy line: the count of tasks meeting both targets, against the goal
    of the experiment files (``targets``: each reported experiment's)."""
    spread = _values((t.baseline_spread for t in targets), "{:g}")
    room = _values((t.oracle_room for t in targets), "{:g}")
    if not spread and not room:
        return ("- **Matched accuracy**: no targets declared (`targets.matched` in the experiment file); "
                "each task's ratios at matched accuracy are shown for scale")
    on = f": {', '.join(s['both_met_on'])}" if s["both_met_on"] else ""
    goal = _values(t.tasks for t in targets)
    return (f"- **Matched accuracy** (targets: baseline spread and oracle room, at no more than 1 point "
            f"below one token per step): both targets met on {s['both_met']} of {s['with_table']} task(s) "
            f"with a matched table{on} (baseline spread ≥ {spread or '–'}× on {s['baseline_spread_met']}, "
            f"oracle room ≥ {room or '–'}× on {s['oracle_room_met']}"
            + (f"; the goal: at least {goal} tasks)" if goal else ")"))


# ====================================================================== against the base
def _revocable(controller: Optional[str]) -> bool:
    if not controller:
        return False
    try:
        from adaptive_decoding.framework.engine.controller import CONTROLLERS

        return bool(getattr(CONTROLLERS.get(controller), "revocable", False))
    except Exception:  # noqa: BLE001 - an unknown controller is simply no revocable one
        return False


def base_of(curve: str, controller: Optional[str], curves: set[str], point: Optional[Point] = None,
            by_curve: Optional[Mapping[str, Sequence[Point]]] = None) -> Optional[str]:
    """The base curve of ``curve`` among ``curves``, or ``None``:

    * a curve labelled ``"X + …"`` has base ``X`` when that is a curve of the task (a temperature label
      keeps its suffix: ``margin_topk (T=1) + lookahead`` → ``margin_topk (T=1)``);
    * a revocable wrapper's curve (``verified``: parameters ``inner`` and ``inner_params``; ``point``
      is one of its points, ``by_curve`` every curve's points) has as base the curve of its inner
      controller with the same inner parameters and decoding (the swept knob aside);
    * another revocable controller's curve (``wino``, ``remdm``) has base ``fast_dllm`` with the same
      suffix: without re-masking both are Fast-dLLM's threshold rule."""
    if " + " in curve:
        head = curve.split(" + ", 1)[0]
        if head in curves and head != curve:
            return head
    if not _revocable(controller):
        return None
    if point is not None and "inner" in point.params:
        return _inner_curve(curve, point, by_curve or {})
    m = _SUFFIX.match(curve.split(" + ", 1)[0])
    base = "fast_dllm" + ((m.group("suffix") or "") if m else "")
    return base if base in curves else None


def _inner_curve(curve: str, point: Point, by_curve: Mapping[str, Sequence[Point]]) -> Optional[str]:
    """The curve whose controller is ``point``'s inner one, with the same inner parameters and decoding."""
    inner, inner_params = point.params["inner"], dict(point.params.get("inner_params") or {})
    swept = {k.split(".", 1)[1] for k in (point.sweep or {}) if k.startswith("inner_params.")}
    for other, pts in by_curve.items():
        r = pts[0]
        if other == curve or r.controller != inner or r.decode != point.decode:
            continue
        ignore = swept | set(r.sweep or {})
        if ({k: v for k, v in r.params.items() if k not in ignore}
                == {k: v for k, v in inner_params.items() if k not in ignore}):
            return other
    return None


def _variant_points(by_curve: Mapping[str, Sequence[Point]]) -> list[dict]:
    """Every point of a lookahead or revocable curve that has a base, matched against the base."""
    curves = set(by_curve)
    out = []
    for curve, pts in by_curve.items():
        base = base_of(curve, pts[0].controller, curves, pts[0], by_curve)
        looks = any(p.lookahead for p in pts)
        if base is None or not (looks or _revocable(pts[0].controller)):
            continue  # e.g. "fast_dllm + eos_fill": a variant, but neither lookahead nor revocable
        kind = "lookahead" if looks else "revocable"
        for p in sorted(pts, key=lambda q: q.tpf):
            out.append({"variant": p.strategy, "curve": curve, "base": base, "kind": kind, "accuracy": p.accuracy,
                        "nfe": p.nfe, "tpf": p.tpf, **match_point(p, by_curve[base], "base")})
    return out


def _gains(points: list[dict], targets: AgainstBaseTargets) -> dict[str, Any]:
    """The gain target: points ≥ ``gain_points`` above their base at equal NFE, or ≥ ``gain_ratio`` by
    both ratios at equal accuracy (``met`` ``None`` without either threshold)."""
    gp, gr = targets.gain_points, targets.gain_ratio
    if gp is None and gr is None:
        return {"met": None, "by": []}
    by = [q["variant"] for q in points
          if (gp is not None and _last(q["delta_points"]) >= gp - EPS)
          or (gr is not None and min(q["tpf_ratio"] or 0.0, q["nfe_ratio"] or 0.0) >= gr - EPS)]
    return {"met": bool(by), "by": by}


def _wino(curves: set[str], aups: dict) -> dict[str, Any]:
    """WINO's curves' AUP against Fast-dLLM's (their base), in the curves' name order (a set's order
    changes between runs)."""
    wino = {c: aups[c] for c in sorted(curves) if c.startswith("wino") and c in aups}
    wins = [c for c, v in wino.items() if (b := base_of(c, "wino", curves)) and b in aups and v > aups[b]]
    return {"met": bool(wins), "by": wins,
            "aups": {c: (v, aups.get(base_of(c, "wino", curves) or "")) for c, v in wino.items()}}


def against_base(rows: Rows, aups: Optional[dict] = None,
                 targets: Optional[AgainstBaseTargets] = None) -> dict[str, Any]:
    """One task's lookahead and revocable curves against their base: ``{"points": [...], "targets":
    {"gain", "lookahead_no_loss", "wino_over_fast_dllm"}}`` (``met`` ``None`` where the experiment
    declares no threshold)."""
    targets = targets or AgainstBaseTargets()
    by_curve: "OrderedDict[str, list[Point]]" = OrderedDict()
    for p in as_points(rows):
        by_curve.setdefault(p.curve, []).append(p)
    points = _variant_points(by_curve)
    loss = targets.lookahead_loss_points
    losses = [] if loss is None else [q["variant"] for q in points if q["kind"] == "lookahead"
                                      and q["delta_points"] is not None and q["delta_points"] < -loss - EPS]
    return {"points": points, "targets": {
        "gain": _gains(points, targets),
        "lookahead_no_loss": {"met": None if loss is None else not losses,
                              "checked": sum(q["kind"] == "lookahead" for q in points), "by": losses},
        "wino_over_fast_dllm": _wino(set(by_curve), aups or {}),
    }}


def _against_base_lines(t: dict, targets: AgainstBaseTargets) -> list[str]:
    """The target lines under the against-the-base table (a line without its threshold left out)."""
    md = []
    gain = ([f"≥ +{targets.gain_points:g} points at equal NFE"] if targets.gain_points is not None else []) + \
        ([f"≥ {targets.gain_ratio:g}× tokens per forward at equal accuracy, by both ratios"]
         if targets.gain_ratio is not None else [])
    if gain:
        md.append(f"- a gain ({' or '.join(gain)}): {', '.join(t['gain']['by']) or 'none'} "
                  f"{_mark(t['gain']['met'])}")
    no_loss = t["lookahead_no_loss"]
    if targets.lookahead_loss_points is not None:
        md.append(f"- lookahead never more than {targets.lookahead_loss_points:g} point below its base at equal "
                  f"NFE ({no_loss['checked']} points): "
                  + (f"below: {', '.join(no_loss['by'])}" if no_loss["by"] else "none below")
                  + f" {_mark(no_loss['met'])}")
    wino = t["wino_over_fast_dllm"]
    md.append("- WINO's AUP over Fast-dLLM's: "
              + ("; ".join(f"{c} {figure(v, 1)} vs {figure(b, 1)}" for c, (v, b) in wino["aups"].items())
                 or "no WINO curve") + f" {_mark(wino['met'])}")
    return md


def against_base_markdown(name: str, result: dict, targets: Optional[AgainstBaseTargets] = None) -> list[str]:
    """The task's section: the table and the target lines (empty without variants)."""
    if not result["points"]:
        return []
    md = [f"### {name}: lookahead and revocable decoding against their base", "",
          "Each point against its base curve, unmatched by interpolation: at equal NFE the base's best "
          "accuracy with no more NFE; at equal accuracy the base's most tokens per forward with at least "
          "that accuracy (tokens per forward pooled: answer tokens summed over the examples / forwards "
          "summed over them), and the forwards ratio: the fewest mean NFE of a base point with at least "
          "that accuracy over the variant's.", ""]
    head = ["variant", "base", "accuracy", "NFE", "tokens/forward", "base at ≤ NFE", "Δ accuracy (points)",
            "base at ≥ accuracy", "tokens/forward ratio", "forwards ratio"]
    md += markdown_table(head, [[q["variant"], q["base"], *_matched_cells(q, "base")] for q in result["points"]])
    return md + [""] + _against_base_lines(result["targets"], targets or AgainstBaseTargets()) + [""]


def _matched_cells(q: dict, name: str) -> list[str]:
    """A compared point's cells from its accuracy on: its figures, the pool's point at equal NFE and
    at equal accuracy, and the two ratios."""
    return [figure(q["accuracy"], 3), figure(q["nfe"], 2), figure(q["tpf"], 2),
            f"{q[f'{name}_at_nfe'] or MISSING} ({figure(q[f'{name}_acc_at_nfe'], 3)})",
            figure(q["delta_points"], 1, signed=True),
            f"{q[f'{name}_at_acc'] or MISSING} ({figure(q[f'{name}_tpf_at_acc'], 2)})",
            figure(q["tpf_ratio"], 2), figure(q["nfe_ratio"], 2)]


def against_base_summary(tasks: dict[str, dict], targets: Sequence[AgainstBaseTargets] = ()) -> str:
    """One headline line over the tasks' ``against_base`` entries ('' without any), with the goals of
    the experiment files (``targets``: each reported experiment's)."""
    have = {n: t["against_base"] for n, t in tasks.items() if t.get("against_base", {}).get("points")}
    if not have:
        return ""
    gain = [n for n, r in have.items() if r["targets"]["gain"]["met"]]
    loss = [n for n, r in have.items() if r["targets"]["lookahead_no_loss"]["met"] is False]
    wino = [n for n, r in have.items() if r["targets"]["wino_over_fast_dllm"]["met"]]
    names = lambda xs: ": " + ", ".join(xs) if xs else ""  # noqa: E731
    goal = lambda key: (f" (goal: {v})" if (v := _values(getattr(t, key) for t in targets)) else "")  # noqa: E731
    parts = []
    if any(t.gain_points is not None or t.gain_ratio is not None for t in targets):
        parts.append(f"a gain on {len(gain)} of {len(have)} task(s){names(gain)}{goal('gain_tasks')}")
    if points := _values((t.lookahead_loss_points for t in targets), "{:g}"):
        parts.append(f"lookahead more than {points} point below its base at equal NFE on {len(loss)}"
                     f"{names(loss)} (goal: none)")
    parts.append(f"WINO's AUP above Fast-dLLM's on {len(wino)}{names(wino)}{goal('wino_tasks')}")
    return ("- **Lookahead and revocable decoding** (targets: a gain at equal NFE or accuracy, never a loss, "
            "against the same controller without them): " + "; ".join(parts))


# ====================================================================== against the best
def is_contender(p: Point) -> bool:
    """A point compared with the pool: a learned controller's, or one that decodes with lookahead."""
    return p.kind == "learned" or p.lookahead


def against_best(rows: Rows) -> dict[str, Any]:
    """One task's learned and lookahead points against the best non-learned curve: ``{"points": [...],
    "pool": n, "pool_with_lookahead": m}``; each point names the pool's point it is matched with at
    equal NFE and at equal accuracy, with Δ points and both ratios (a learned point against all ``m``
    non-learned points, a non-learned lookahead one against the ``n`` without lookahead)."""
    points = as_points(rows)
    every = [p for p in points if p.kind in NON_LEARNED]
    pool = [p for p in every if not p.lookahead]
    out = []
    for p in sorted((p for p in points if is_contender(p)), key=lambda p: (p.curve, p.tpf)):
        out.append({"strategy": p.strategy, "curve": p.curve, "kind": p.kind, "lookahead": p.lookahead,
                    "accuracy": p.accuracy, "nfe": p.nfe, "tpf": p.tpf,
                    **match_point(p, every if p.kind == "learned" else pool, "best")})
    return {"points": out, "pool": len(pool), "pool_with_lookahead": len(every)}


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
          "accuracy, and the forwards ratio (the pool's fewest mean NFE reaching it over the point's).", ""]
    head = ["point", "kind", "accuracy", "NFE", "tokens/forward", "best non-learned at ≤ NFE",
            "Δ accuracy (points)", "best non-learned at ≥ accuracy", "tokens/forward ratio", "forwards ratio"]
    body = [[q["strategy"], q["kind"] + (" + lookahead" if q["lookahead"] and q["kind"] != "learned" else ""),
             *_matched_cells(q, "best")] for q in result["points"]]
    return md + markdown_table(head, body) + [""]
