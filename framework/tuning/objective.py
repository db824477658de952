"""The two objectives of a trial (accuracy up, NFE down) and the worker loop that runs trials.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from adaptive_decoding.framework.core.measure import tokens_per_forward
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.rng import stable_seed
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller
from adaptive_decoding.framework.models.protocol import LoadedModel
from adaptive_decoding.framework.tuning.space import suggest, tuned_space, with_point
from adaptive_decoding.framework.tuning.storage import open_storage

REFERENCE = "sequential"
SETUP_KEYS = ("controller", "task", "task_params", "fixed", "decode", "n_val", "data_seed", "model")


# ---------------------------------------------------------------------- evaluation
@dataclass
class Scored:
    """Per-example outcomes of a decode: the score (``task.score``), the forwards (NFE) and the
    answer's tokens (what tokens per forward counts); ``+`` joins two parts in order."""

    correct: list[float]
    nfe: list[int]
    answer_tokens: list[int]

    def __add__(self, other: "Scored") -> "Scored":
        return Scored(self.correct + other.correct, self.nfe + other.nfe, self.answer_tokens + other.answer_tokens)

    def figures(self) -> dict[str, float]:
        """Mean accuracy, mean NFE, pooled tokens per forward and the example count."""
        return {"accuracy": mean(self.correct), "nfe": mean(self.nfe),
                "tpf": tokens_per_forward(self.answer_tokens, self.nfe), "n": len(self.correct)}


def score_examples(loaded: LoadedModel, task: Any, controller: Controller, config: DecodeConfig,
                   examples: Sequence[Any], batch_size: int = 64) -> Scored:
    """Per-example score (``task.score``: exact match, or the task's metric), NFE and answer tokens
    (same seeds as :func:`adaptive_decoding.framework.engine.evaluate.evaluate`)."""
    from adaptive_decoding.framework.engine.evaluate import answer_token_counts, decode_texts

    if not examples:
        return Scored([], [], [])
    texts, results, _ = decode_texts(loaded, examples, controller, config, ids=[ex.id for ex in examples],
                                     batch_size=batch_size, task=task)
    nfe = torch.cat([r.nfe for r in results]).tolist()
    return Scored([float(task.score(ex, t)) for ex, t in zip(examples, texts)], [int(n) for n in nfe],
                  answer_token_counts(task, examples, results, loaded.tokenizer))


def mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


# ---------------------------------------------------------------------- one worker
@dataclass
class TuneSettings:
    """Everything a worker process needs (picklable): what to tune, on what, how."""

    controller: str
    task: str
    task_params: dict
    model: Any  # a model name / folder (str) or a LoadedModel (pickled to spawned workers)
    device: str
    fixed: dict
    decode: dict
    n_val: int
    prune_fraction: float
    prune_margin: Optional[float]
    batch_size: int
    data_seed: int
    ranges: Optional[dict] = None  # user ranges replacing declared ones (adec tune --range NAME=LOW:HIGH)
    model_options: Optional[dict] = None  # load_model options of a model named by string (dtype, chat, ...)

    @property
    def n_chunk(self) -> int:
        return max(1, min(self.n_val, int(math.ceil(self.n_val * self.prune_fraction))))

    def setup(self) -> dict[str, Any]:
        model = self.model if isinstance(self.model, str) else getattr(self.model, "name", "model")
        return {"controller": self.controller, "task": self.task, "task_params": self.task_params,
                "fixed": self.fixed, "decode": self.decode, "n_val": self.n_val,
                "data_seed": self.data_seed, "model": model}


def _load(settings: TuneSettings, loaded: Optional[LoadedModel] = None) -> tuple[LoadedModel, Any, DecodeConfig]:
    from adaptive_decoding.framework.tasks.base import get_task

    task = get_task(settings.task, **settings.task_params)
    if loaded is None and isinstance(settings.model, str):
        from adaptive_decoding.framework.training.zoo import load_model_for_task

        options = {**(settings.model_options or {}), "device": settings.device, "train_if_missing": False}
        loaded, _ = load_model_for_task(task, settings.model, **options)
    elif loaded is None:
        loaded = settings.model
    return loaded, task, DecodeConfig.build(**settings.decode)


def make_objective(settings: TuneSettings, loaded: LoadedModel, task: Any, config: DecodeConfig,
                   reference: dict[str, Any], worker: int = 0) -> Callable[[Any], tuple[float, float]]:
    """The two-objective function ``trial -> (accuracy, mean NFE)`` with the pruning rule."""
    import optuna

    cls = CONTROLLERS.get(settings.controller)
    space = tuned_space(cls, settings.fixed, settings.ranges)
    examples = task.examples("validation", settings.n_val, seed=settings.data_seed)
    chunk, rest = examples[: settings.n_chunk], examples[settings.n_chunk:]

    def objective(trial: Any) -> tuple[float, float]:
        params = with_point(cls, dict(settings.fixed), suggest(trial, space))  # dotted names: a wrapper's inner
        trial.set_user_attr("worker", f"{worker}:{os.getpid()}")
        try:
            ctrl = cls.build(**params)
            trial.set_user_attr("params", plain_params(ctrl.get_params()))
            first = score_examples(loaded, task, ctrl, config, chunk, settings.batch_size)
        except ParameterError as exc:  # sampled values incompatible with each other or the config
            trial.set_user_attr("invalid", str(exc))
            raise optuna.TrialPruned(f"invalid: {exc}") from None
        chunk_accuracy = mean(first.correct)
        trial.set_user_attr("chunk_accuracy", chunk_accuracy)
        floor = reference["chunk_accuracy"] - (settings.prune_margin if settings.prune_margin is not None else math.inf)
        if rest and chunk_accuracy < floor:
            trial.set_user_attr("pruned_reason", f"chunk accuracy {chunk_accuracy:.3f} < {floor:.3f}")
            raise optuna.TrialPruned(f"accuracy {chunk_accuracy:.3f} on the first {len(chunk)} examples")
        fig = (first + score_examples(loaded, task, ctrl, config, rest, settings.batch_size)).figures()
        trial.set_user_attr("tpf", fig["tpf"])
        return fig["accuracy"], fig["nfe"]

    return objective


def plain_params(params: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(params, default=str))


def count_done(study: Any, study_name: Optional[str] = None, states: Optional[tuple] = None) -> int:
    """Finished (complete or pruned) trials of a study, or of ``study_name`` in a storage; ``states``
    counts those states instead (``(TrialState.WAITING,)``: enqueued trials no worker took yet)."""
    import optuna
    from optuna.trial import TrialState

    if study_name is not None:
        study = optuna.load_study(study_name=study_name, storage=study)
    return len(study.get_trials(deepcopy=False, states=states or (TrialState.COMPLETE, TrialState.PRUNED)))


def run_worker(settings: TuneSettings, storage: Any, study_name: str, n_trials: int, seed: int,
               worker: int = 0, num_threads: Optional[int] = None, verbose: bool = False,
               loaded: Any = None) -> int:
    """Run trials of ``study_name`` until it holds ``n_trials`` finished ones; returns how many ran.

    Module-level so that spawned processes can run it; each opens its own storage connection.
    """
    import optuna

    if num_threads:
        torch.set_num_threads(int(num_threads))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded, task, config = _load(settings, loaded)
    store = open_storage(storage)
    done = count_done(optuna.load_study(study_name=study_name, storage=store))
    remaining = n_trials - done
    if remaining <= 0:
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(
            seed=stable_seed(seed, worker, done) % (2**31), constant_liar=True,
            n_startup_trials=max(4, n_trials // 3),
        )
    study = optuna.load_study(study_name=study_name, storage=store, sampler=sampler)
    reference = study.user_attrs["reference"]
    objective = make_objective(settings, loaded, task, config, reference, worker)
    callbacks: list[Any] = [optuna.study.MaxTrialsCallback(
        n_trials, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))]
    if verbose:
        callbacks.append(_print_trial)
    study.optimize(objective, n_trials=remaining, callbacks=callbacks, gc_after_trial=False)
    return count_done(study) - done


def _print_trial(study: Any, trial: Any) -> None:
    if trial.values:
        text = f"accuracy {trial.values[0]:.3f}  NFE {trial.values[1]:.2f}"
    else:
        text = f"{trial.state.name.lower()} ({trial.user_attrs.get('pruned_reason') or trial.user_attrs.get('invalid', '')})"
    print(f"  trial {trial.number:>3}: {text}  {trial.params}", file=sys.stderr, flush=True)
