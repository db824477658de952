"""Which examples of a task a run decodes, as an options group (:mod:`framework.core.options`).

:class:`ExampleDraw`: ``n`` examples of a ``split`` drawn with ``data_seed``
(``task.examples(split, n, seed=data_seed)``), decoded ``batch_size`` prompts at a time. The
policies' rollouts (:func:`framework.learning.rollouts.over_split`, the DAgger and set-labelled
datasets), the threshold calibration and the sharded evaluation of an experiment's cell take one.
"""

from __future__ import annotations

from dataclasses import dataclass

from framework.core.options import Options
from framework.core.params import Param
from framework.tasks.base import SPLITS


@dataclass(repr=False, eq=False)
class ExampleDraw(Options):
    """``n`` examples of ``split`` drawn with ``data_seed`` (the same list on every call), decoded
    ``batch_size`` prompts at a time (item i's decoding seed is ``stable_seed(config.seed, id_i)``,
    as in evaluation, so the batch size never changes a token)."""

    section = "draw"
    params = {
        "split": Param(str, choices=SPLITS, doc="the split the examples come from"),
        "n": Param(int, low=1, doc="examples drawn"),
        "batch_size": Param(int, low=1, doc="prompts decoded together"),
        "data_seed": Param(int, low=0, doc="seed of the examples' draw"),
    }

    split: str = "test"
    n: int = 200
    batch_size: int = 64
    data_seed: int = 0
