"""Integrations with other tools: lm-evaluation-harness's ``adec`` model (:mod:`.lm_eval_model`,
registered with lm-eval when imported; ``adec lm-eval`` imports it) and the multiple-choice
log-likelihood it scores with (:mod:`.mc_likelihood`, LLaDA's Monte-Carlo estimate).

Layer 5, beside :mod:`adaptive_decoding.framework.testing`: they build on the engine, the tasks and the models, and
only the command line imports them.
"""
