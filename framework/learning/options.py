"""The options of learning a commit policy, grouped by concern (:mod:`adaptive_decoding.framework.core.options`).

* :class:`NetTraining` and :class:`RunLogging`: one Lightning fit of a policy network
  (:func:`adaptive_decoding.framework.learning.train.train_net`): the optimisation, and what is logged where;
* :class:`RLOptions`: the REINFORCE fine-tune (:func:`adaptive_decoding.framework.learning.rl_train.rl_finetune`;
  λ, the reward form, the group of K rollouts per prompt, τ and T of the sampled policy, τ₂);
* :class:`DaggerVisit`: how DAgger labels the states a policy visits
  (:func:`adaptive_decoding.framework.learning.dagger.collect_on_policy`);
* :class:`ThresholdCalibration`: the grid of τ and the validation examples the calibration decodes
  (:func:`adaptive_decoding.framework.learning.train.calibrate_threshold`);
* :class:`PolicyOptions`: ``adec train-controller``'s pipeline
  (:func:`adaptive_decoding.framework.learning.pipeline.train_policy`), in seven groups: ``data`` (what is rolled
  out and labelled), ``network`` (the policy kinds and their shape), ``training`` (the
  optimisation), ``rounds`` (the method: imitation, DAgger rounds, RL), ``rl``, ``calibration``
  (τ on the validation split) and ``output``.

Each group validates its fields by :class:`~adaptive_decoding.framework.core.params.Param`, round-trips through
``get_params`` and has a YAML form; ``PolicyOptions.from_flat`` takes the command line's flat names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from adaptive_decoding.framework.core.options import (
    WANDB_MODES,
    ChoiceListParam,
    ExampleDraw,
    IntListParam,
    OptionGroups,
    Options,
    ProbabilityListParam,
    RunLogging,  # noqa: F401 - re-exported: it moved to adaptive_decoding.framework.core.options, shared by other layers
)
from adaptive_decoding.framework.core.params import MappingParam, Param, ParameterError
from adaptive_decoding.framework.learning.nets import KINDS

METHODS = ("imitation", "dagger", "rl")
LABELS = ("reference", "set")
REWARDS = ("additive", "multiplicative")  # = adaptive_decoding.framework.learning.rl.REWARDS
#: the window transformer's default width, layers and heads
WINDOW_ARCH = {"d_model": 32, "layers": 2, "heads": 4}
#: the calibration grid of thresholds τ
DEFAULT_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999)


# ---------------------------------------------------------------------- one network's fit
@dataclass(repr=False, eq=False)
class NetTraining(Options):
    """The optimisation of one policy network: AdamW (``lr``, ``weight_decay``), early stopping on
    the validation loss (``patience``), BCE with unsafe rows weighted ``neg_weight``."""

    section = "training"
    params = {
        "lr": Param(float, low=0.0, low_exclusive=True, doc="AdamW learning rate"),
        "weight_decay": Param(float, low=0.0, doc="AdamW weight decay"),
        "max_epochs": Param(int, low=1, doc="most epochs"),
        "patience": Param(int, low=0, doc="early-stopping patience in epochs"),
        "batch_size": Param(int, low=1, doc="training batch size (rows; windows for the transformer)"),
        "seed": Param(int, low=0, doc="seed of the initialisation and the batches"),
        "accelerator": Param(str, doc="Lightning accelerator (cpu, gpu, auto)"),
        "devices": Param(int, low=1, doc="Lightning devices"),
        "fast_dev_run": Param(bool, doc="Lightning's fast_dev_run (one batch, a smoke test)"),
        "neg_weight": Param(float, low=0.0, low_exclusive=True, doc="weight of unsafe rows in the loss"),
    }

    lr: float = 3e-3
    weight_decay: float = 1e-4
    max_epochs: int = 40
    patience: int = 5
    batch_size: int = 256
    seed: int = 0
    accelerator: str = "cpu"
    devices: int = 1
    fast_dev_run: bool = False
    neg_weight: float = 1.0


# ---------------------------------------------------------------------- the RL fine-tune
@dataclass(repr=False, eq=False)
class RLOptions(Options):
    """REINFORCE with a group baseline (:mod:`adaptive_decoding.framework.learning.rl`): ``iterations`` epochs of
    ``prompts`` prompts × ``group`` rollouts; reward c − λ·NFE/G (``additive``) or c·exp(−λ·NFE/G);
    commits drawn with probability σ((logit p − logit τ)/T); inside ``verified`` at τ₂ when
    ``verify_threshold`` is set."""

    section = "rl"
    params = {
        "iterations": Param(int, low=1, doc="policy-gradient iterations (epochs)"),
        "prompts": Param(int, low=1, doc="prompts per iteration"),
        "group": Param(int, low=2, doc="rollouts per prompt (the group baseline needs two)"),
        "lam": Param(float, low=0.0, doc="λ, the weight of NFE/G in the reward"),
        "reward_form": Param(str, choices=REWARDS, doc="additive: c − λ·NFE/G; multiplicative: c·exp(−λ·NFE/G)"),
        "normalise": Param(bool, doc="divide the advantage by the group's std (GRPO)"),
        "lr": Param(float, low=0.0, low_exclusive=True, doc="Adam learning rate"),
        "threshold": Param(float, low=0.0, high=1.0, low_exclusive=True,
                           doc="τ of the sampled policy (strictly between 0 and 1)"),
        "temperature": Param(float, low=0.0, low_exclusive=True, doc="T of the sampled policy"),
        "verify_threshold": Param(float, low=0.0, high=1.0, nullable=True,
                                  doc="τ₂: roll out inside verified (WINO's check); null = off"),
        "minibatch": Param(int, low=1, doc="recorded steps per gradient step"),
        "seed": Param(int, low=0, nullable=True, doc="seed of the rollouts and batches; null = the training seed"),
        "data_seed": Param(int, low=0, doc="seed of the prompts' draw"),
        "resume": Param(bool, doc="resume from rl/checkpoints/last.ckpt when it exists"),
    }

    iterations: int = 20
    prompts: int = 16
    group: int = 4
    lam: float = 0.5
    reward_form: str = "additive"
    normalise: bool = True
    lr: float = 1e-3
    threshold: float = 0.99
    temperature: float = 1.0
    verify_threshold: Optional[float] = None
    minibatch: int = 4096
    seed: Optional[int] = None
    data_seed: int = 0
    resume: bool = True

    def check_combination(self) -> None:
        if self.threshold >= 1.0:
            raise ParameterError(f"rl.threshold={self.threshold!r} is out of range; allowed: strictly between 0 "
                                 f"and 1")


# ---------------------------------------------------------------------- DAgger's visits
@dataclass(repr=False, eq=False)
class DaggerVisit(Options):
    """How the states a policy visits are labelled: at most ``states_per_rollout`` visited steps per
    prompt (drawn with ``seed``), each labelled by the ``reference`` controller's decode continued
    from it, ``batch_size`` continuations decoded together."""

    section = "visit"
    qualified = False  # collect_on_policy's own keywords: "states_per_rollout=0 is out of range ..."
    params = {
        "states_per_rollout": Param(int, low=1, doc="visited steps labelled per prompt"),
        "seed": Param(int, low=0, doc="seed of the steps' draw"),
        "reference": Param(str, doc="the controller whose continuation labels a state"),
        "batch_size": Param(int, low=1, doc="continuations decoded together"),
    }

    states_per_rollout: int = 4
    seed: int = 0
    reference: str = "sequential"
    batch_size: int = 64


# ---------------------------------------------------------------------- the threshold's calibration
@dataclass(repr=False, eq=False)
class ThresholdCalibration(ExampleDraw):
    """The calibration of a policy's τ: :class:`~adaptive_decoding.framework.core.options.ExampleDraw`'s examples (by
    default 64 of the validation split) decoded at each τ of ``thresholds``; the fewest mean NFE
    whose accuracy is within ``max_drop`` of sequential's is chosen."""

    section = "calibration"
    params = {
        **ExampleDraw.params,
        "thresholds": ProbabilityListParam(doc="the grid of τ"),
        "max_drop": Param(float, low=0.0, high=1.0, doc="accuracy allowed below sequential"),
    }

    split: str = "validation"
    n: int = 64
    thresholds: Any = DEFAULT_THRESHOLDS
    max_drop: float = 0.01


# ---------------------------------------------------------------------- the pipeline
@dataclass(repr=False, eq=False)
class PolicyData(Options):
    """What is rolled out and labelled: prompts per split, the controller whose states are recorded,
    the labels, the feature columns, the decoding options and batch."""

    section = "data"
    params = {
        "n_train": Param(int, low=1, doc="train-split prompts rolled out"),
        "n_val": Param(int, low=1, doc="validation prompts (early stopping, calibration)"),
        "n_test": Param(int, low=0, doc="test prompts for the reported figures (0 = none)"),
        "rollout": Param(str, nullable=True, doc="record this controller's states; null = sequential"),
        "labels": Param(str, choices=LABELS, doc="reference (the reference decode's tokens) or set (the verifier)"),
        "features": Param(object, nullable=True, doc="feature names or groups (comma separated or a list); "
                                                     "null = every column not constant on the task"),
        "decode": MappingParam(nullable=True, doc="DecodeConfig options (default: the task's lengths)"),
        "decode_batch_size": Param(int, low=1, doc="prompts decoded together"),
    }

    n_train: int = 256
    n_val: int = 64
    n_test: int = 200
    rollout: Optional[str] = None
    labels: str = "reference"
    features: Any = None
    decode: Optional[dict] = None
    decode_batch_size: int = 64

    def check_combination(self) -> None:
        if self.features is not None:
            from adaptive_decoding.framework.learning.features import parse_features

            parse_features(self.features)
            if not isinstance(self.features, str):
                self.features = list(self.features)


@dataclass(repr=False, eq=False)
class PolicyNetwork(Options):
    """The policy kinds trained and their shape (MLP hidden sizes, the window transformer's
    ``d_model``/``layers``/``heads``, the residual form logit p = logit(confidence) + g)."""

    section = "network"
    params = {
        "policies": ChoiceListParam(choices=KINDS, doc="policy kinds to train"),
        "hidden": IntListParam(low=1, doc="MLP hidden sizes"),
        "window_arch": MappingParam(nullable=True, doc="transformer d_model, layers, heads; null = 32, 2, 4"),
        "residual": Param(bool, doc="learn a correction of the confidence rule"),
    }

    policies: Any = ("mlp", "logreg")
    hidden: Any = (32, 32)
    window_arch: Optional[dict] = None
    residual: bool = False

    def arch(self, kind: str) -> dict[str, Any]:
        """The ``arch`` of a ``kind`` network (``mlp``'s hidden sizes or the transformer's shape)."""
        arch = {"hidden": list(self.hidden)} if kind == "mlp" else dict(self.window_arch or WINDOW_ARCH)
        return {**arch, "residual": True} if self.residual else arch


@dataclass(repr=False, eq=False)
class PolicyTraining(NetTraining):
    """:class:`NetTraining` of every network, plus the transformer's batch (``window_batch``, in
    windows) and the logistic regression's inverse regularisation ``C``."""

    section = "training"
    params = {
        **NetTraining.params,
        "window_batch": Param(int, low=1, doc="the transformer's batch size in windows"),
        "C": Param(float, low=0.0, low_exclusive=True, doc="logistic regression's inverse regularisation"),
    }

    window_batch: int = 64
    C: float = 1.0

    def for_kind(self, kind: str) -> NetTraining:
        """The :class:`NetTraining` of a ``kind`` network (the transformer batches ``window_batch``)."""
        values = {k: v for k, v in self.get_params().items() if k in NetTraining.params}
        if kind != "mlp":
            values["batch_size"] = self.window_batch
        return NetTraining.build(**values)


@dataclass(repr=False, eq=False)
class PolicyRounds(Options):
    """The method: ``imitation`` only, then ``rounds`` DAgger rounds (``states_per_rollout`` labelled
    states per prompt, the policy decoding at ``dagger_threshold``) or the RL fine-tune."""

    section = "rounds"
    params = {
        "method": Param(str, choices=METHODS, doc="imitation, dagger or rl"),
        "rounds": Param(int, low=0, doc="DAgger rounds"),
        "states_per_rollout": Param(int, low=1, doc="DAgger: visited steps labelled per prompt"),
        "dagger_threshold": Param(float, low=0.0, high=1.0,
                                  doc="τ the policy decodes with while DAgger visits (and before calibration)"),
    }

    method: str = "imitation"
    rounds: int = 2
    states_per_rollout: int = 4
    dagger_threshold: float = 0.9

    def check_combination(self) -> None:
        if self.method == "dagger" and self.rounds < 1:
            raise ParameterError(f"rounds={self.rounds} with method=dagger; allowed: an integer ≥ 1")


@dataclass(repr=False, eq=False)
class PolicyCalibration(Options):
    """Calibration of τ on the validation split: the fewest NFE within ``max_drop`` of sequential."""

    section = "calibration"
    params = {
        "calibrate": Param(bool, doc="calibrate τ (else keep dagger_threshold)"),
        "thresholds": ProbabilityListParam(doc="the grid of τ"),
        "max_drop": Param(float, low=0.0, high=1.0, doc="accuracy allowed below sequential"),
    }

    calibrate: bool = True
    thresholds: Any = DEFAULT_THRESHOLDS
    max_drop: float = 0.01


@dataclass(repr=False, eq=False)
class PolicyOutput(Options):
    """Where the policies and logs go and what is printed."""

    section = "output"
    params = {
        "out_dir": Param(str, nullable=True, doc="output folder; null = runs/controllers/TASK-MODEL[-METHOD]"),
        "wandb_mode": Param(str, choices=WANDB_MODES, doc="Weights & Biases mode"),
        "verbose": Param(bool, doc="print progress and the report"),
    }

    out_dir: Optional[str] = None
    wandb_mode: str = "offline"
    verbose: bool = True

    def check_combination(self) -> None:
        if self.out_dir is not None:
            self.out_dir = str(self.out_dir)


@dataclass(repr=False, eq=False)
class PolicyOptions(OptionGroups):
    """Every option of :func:`adaptive_decoding.framework.learning.pipeline.train_policy`, by concern."""

    data: PolicyData = field(default_factory=PolicyData)
    network: PolicyNetwork = field(default_factory=PolicyNetwork)
    training: PolicyTraining = field(default_factory=PolicyTraining)
    rounds: PolicyRounds = field(default_factory=PolicyRounds)
    rl: RLOptions = field(default_factory=RLOptions)
    calibration: PolicyCalibration = field(default_factory=PolicyCalibration)
    output: PolicyOutput = field(default_factory=PolicyOutput)

    def rl_options(self) -> RLOptions:
        """The RL fine-tune's options, its seed defaulting to the training seed."""
        return self.rl if self.rl.seed is not None else self.rl.replace(seed=self.training.seed)

    @property
    def verify_threshold(self) -> Optional[float]:
        """τ₂ of ``verified`` when the policies are trained and decoded inside it (RL with verification)."""
        return self.rl.verify_threshold if self.rounds.method == "rl" else None
