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
