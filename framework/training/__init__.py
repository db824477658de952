"""Layer 3, training with Lightning: the masked-diffusion denoisers (:mod:`.masked_diffusion`), data
modules (:mod:`.data`), the causal judge (:mod:`.causal_lm`), the ``tiny-text`` model
(:mod:`.text_model`) and the built-in model names with train-if-missing (:mod:`.zoo`)."""
