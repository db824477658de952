"""Layer 3, training with Lightning: the masked-diffusion denoisers (:mod:`.masked_diffusion`), data
modules (:mod:`.data`), the causal judge (:mod:`.causal_lm`), the ``tiny-text`` model
(:mod:`.text_model`) and the builders that train a missing built-in model (:mod:`.zoo`), which
importing this package registers with :func:`adaptive_decoding.framework.models.zoo.load_model`."""

from adaptive_decoding.framework.training import zoo as _zoo  # noqa: F401 - registers the missing-model builders
