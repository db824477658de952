"""Experiments: declarative YAML (:mod:`.spec`, :mod:`.parse`), cells (:mod:`.cells`), the runner
(:mod:`.runner`), metrics (:mod:`.metrics`), strategy suites (:mod:`.strategies`), the benchmark
report (:mod:`.report`) and distributed evaluation (:mod:`.distributed`, :mod:`.workers`). The
experiment files themselves are in ``experiments/configs/``."""
