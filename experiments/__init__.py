"""Experiments: declarative YAML (:mod:`.spec`, :mod:`.parse`, :mod:`.sweeps`, the milestone
:mod:`.targets`), cells (:mod:`.cells`), the runner (:mod:`.runner`), metrics (:mod:`.metrics`),
strategy suites (:mod:`.strategies`), the benchmark report (:mod:`.report`, built on one comparison
layer, :mod:`.compare`, and one table writer, :mod:`.tables`) and distributed evaluation
(:mod:`.distributed`, :mod:`.workers`). The experiment files themselves are in
``experiments/configs/``; one-off studies in ``experiments/studies/``."""
