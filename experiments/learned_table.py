"""Issue 13's closing table from a report's ``benchmark.json``: per task, the best learned curve
against the best non-learned one and the oracle, at matched accuracy, with AUPs and training times.

    python -m experiments.learned_table docs/benchmark.json [runs/controllers]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from experiments.matched import NON_LEARNED


def _best(points: list[dict], kinds: tuple[str, ...]) -> Optional[dict]:
    sel = [p for p in points if p["kind"] in kinds and p["tpf"]]
    return max(sel, key=lambda p: p["tpf"], default=None)


def _fmt(p: Optional[dict], label: str) -> str:
    if p is None:
        return f"| {label} | – | none within 1 point | – | – | – | – |"
    return (f"| {label} | {p['curve']} | {p['strategy']} | {p['accuracy']:.3f} | {p['nfe']:.2f} | "
            f"{p['tpf']:.2f} | {p['aup']:.1f} |" if p.get("aup") is not None else
            f"| {label} | {p['curve']} | {p['strategy']} | {p['accuracy']:.3f} | {p['nfe']:.2f} | {p['tpf']:.2f} | – |")


def table(bench: dict[str, Any]) -> str:
    out = []
    for name, t in bench["tasks"].items():
        m = t.get("matched") or {}
        points = m.get("points") or []
        if not points:
            continue
        aups = t.get("aup") or {}
        kind_of = {p["curve"]: p["kind"] for p in points}
        top_aup = max(((c, a) for c, a in aups.items() if kind_of.get(c) != "oracle"),
                      key=lambda kv: kv[1] or 0.0, default=(None, None))  # the oracle is a bound
        learned_curves = {p["curve"] for p in points if p["kind"] == "learned"}
        best_learned_aup = max(((c, aups.get(c)) for c in learned_curves), key=lambda kv: kv[1] or 0.0,
                               default=(None, None))
        out += [f"**{name}** (reference {m['reference']}, matched at accuracy ≥ {m['threshold']:.2f}; "
                f"highest AUP: {top_aup[0]} {top_aup[1]:.1f}; best learned AUP: {best_learned_aup[0]} "
                f"{(best_learned_aup[1] or 0):.1f})", "",
                "| | curve | matched point | accuracy | NFE | tokens/forward | AUP |", "|---|---|---|---|---|---|---|",
                _fmt(_best(points, ("learned",)), "best learned"),
                _fmt(_best(points, NON_LEARNED), "best non-learned"),
                _fmt(_best(points, ("oracle",)), "oracle"), ""]
        tg = (m.get("targets") or {}).get("learned")
        if tg:
            for key, text in (("over_non_learned", "learned / non-learned (≥ 1.3×)"), ("of_oracle", "learned / oracle (≥ 0.85×)")):
                v = tg[key]["value"]
                out.append(f"- {text}: {'–' if v is None else f'{v:.2f}×'} {'✓' if tg[key]['met'] else '✗'}")
            out.append("")
    return "\n".join(out)


def training_times(root: Path) -> str:
    rows = ["| policy folder | method | kinds | rows | seconds in all | per kind (imitation / DAgger / RL s) |",
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
                    f"{d.get('dataset', {}).get('train_rows', '–')} | {tr.get('seconds', '–')} | {'; '.join(per)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
    if len(sys.argv) > 2:
        print(training_times(Path(sys.argv[2])))
