"""The Pareto front of a study: selection of the trial to export, a table, a plot.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence


# ---------------------------------------------------------------------- front and choice
def pareto_front(study: Any) -> list[Any]:
    """Pareto-optimal complete trials (max accuracy, min NFE), by increasing NFE."""
    return sorted(study.best_trials, key=lambda t: (t.values[1], -t.values[0], t.number))


def choose_index(points: Sequence[tuple[float, float]], reference_accuracy: float,
                 max_drop: float) -> tuple[int, bool]:
    """Index of the fewest-NFE ``(accuracy, nfe)`` point with accuracy ≥ reference − ``max_drop``
    (ties: higher accuracy, then the earlier point), and whether one got there; otherwise the
    most accurate point (ties: fewer NFE) and ``False``."""
    if not points:
        raise ValueError("no point to choose from")
    target = reference_accuracy - max_drop
    ok = [i for i, (acc, _) in enumerate(points) if acc >= target - 1e-12]
    if ok:
        return min(ok, key=lambda i: (points[i][1], -points[i][0], i)), True
    return min(range(len(points)), key=lambda i: (-points[i][0], points[i][1], i)), False


class NoCompleteTrialError(ValueError):
    """Every trial of a study was pruned or failed: there is no point to choose."""


def choose_trial(trials: Sequence[Any], reference_accuracy: float, max_drop: float) -> tuple[Any, bool]:
    """The fewest-NFE complete trial within ``max_drop`` of ``reference_accuracy`` (see the rule).

    Raises :class:`NoCompleteTrialError` (how many trials were pruned and failed) when there is none.
    """
    from optuna.trial import TrialState

    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE and t.values), key=lambda t: t.number)
    if not complete:
        pruned = sum(t.state == TrialState.PRUNED for t in trials)
        raise NoCompleteTrialError(
            f"no complete trial to choose from: {pruned} of {len(trials)} trials were pruned (their accuracy fell "
            f"too far below the reference's) and {len(trials) - pruned} failed; the search space may not reach "
            f"the reference's accuracy on this task. What to do: move the space to where decoding is careful "
            f"with --range NAME=LOW:HIGH (e.g. --range eta=0.9:0.999 for margin_topk, a threshold near 1 for "
            f"fast_dllm), run more trials, pass --no-prune to measure every trial, or hold a parameter with --set")
    i, met = choose_index([(t.values[0], t.values[1]) for t in complete], reference_accuracy, max_drop)
    return complete[i], met


def format_front(front: Sequence[Any], chosen: Any, gen_length: int) -> str:
    """The Pareto front as a text table; the chosen trial is starred."""
    lines = [f"{'':2}{'trial':>5} {'acc':>6} {'NFE':>7} {'tok/fwd':>8}  params",
             "-" * 60]
    for t in front:
        mark = "* " if chosen is not None and t.number == chosen.number else "  "
        tpf = t.user_attrs.get("tpf", gen_length / t.values[1] if t.values[1] else float("nan"))
        lines.append(f"{mark}{t.number:>5} {t.values[0]:>6.3f} {t.values[1]:>7.2f} {tpf:>8.2f}  "
                     + ", ".join(f"{k}={_fmt(v)}" for k, v in t.params.items()))
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def plot_front(study: Any, chosen: Any, reference: dict[str, Any], max_drop: float,
               path: "str | os.PathLike", title: str = "") -> Path:
    """Accuracy vs NFE of every complete trial, the front highlighted, the choice starred (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    front = pareto_front(study)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.scatter([t.values[1] for t in complete], [t.values[0] for t in complete], s=18, c="0.65",
               label=f"trials ({len(complete)})")
    ax.plot([t.values[1] for t in front], [t.values[0] for t in front], "o-", c="tab:orange", ms=6,
            label="Pareto front")
    ax.scatter([reference["nfe"]], [reference["accuracy"]], marker="X", s=80, c="k",
               label="sequential (reference)")
    ax.axhline(reference["accuracy"] - max_drop, ls="--", lw=0.8, c="0.4",
               label=f"reference − {max_drop:g}")
    if chosen is not None:
        ax.scatter([chosen.values[1]], [chosen.values[0]], marker="*", s=220, c="tab:red", zorder=5,
                   label=f"chosen (trial {chosen.number})")
    ax.set_xlabel("mean NFE per sample (validation)")
    ax.set_ylabel("exact-match accuracy (validation)")
    ax.set_title(title or study.study_name, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
