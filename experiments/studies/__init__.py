"""One-off studies, all in this folder, run from a checkout (``python -m experiments.studies.NAME``);
not in the wheel. Each is listed here and in docs/experiments.md ("One-off studies"):

* ``first_step_ceiling``: how much of the oracle's first forward a score-ranking controller can commit.
* ``learned_table``: the best learned curve against the best non-learned one and the oracle, per task,
  from a report's ``benchmark.json``.
* ``set_bound``: tokens per forward of a hindsight policy that commits, each step, the largest jointly
  safe set of the model's predictions (the set-level bound beside the per-position oracle).
* ``gpu_profile.sh``: the checks and the profile of docs/profile.md on a CUDA GPU (``tests/cuda``, then
  ``adec profile`` at LLaDA-8B's body), each stage under its own time limit.
"""
