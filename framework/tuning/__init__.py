"""Layer 3, Optuna tuning: storages (:mod:`.storage`), the search space (:mod:`.space`), the
objectives and worker loop (:mod:`.objective`), the Pareto front (:mod:`.front`) and the study
(:mod:`.study`, :func:`tune_controller`)."""
