"""Layer 3, learned commit policies: the feature vector (:mod:`.features`), imitation rows
(:mod:`.rollouts`), on-policy rows (:mod:`.dagger`), rows grouped per step (:mod:`.windows`), the
networks (:mod:`.nets`: MLP, logistic, window transformer), the policy file (:mod:`.policy`),
supervised training and calibration (:mod:`.train`), the RL fine-tune (:mod:`.rl`, :mod:`.rl_train`)
and ``adec train-controller``'s pipeline (:mod:`.pipeline`). See docs/learned.md."""
