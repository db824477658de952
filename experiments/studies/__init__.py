"""One-off studies run from a checkout (``python -m experiments.studies.NAME``); not in the wheel.

* ``first_step_ceiling``: how much of the oracle's first forward a score-ranking controller can commit.
* ``learned_table``: the best learned curve against the best non-learned one and the oracle, per task.
"""
