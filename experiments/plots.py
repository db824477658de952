"""The report's per-task plot: quality against tokens per forward, one line per curve.

A *curve* is the strategies of one sweep (:mod:`adaptive_decoding.experiments.sweeps`), drawn as a line through its
points in order of tokens per forward and named with its AUP (:mod:`adaptive_decoding.experiments.aup`); a strategy
that is no sweep is a single marker coloured by its kind. The one-token-per-step reference is a
black square with a dotted horizontal line at its quality, the oracle a red star with a dotted
vertical line at its tokens per forward (the most parallel decode that reproduces the reference).
The Pareto front (most tokens per forward for a quality, the oracle left out) is a dashed grey step.
A single point carries a number, and a numbered key beside the plot names it: where points cluster
(several decoders at 4–7 tokens per forward), the numbers of nearby points are stacked apart
(:func:`label_offsets`) instead of printing their names over each other. The legend stands right of
the axes and the key under it (:func:`legend_with_key`); the figure grows with both.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional, Sequence

KIND_ORDER = ("reference", "baseline", "heuristic", "tuned", "learned", "oracle")
KIND_COLOURS = {"reference": "#000000", "baseline": "#1f77b4", "heuristic": "#2ca02c", "tuned": "#ff7f0e",
                "learned": "#9467bd", "oracle": "#d62728"}


def pareto_front(points: Sequence[tuple[float, float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the points not dominated in (smaller x, better quality), sorted by x."""
    sign = 1.0 if higher_is_better else -1.0
    idx = [i for i, (x, y) in enumerate(points) if x is not None and y is not None]
    front = []
    for i in idx:
        xi, yi = points[i][0], sign * points[i][1]
        dominated = any(
            (points[j][0] <= xi and sign * points[j][1] >= yi) and (points[j][0] < xi
                                                                    or sign * points[j][1] > yi)
            for j in idx if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def quality_label(row: dict) -> str:
    q = row["quality_metric"]
    name = "accuracy" if q == "accuracy" else q.replace("_", " ")
    return f"{name} ({'higher' if row['higher_is_better'] else 'lower'} is better)"


def short(label: str, limit: int = 28) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def curves_of(rows: Sequence[dict]) -> "OrderedDict[str, list[dict]]":
    """The rows with a quality and tokens per forward, grouped by ``curve`` (file order), each by tokens per
    forward."""
    out: "OrderedDict[str, list[dict]]" = OrderedDict()
    for r in rows:
        if r.get("quality") is not None and r.get("tpf") is not None:
            out.setdefault(r.get("curve") or r["strategy"], []).append(r)
    for pts in out.values():
        pts.sort(key=lambda r: r["tpf"])
    return out


def label_offsets(points: Sequence[tuple[float, float]], xspan: float, yspan: float,
                  step: int = 7) -> list[tuple[int, int]]:
    """Text offsets (in points) for the labels of ``points``: a point within 3 % of the axes' spans of
    earlier ones has its label moved up by ``step`` points for each of them, so the labels of a
    cluster stack instead of overlapping."""
    out: list[tuple[int, int]] = []
    for i, (x, y) in enumerate(points):
        near = sum(1 for (u, v) in points[:i] if abs(u - x) <= 0.03 * xspan and abs(v - y) <= 0.03 * yspan)
        out.append((3, 3 + step * near))
    return out


def _number_singles(ax, singles: list[dict]) -> list[str]:
    """Number the single points on ``ax`` (stacked where they cluster); the key's lines."""
    pts = [(r["tpf"], r["quality"]) for r in singles]
    xs, ys = [p[0] for p in pts] or [0.0], [p[1] for p in pts] or [0.0]
    offsets = label_offsets(pts, max(xs) - min(xs) or 1.0, max(ys) - min(ys) or 1.0)
    for n, (r, off) in enumerate(zip(singles, offsets), start=1):
        ax.annotate(str(n), (r["tpf"], r["quality"]), fontsize=7, fontweight="bold", xytext=off,
                    textcoords="offset points", color=KIND_COLOURS.get(r["kind"], "#333333"))
    return [f"{n}  {short(r['strategy'], 44)}" for n, r in enumerate(singles, start=1)]


def figure_height(n_legend: int, n_key: int) -> float:
    """Inches of figure height that hold the axes (at least 5.6) and, beside them, a legend of
    ``n_legend`` entries above a numbered key of ``n_key`` lines, none of them clipped."""
    return max(5.6, 0.8 + 0.165 * n_legend + 0.115 * n_key)


def legend_with_key(fig: Any, ax: Any, key: list[str]) -> None:
    """The legend right of the axes, from their top, and the numbered key under the legend (placed
    from the legend's laid-out height, so the two never overlap). The figure's height is set first,
    from the legend's entries and the key's lines (:func:`figure_height`)."""
    fig.set_size_inches(fig.get_size_inches()[0], figure_height(len(ax.get_legend_handles_labels()[1]), len(key)))
    legend = ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.8,
                       handlelength=3.2)
    if not key:
        return
    extent = legend.get_window_extent(fig.canvas.get_renderer())
    bottom = ax.transAxes.inverted().transform(extent)[0][1]
    ax.text(1.02, bottom - 0.02, "\n".join(key), transform=ax.transAxes, fontsize=6.5, va="top",
            ha="left", family="monospace")


def _draw_curves(ax, curves: "OrderedDict[str, list[dict]]", aup: Optional[dict]) -> None:
    """One line per curve of more than one point, named with its AUP."""
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("Dark2")  # not the kind colours (tab10), so a line is never read as a kind
    lines = [c for c, pts in curves.items() if len(pts) > 1]
    for i, name in enumerate(lines):
        pts = curves[name]
        score = (aup or {}).get(name)
        # 8 colours x 3 line styles: up to 24 curves stay distinct in the legend
        ax.plot([r["tpf"] for r in pts], [r["quality"] for r in pts], color=palette(i % 8), lw=1.4, ms=5,
                ls=("-", "--", "-.")[(i // 8) % 3],
                marker="^" if pts[0]["lookahead"] else "o", zorder=3,
                label=short(name, 34) + (f" (AUP {score:.1f})" if score is not None else ""))


def _draw_singles(ax, singles: list[dict]) -> None:
    """The single points, one marker per kind (the reference a square, the oracle a star)."""
    for kind in KIND_ORDER:
        for look in (False, True):
            sel = [r for r in singles if r["kind"] == kind and r["lookahead"] == look]
            if not sel:
                continue
            marker = "*" if kind == "oracle" else ("s" if kind == "reference" else ("^" if look else "o"))
            ax.scatter([r["tpf"] for r in sel], [r["quality"] for r in sel], c=KIND_COLOURS[kind],
                       marker=marker,
                       s=170 if kind == "oracle" else 46, zorder=4, edgecolors="white", linewidths=0.5,
                       label=("reference (1 token per step)" if kind == "reference" else kind)
                       + (" + lookahead" if look else ""))


def _draw_guides(ax, rows: list[dict], curves: "OrderedDict[str, list[dict]]") -> None:
    """The Pareto front (dashed grey step), the reference's quality and the oracle's tokens per
    forward (dotted lines)."""
    flat = [r for pts in curves.values() for r in pts if r["kind"] != "oracle"]
    front = pareto_front([(-r["tpf"], r["quality"]) for r in flat], rows[0]["higher_is_better"])
    if len(front) > 1:
        ax.step([flat[i]["tpf"] for i in front], [flat[i]["quality"] for i in front], where="post",
                color="#888888", lw=0.9, ls="--", zorder=2, label="Pareto front")
    for r in rows:
        if r["kind"] == "reference" and r.get("quality") is not None:
            ax.axhline(r["quality"], color=KIND_COLOURS["reference"], lw=0.7, ls=":", zorder=1)
        if r["kind"] == "oracle" and r.get("tpf") is not None:
            ax.axvline(r["tpf"], color=KIND_COLOURS["oracle"], lw=0.8, ls=":", zorder=1)


def plot_task(rows: list[dict], path: Path, title: str, aup: Optional[dict] = None) -> Path:
    """The quality-versus-tokens-per-forward plot of one task's rows (``aup``: curve -> AUP), as a PNG.

    The figure grows with the legend and the key, and is saved with a tight bounding box, so a long
    title, a legend of 40 curves and the key under it are all in the image."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = curves_of(rows)
    singles = [pts[0] for pts in curves.values() if len(pts) == 1]
    fig, ax = plt.subplots(figsize=(10.5, 5.6), dpi=120)
    _draw_curves(ax, curves, aup)
    _draw_singles(ax, singles)
    key = _number_singles(ax, singles)
    _draw_guides(ax, rows, curves)
    if rows[0]["quality_metric"] == "accuracy":
        ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("tokens per forward (answer tokens / forwards, pooled over the examples; higher is more parallel)")
    ax.set_ylabel(quality_label(rows[0]))
    ax.set_title(textwrap.fill(title, 90), fontsize=10)
    ax.grid(alpha=0.3)
    legend_with_key(fig, ax, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
