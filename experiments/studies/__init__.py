"""One-off studies, all in this folder, run from a checkout (``python -m adaptive_decoding.experiments.studies.NAME``);
not in the wheel. Each is listed here and in docs/experiments.md ("One-off studies"):

* ``first_step_ceiling``: how much of the oracle's first forward a score-ranking controller can commit.
* ``learned_table``: the best learned curve against the best non-learned one and the oracle, per task,
  from a report's ``benchmark.json``.
* ``set_bound``: tokens per forward of a hindsight policy that commits, each step, the largest jointly
  safe set of the model's predictions (the set-level bound beside the per-position oracle).
* ``code_isolation``: the ``code`` metric's per-program isolation start-up and programs per second under
  each mechanism (docs/metrics.md).
* ``sub_block_cache``: Fast-dLLM v2's approximate sub-block cache against the exact block cache on a tiny
  checkpoint built from its config: tokens and answers that differ, forwards, query positions, time.

The device check (``experiments/gpu_profile.sh``: ``tests/cuda``, then ``adec profile`` at the real
shapes on a CUDA GPU) stays beside the configs, where the developers' guide names it.
"""
