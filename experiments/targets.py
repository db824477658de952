"""An experiment's milestone targets: the ``targets:`` mapping of its YAML file, which the report judges.

The comparisons (:mod:`adaptive_decoding.experiments.compare`) are definitions; what counts as *good enough* is a
milestone of an experiment, so it lives in the experiment file, not in library code::

    targets:
      matched:                          # tokens-per-forward ratios at matched accuracy
        baseline_spread: 2.0            # best baseline / worst baseline            ≥
        oracle_room: 2.0                # oracle / best baseline                    ≥
        controller_over_baseline: 1.0   # best heuristic, tuned, learned / best baseline   >
        learned_over_non_learned: 1.0   # best learned / best baseline, heuristic or tuned  ≥
        learned_over_hand_rule: 0.9     # best learned / best heuristic              ≥
        tasks: 3                        # the goal: tasks meeting both baseline_spread and oracle_room
      against_base:                     # lookahead and revocable curves against their base
        gain_points: 5.0                # a gain: ≥ this many points at equal NFE, or
        gain_ratio: 1.2                 #   ≥ this tokens-per-forward and forwards ratio at equal accuracy
        gain_tasks: 2                   # the goal: tasks with a gain
        lookahead_loss_points: 1.0      # no lookahead point more than this below its base at equal NFE
        wino_tasks: 1                   # the goal: tasks where WINO's AUP is above Fast-dLLM's

Every key is optional. A ratio without its target is printed for scale, without ✓ or ✗; a goal
without its number is not stated; a gain or loss line without its threshold is left out. The
runner stores the file in the run folder (``experiment.yaml``) and the report reads the targets from
there. :func:`check_targets` validates the mapping and names each bad key by its YAML path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from adaptive_decoding.experiments.spec import did_you_mean


@dataclass(frozen=True)
class MatchedTargets:
    """Targets on tokens-per-forward ratios at matched accuracy (``None``: no target)."""

    baseline_spread: Optional[float] = None
    oracle_room: Optional[float] = None
    controller_over_baseline: Optional[float] = None
    learned_over_non_learned: Optional[float] = None
    learned_over_hand_rule: Optional[float] = None
    tasks: Optional[int] = None


@dataclass(frozen=True)
class AgainstBaseTargets:
    """Targets of lookahead and revocable curves against their base (``None``: no target)."""

    gain_points: Optional[float] = None
    gain_ratio: Optional[float] = None
    gain_tasks: Optional[int] = None
    lookahead_loss_points: Optional[float] = None
    wino_tasks: Optional[int] = None


@dataclass(frozen=True)
class Targets:
    """An experiment's ``targets:`` (every field ``None`` when the file has none)."""

    matched: MatchedTargets = field(default_factory=MatchedTargets)
    against_base: AgainstBaseTargets = field(default_factory=AgainstBaseTargets)


#: the keys that count tasks (an integer ≥ 0); every other key is a number ≥ 0
COUNTS = ("tasks", "gain_tasks", "wino_tasks")
SECTIONS = {"matched": MatchedTargets, "against_base": AgainstBaseTargets}


def _value(key: str, value: Any, path: str, problems: list[tuple[str, str]]) -> Optional[float]:
    """One target's value, or ``None`` with a problem at ``path`` when it is not allowed."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if key in COUNTS and (not number or value != int(value) or value < 0):
        problems.append((path, f"{value!r} is not allowed; allowed: a whole number of tasks ≥ 0"))
        return None
    if not number or value < 0:
        problems.append((path, f"{value!r} is not allowed; allowed: a number ≥ 0"))
        return None
    return int(value) if key in COUNTS else float(value)


def _section(name: str, raw: Any, problems: list[tuple[str, str]]) -> Any:
    """One section (``matched``, ``against_base``) checked into its dataclass."""
    cls = SECTIONS[name]
    if raw is None:
        return cls()
    allowed = [f.name for f in fields(cls)]
    if not isinstance(raw, dict):
        problems.append((f"targets.{name}", f"{raw!r} is not allowed; allowed: a mapping with keys "
                                            f"{', '.join(allowed)}"))
        return cls()
    values = {}
    for key, value in raw.items():
        path = f"targets.{name}.{key}"
        if key not in allowed:
            problems.append((path, "unknown target" + did_you_mean(str(key), allowed)))
            continue
        checked = _value(key, value, path, problems)
        if checked is not None:
            values[key] = checked
    return cls(**values)


def check_targets(raw: Any) -> tuple[Targets, list[tuple[str, str]]]:
    """The ``targets:`` mapping of an experiment file (``None``: no targets) and its problems as
    ``(yaml path, message)``; a bad entry is left out of the returned :class:`Targets`."""
    problems: list[tuple[str, str]] = []
    if raw is None:
        return Targets(), problems
    if not isinstance(raw, dict):
        problems.append(("targets", f"{raw!r} is not allowed; allowed: a mapping with keys "
                                    f"{', '.join(SECTIONS)}"))
        return Targets(), problems
    for key in raw:
        if key not in SECTIONS:
            problems.append((f"targets.{key}", "unknown section" + did_you_mean(str(key), list(SECTIONS))))
    return Targets(**{name: _section(name, raw.get(name), problems) for name in SECTIONS}), problems
