"""The report's and bench's plot: labels of clustered points are numbered and stacked apart."""

from __future__ import annotations

from adaptive_decoding.experiments.plots import label_offsets


def test_labels_of_a_cluster_stack_and_lone_points_keep_the_plain_offset():
    # spans 10 and 1: "near" is within 0.3 in x and 0.03 in y of an earlier point
    pts = [(1.0, 0.50), (1.2, 0.50), (1.1, 0.51), (5.0, 0.50), (1.0, 0.60)]
    assert label_offsets(pts, xspan=10.0, yspan=1.0) == [
        (3, 3),    # the first
        (3, 10),   # near the first: one step up
        (3, 17),   # near both: two steps up
        (3, 3),    # alone in x
        (3, 3),    # alone in y
    ]


def test_the_numbered_key_sits_under_a_legend_taller_than_the_axes():
    """40 curves (the benchmark has 36) and 6 numbered points: the key starts below the legend's
    bottom (it was drawn at the axes' bottom, under a legend that reached past it), and the figure
    grows to hold both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adaptive_decoding.experiments.plots import figure_height, legend_with_key

    fig, ax = plt.subplots(figsize=(10.5, 5.6), dpi=60)
    for i in range(40):
        ax.plot([0, 1], [i, i], label=f"curve number {i} with a long name (AUP {i}.0)")
    ax.set_title("sudoku9(max_givens=22,min_givens=17,unique=False): accuracy vs tokens per forward " * 2)
    legend_with_key(fig, ax, [f"{n}  single point {n}" for n in range(1, 7)])
    assert fig.get_size_inches()[1] == figure_height(40, 6)  # the figure grew with the legend and key
    fig.canvas.draw()
    key = ax.texts[-1].get_window_extent()
    legend = ax.get_legend().get_window_extent()
    assert key.y1 <= legend.y0 and key.x0 >= legend.x0
    plt.close(fig)
