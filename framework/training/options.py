"""The options of training a denoiser or the causal verifier LM, grouped by concern
(:mod:`adaptive_decoding.framework.core.options`):

* :class:`DenoiserOptions` of :func:`adaptive_decoding.framework.training.masked_diffusion.train_denoiser`: ``recipe``
  (:class:`DenoiserRecipe`: the task's :class:`~adaptive_decoding.framework.tasks.base.Recipe` fields to override, null =
  the task's), ``run`` (:class:`DenoiserRun`: the output folder, the seed, the weights to start from,
  the Trainer's devices, torch threads) and ``logging`` (:class:`~adaptive_decoding.framework.core.options.ProgressLogging`);
* :class:`CausalOptions` of :func:`adaptive_decoding.framework.training.causal_lm.train_causal_lm`: ``recipe``
  (:class:`CausalRecipe`, the verifier's recipe), ``run`` (:class:`TrainingRun`) and ``logging``.

Both entry points also take the groups' fields as flat keywords (``train_denoiser("reverse",
max_steps=20, out_dir=..., wandb_mode="disabled")``), the command line's names, which replace those
of the options given (as transformers' ``generate(generation_config, **kwargs)`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from adaptive_decoding.framework.core.options import OptionGroups, Options, PathParam, ProgressLogging
from adaptive_decoding.framework.core.params import Param, ParameterError

#: the causal verifier's recipe: small and quick (a verifier need not be strong to catch incoherent rollouts)
CAUSAL_RECIPE: dict[str, Any] = dict(
    d_model=64, n_layers=2, n_heads=4, d_ff=256, max_steps=1500, max_minutes=4.0, batch_size=128,
    lr=2e-3, weight_decay=0.01, warmup_steps=100, corrupt=0.5, val_size=256, val_every=500, n_test=500,
)


# ---------------------------------------------------------------------- the run of either
@dataclass(repr=False, eq=False)
class TrainingRun(Options):
    """Where a training run writes (``out_dir``; null = a new folder under the cache's ``runs/``), the
    ``seed`` of weights, data and masking, and torch's CPU threads (``num_threads``; null = the entry
    point's default)."""

    section = "run"
    params = {
        "out_dir": PathParam(nullable=True, doc="the saved model's folder; null = a new one under runs/"),
        "seed": Param(int, low=0, doc="seeds weights, data and masking"),
        "num_threads": Param(int, low=1, nullable=True, doc="torch CPU threads; null = the default"),
    }

    out_dir: Optional[str] = None
    seed: int = 0
    num_threads: Optional[int] = None


@dataclass(repr=False, eq=False)
class DenoiserRun(TrainingRun):
    """:class:`TrainingRun` plus the weights to start from (``init_from``: a saved tiny denoiser, folder
    or built-in name, of the same architecture and vocabulary) and the Lightning Trainer's
    ``accelerator`` and ``devices``; ``num_threads`` null = the idle cores (:func:`auto_threads`)."""

    section = "run"
    params = {
        **TrainingRun.params,
        "init_from": PathParam(nullable=True, doc="a saved tiny denoiser (folder or built-in name) to start "
                                                  "from; null = random weights"),
        "accelerator": Param(str, doc="Lightning accelerator (cpu, gpu, auto)"),
        "devices": Param(object, doc="Lightning devices (a count, a list or 'auto')"),
    }

    init_from: Optional[str] = None
    accelerator: str = "cpu"
    devices: Any = 1


# ---------------------------------------------------------------------- the denoiser
def _nullable(kind: Any, doc: str, **bounds: Any) -> Param:
    return Param(kind, nullable=True, doc=doc + "; null = the task's recipe", **bounds)


@dataclass(repr=False, eq=False)
class DenoiserRecipe(Options):
    """Fields of the task's :class:`~adaptive_decoding.framework.tasks.base.Recipe` to override (null keeps the task's):
    the architecture preset ``model_size`` (``tiny``, ``small``, ``base`` or a mapping of
    :class:`~adaptive_decoding.framework.models.tiny.TinyConfig` fields), the budgets (whichever is spent first ends
    training), AdamW, the smallest masking probability ε, the data sizes and the test problems."""

    section = "recipe"
    params = {
        "model_size": _nullable(object, "tiny, small, base or a mapping of TinyConfig fields"),
        "max_minutes": _nullable(float, "wall-time budget in minutes", low=0.0),
        "max_steps": _nullable(int, "step budget", low=1),
        "batch_size": _nullable(int, "training batch size", low=1),
        "lr": _nullable(float, "AdamW learning rate", low=0.0, low_exclusive=True),
        "weight_decay": _nullable(float, "AdamW weight decay", low=0.0),
        "warmup_steps": _nullable(int, "linear warm-up steps", low=0),
        "eps": _nullable(float, "smallest masking probability ε", low=0.0, high=1.0),
        "train_size": _nullable(int, "training problems (null in the recipe: a fresh stream)", low=1),
        "val_size": _nullable(int, "validation problems (0 = no validation)", low=0),
        "val_every": _nullable(int, "steps between validations", low=1),
        "n_test": _nullable(int, "test problems the saved model is measured on", low=0),
    }

    model_size: Any = None
    max_minutes: Optional[float] = None
    max_steps: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    weight_decay: Optional[float] = None
    warmup_steps: Optional[int] = None
    eps: Optional[float] = None
    train_size: Optional[int] = None
    val_size: Optional[int] = None
    val_every: Optional[int] = None
    n_test: Optional[int] = None

    def check_combination(self) -> None:
        from adaptive_decoding.framework.models.tiny import MODEL_SIZES

        size = self.model_size
        if size is not None and not isinstance(size, Mapping) and size not in MODEL_SIZES:
            raise ParameterError(f"recipe.model_size={size!r} is not allowed; allowed: "
                                 f"{', '.join(MODEL_SIZES)} or a mapping of TinyConfig fields")

    def overrides(self) -> dict[str, Any]:
        """The :class:`~adaptive_decoding.framework.tasks.base.Recipe` fields set (``model_size`` as ``size``)."""
        return {("size" if k == "model_size" else k): v for k, v in self.get_params().items() if v is not None}


@dataclass(repr=False, eq=False)
class DenoiserOptions(OptionGroups):
    """Every option of :func:`adaptive_decoding.framework.training.masked_diffusion.train_denoiser`, by concern."""

    recipe: DenoiserRecipe = field(default_factory=DenoiserRecipe)
    run: DenoiserRun = field(default_factory=DenoiserRun)
    logging: ProgressLogging = field(default_factory=ProgressLogging)


# ---------------------------------------------------------------------- the causal verifier
@dataclass(repr=False, eq=False)
class CausalRecipe(Options):
    """The causal verifier LM's recipe (:data:`CAUSAL_RECIPE`): its shape (``d_model``, ``n_layers``,
    ``n_heads``, ``d_ff``), the budgets (``max_minutes`` null or 0 = none), AdamW, the corruption rate
    ``corrupt`` = c (answer tokens masked with probability c·u), the data sizes and test problems."""

    section = "recipe"
    params = {
        "d_model": Param(int, low=1, doc="model width"),
        "n_layers": Param(int, low=1, doc="layers"),
        "n_heads": Param(int, low=1, doc="attention heads"),
        "d_ff": Param(int, low=1, doc="feed-forward width"),
        "max_steps": Param(int, low=1, doc="step budget"),
        "max_minutes": Param(float, low=0.0, nullable=True, doc="wall-time budget in minutes; null or 0 = none"),
        "batch_size": Param(int, low=1, doc="training batch size"),
        "lr": Param(float, low=0.0, low_exclusive=True, doc="AdamW learning rate"),
        "weight_decay": Param(float, low=0.0, doc="AdamW weight decay"),
        "warmup_steps": Param(int, low=0, doc="linear warm-up steps"),
        "corrupt": Param(float, low=0.0, high=1.0, doc="c: answer tokens masked with probability c·u"),
        "val_size": Param(int, low=0, doc="validation problems (0 = no validation)"),
        "val_every": Param(int, low=1, doc="steps between validations"),
        "n_test": Param(int, low=0, doc="test problems of the greedy exact match"),
    }

    d_model: int = CAUSAL_RECIPE["d_model"]
    n_layers: int = CAUSAL_RECIPE["n_layers"]
    n_heads: int = CAUSAL_RECIPE["n_heads"]
    d_ff: int = CAUSAL_RECIPE["d_ff"]
    max_steps: int = CAUSAL_RECIPE["max_steps"]
    max_minutes: Optional[float] = CAUSAL_RECIPE["max_minutes"]
    batch_size: int = CAUSAL_RECIPE["batch_size"]
    lr: float = CAUSAL_RECIPE["lr"]
    weight_decay: float = CAUSAL_RECIPE["weight_decay"]
    warmup_steps: int = CAUSAL_RECIPE["warmup_steps"]
    corrupt: float = CAUSAL_RECIPE["corrupt"]
    val_size: int = CAUSAL_RECIPE["val_size"]
    val_every: int = CAUSAL_RECIPE["val_every"]
    n_test: int = CAUSAL_RECIPE["n_test"]


@dataclass(repr=False, eq=False)
class CausalOptions(OptionGroups):
    """Every option of :func:`adaptive_decoding.framework.training.causal_lm.train_causal_lm`, by concern."""

    recipe: CausalRecipe = field(default_factory=CausalRecipe)
    run: TrainingRun = field(default_factory=TrainingRun)
    logging: ProgressLogging = field(default_factory=ProgressLogging)
