"""Training data for learned policies: the states of reference decoding, one row per eligible
position, labelled by whether its prediction is the final token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.options import ExampleDraw
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller import DecodeState, stay_limit_of
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.learning.features import FEATURE_NAMES, feature_matrix
from adaptive_decoding.framework.models.structure import task_generation_structure


# ---------------------------------------------------------------------- rollouts -> dataset
@dataclass
class RolloutDataset:
    """Rows of (φ, y): ``X`` float ``[N, F]``, ``y`` float ``[N]`` in {0, 1}, and where each row
    came from: ``sample`` (index of the prompt), ``step`` and ``position`` (in the generation)."""

    X: torch.Tensor
    y: torch.Tensor
    sample: torch.Tensor
    step: torch.Tensor
    position: torch.Tensor
    feature_names: tuple[str, ...] = FEATURE_NAMES

    def __len__(self) -> int:
        return int(self.y.numel())

    def select(self, names: Sequence[str]) -> "RolloutDataset":
        """The same rows with only the feature columns ``names`` (in that order)."""
        names = tuple(names)
        if names == self.feature_names:
            return self
        idx = [self.feature_names.index(n) for n in names]
        return RolloutDataset(X=self.X[:, idx], y=self.y, sample=self.sample, step=self.step,
                              position=self.position, feature_names=names)

    @staticmethod
    def empty() -> "RolloutDataset":
        none = torch.zeros(0, dtype=torch.long)
        return RolloutDataset(torch.zeros(0, len(FEATURE_NAMES)), torch.zeros(0), none, none, none)

    @property
    def positive_rate(self) -> float:
        return float(self.y.mean()) if len(self) else float("nan")

    @staticmethod
    def concat(parts: Sequence["RolloutDataset"]) -> "RolloutDataset":
        offset, samples = 0, []
        for p in parts:
            samples.append(p.sample + offset)
            offset += int(p.sample.max()) + 1 if len(p) else 0
        names = {p.feature_names for p in parts if len(p)}
        if len(names) > 1:
            raise ValueError(f"cannot concatenate rows of different feature columns: {sorted(names)}")
        return RolloutDataset(
            X=torch.cat([p.X for p in parts]), y=torch.cat([p.y for p in parts]), sample=torch.cat(samples),
            step=torch.cat([p.step for p in parts]), position=torch.cat([p.position for p in parts]),
            feature_names=names.pop() if names else FEATURE_NAMES,
        )


class StepRecorder:
    """Wraps a controller; after each of its decisions, appends ``record(f, state, rows, decision)``
    to ``records`` (``rows``: each row's index in the decode call, carried in ``state.memory`` so
    the loop's row subsetting keeps it right). Subclasses choose what a step's record holds."""

    ROW_KEY = "_recorder.row"

    def __init__(self, inner: Any, gen_length: int, structure: Optional[dict] = None) -> None:
        self.inner, self.gen_length, self.structure = inner, gen_length, structure
        self.records: list[tuple[torch.Tensor, ...]] = []

    def features(self, f: StepFeatures) -> torch.Tensor:
        """φ of the step's window (:func:`feature_matrix`, with the task's declared structure)."""
        return feature_matrix(f, self.gen_length, self.structure)

    @property
    def verifies(self) -> bool:
        """The loop gives hidden-slot probabilities to a recorded controller that asks for them."""
        return bool(getattr(self.inner, "verifies", False))

    def stay_limit(self) -> int:
        """The recorded controller's edits (:meth:`Controller.stay_limit`): the loop bounds them the same."""
        return stay_limit_of(self.inner)

    @property
    def default_block_add_threshold(self) -> Optional[float]:
        """The recorded controller's multi-block default (``d3llm``'s 0.1): the same window is recorded."""
        return getattr(self.inner, "default_block_add_threshold", None)

    def reset(self, state: DecodeState) -> None:
        self.inner.reset(state)
        state.memory[self.ROW_KEY] = torch.arange(state.batch_size, device=state.seeds.device)

    def decide(self, f: StepFeatures, state: DecodeState) -> Any:
        rows = state.memory[self.ROW_KEY].clone()
        decision = self.inner.decide(f, state)
        self.records.append(self.record(f, state, rows, decision))
        return decision

    def record(self, f: StepFeatures, state: DecodeState, rows: torch.Tensor, decision: Any) -> tuple:
        raise NotImplementedError


class _Recorder(StepRecorder):
    """Records (φ, row, position, x0, step) of every eligible position at every step."""

    def record(self, f: StepFeatures, state: DecodeState, rows: torch.Tensor, decision: Any) -> tuple:
        b, i = f.eligible.nonzero(as_tuple=True)
        return (self.features(f)[b, i].cpu(), rows[b].cpu(), f.position[b, i].cpu(),
                f.x0[b, i].cpu(), f.step[b].cpu())


@torch.no_grad()
def collect_rollouts(model: Any, prompts: Sequence[Sequence[int]], config: DecodeConfig, *,
                     seeds: Any = None, rollout: Any = None, structure: Optional[dict] = None,
                     context: Optional[DecodeContext] = None) -> RolloutDataset:
    """Rows of every step of decoding ``prompts``, labelled against sequential decoding's output.

    Args:
        rollout: the controller whose states are recorded (default: ``sequential`` itself, then
            one decode pass is enough). Labels always come from ``sequential``'s final tokens.
        structure: the generation's declared structure, for the peer features.
        context: the call's decode context (:meth:`DecodeContext.for_batch`), for both decodes.
    """
    G = config.gen_length
    seq = build_controller("sequential")
    rec = _Recorder(seq if rollout is None else rollout, G, structure)
    if rollout is None:
        final = decode(model, prompts, rec, config, seeds=seeds, context=context).generated.cpu()
    else:
        final = decode(model, prompts, seq, config, seeds=seeds, context=context).generated.cpu()
        decode(model, prompts, rec, config, seeds=seeds, context=context)
    if not rec.records:
        return RolloutDataset.empty()
    X, rows, pos, x0, step = (torch.cat(parts) for parts in zip(*rec.records))
    y = (x0 == final[rows, pos]).float()
    return RolloutDataset(X=X, y=y, sample=rows, step=step, position=pos)


def over_split(loaded: Any, task: Any, collect: Any, draw: ExampleDraw, *,
               config: Optional[DecodeConfig] = None, progress: Any = None) -> RolloutDataset:
    """``collect(prompts, seeds, config, start, context)`` over ``draw``'s examples of a task
    (:class:`~adaptive_decoding.framework.core.options.ExampleDraw`: ``n`` of a split, ``batch_size`` at a time; seeds as
    in evaluation; ``context`` the batch's :meth:`DecodeContext.for_batch`), the parts concatenated;
    ``progress`` (a tqdm bar) counts prompts."""
    from adaptive_decoding.framework.engine.evaluate import item_seeds

    draw.validate()
    config = config or DecodeConfig(gen_length=task.gen_length, block_length=task.default_block_length)
    examples = task.examples(draw.split, draw.n, seed=draw.data_seed)
    tok = loaded.tokenizer
    parts = []
    for start in range(0, len(examples), draw.batch_size):
        chunk = examples[start : start + draw.batch_size]
        parts.append(collect([tok.encode(ex.prompt) for ex in chunk], item_seeds([ex.id for ex in chunk], config.seed),
                             config, start, DecodeContext.for_batch(tok, chunk, task=task, gen_length=config.gen_length)))
        if progress is not None:
            progress.update(len(chunk))
    return RolloutDataset.concat(parts)


def build_dataset(loaded: Any, task: Any, draw: ExampleDraw, *, config: Optional[DecodeConfig] = None,
                  rollout: Any = None) -> RolloutDataset:
    """:func:`collect_rollouts` over ``draw``'s examples of a task (seeds as in evaluation)."""
    structure = task_generation_structure(task)
    return over_split(loaded, task,
                      lambda prompts, seeds, cfg, start, context: collect_rollouts(
                          loaded.denoiser, prompts, cfg, seeds=seeds, rollout=rollout, structure=structure,
                          context=context),
                      draw, config=config)
