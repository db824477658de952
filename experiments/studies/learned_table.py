"""The learned-controller table from a report's ``benchmark.json``: per task, the best learned curve
against the best non-learned one and the oracle, at matched accuracy, with AUPs and training times.

    python -m adaptive_decoding.experiments.studies.learned_table docs/benchmark.json [runs/controllers]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from adaptive_decoding.experiments.tables import MISSING, figure, markdown_row, markdown_table


def _row(label: str, p: Optional[dict]) -> str:
    """One compared curve's row (its matched point; 'none within 1 point' without one)."""
    if p is None:
        return markdown_row([label, MISSING, "none within 1 point", MISSING, MISSING, MISSING, MISSING])
    return markdown_row([label, p["curve"], p["strategy"], figure(p["accuracy"], 3), figure(p["nfe"], 2),
                         figure(p["tpf"], 2), figure(p["aup"], 1)])


def _judged(text: str, t: dict) -> str:
    """A ratio line with the target the report judged it against (none: for scale)."""
    target = "for scale" if t.get("target") is None else f"≥ {t['target']:g}×"
    ratio = MISSING if t["value"] is None else f"{t['value']:.2f}×"
    mark = "" if t["met"] is None else " ✓" if t["met"] else " ✗"
    return f"- {text} ({target}): {ratio}{mark}"


def table(bench: dict[str, Any]) -> str:
    """Per task with learned-controller targets: the curves they compare (as ``matched_points`` chose
    them)."""
    out = []
    for name, t in bench["tasks"].items():
        m = t.get("matched") or {}
        tg = (m.get("targets") or {}).get("learned")
        if not tg:
            continue
        points = {p["curve"]: p for p in m["points"]}
        aups = t.get("aup") or {}
        top = max(((c, a) for c, a in aups.items() if points.get(c, {}).get("kind") != "oracle"),
                  key=lambda kv: kv[1] or 0.0)  # the oracle is a bound, not a contender
        best_learned = max(((c, aups.get(c) or 0.0) for c, p in points.items() if p["kind"] == "learned"),
                           key=lambda kv: kv[1])
        over, of_oracle = tg["over_non_learned"], tg["of_oracle"]
        out += [f"**{name}** (reference {m['reference']}, matched at accuracy ≥ {m['threshold']:.2f}; "
                f"highest AUP: {top[0]} {top[1]:.1f}; best learned AUP: {best_learned[0]} "
                f"{best_learned[1]:.1f})", "",
                *markdown_table(["", "curve", "matched point", "accuracy", "NFE", "tokens/forward", "AUP"], []),
                _row("best learned", points.get(over["of"])),
                _row("best non-learned", points.get(over["over"])),
                _row("oracle", points.get(of_oracle["over"])), ""]
        out += [_judged("learned / best non-learned", over), _judged("learned / best hand rule", tg["of_hand_rule"]),
                _judged("learned / oracle", of_oracle)]
        out.append("")
    return "\n".join(out)


def training_times(root: Path) -> str:
    rows = ["| policy folder | method | kinds | rows | seconds in all "
            "| per kind (imitation / DAgger / RL s) |",
            "|---|---|---|---|---|---|"]
    for s in sorted(root.glob("*/summary.json")):
        d = json.loads(s.read_text())
        tr = d.get("training", {})
        kinds = [k for k in tr if isinstance(tr[k], dict)]
        per = []
        for k in kinds:
            dag = sum(r.get("seconds", 0) for r in tr[k].get("dagger", []))
            rl = (tr[k].get("rl") or {}).get("seconds", 0)
            per.append(f"{k}: {tr[k].get('imitation_seconds', '–')} / {dag:.0f} / {rl:.0f}")
        rows.append(f"| {s.parent.name} | {d.get('method', 'imitation')} | {', '.join(kinds) or '–'} | "
                    f"{d.get('dataset', {}).get('train_rows', '–')} | {tr.get('seconds', '–')} | "
                    f"{'; '.join(per)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
    if len(sys.argv) > 2:
        print(training_times(Path(sys.argv[2])))
