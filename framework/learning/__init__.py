"""Layer 3, learned commit policies: the feature vector (:mod:`.features`), rollout data
(:mod:`.rollouts`), the policy and its file (:mod:`.policy`), training (:mod:`.train`)."""
