"""How many tokens per forward could a policy reach if it committed, at every step, the largest set
of positions that is *jointly* safe?

The per-position bound (the ``oracle`` controller: commit every position whose prediction x0
already equals the token one-token-per-step decoding ends with) says nothing about which of two
uncertain words can be committed *together*. This study decodes with a hindsight controller that,
at every step, walks the window's eligible positions by descending confidence and keeps each one
whose x0, committed together with those kept before it and everything already decided, can still be
completed to a correct answer (:meth:`adaptive_decoding.framework.tasks.base.Task.completable`, which reads the
answer); it commits the kept set, or the most confident position when nothing is safe. Its commits
are restricted to what a policy sees (the model's own x0, in the model's confidence order); only the
cut uses the answer. So its tokens per forward bound any controller that ranks by confidence and
chooses, per step, which of them to commit: what "close to the limit" means for a learned policy.

Beside it, on the same test prompts: one token per step, the ``oracle`` (the per-position bound),
the dependence-aware hand rule (``neighbour_nms``), EB and Fast-dLLM.

    python -m adaptive_decoding.experiments.studies.set_bound --task phrases --n 100
    python -m adaptive_decoding.experiments.studies.set_bound --task sudoku9 --task-param grade=hard --n 100
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.measure import tokens_per_forward
from adaptive_decoding.framework.core.params import ParameterError, parse_assignments
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.learning.set_labels import Check, greedy_safe_set

#: the rows beside the bound: (label, controller, params)
BESIDE = (("sequential", "sequential", {}), ("oracle (per-position bound)", "oracle", {}),
          ("neighbour_nms (τ=0.9, r=1)", "neighbour_nms", {"threshold": 0.9, "radius": 1}),
          ("eb (γ=0.1)", "eb", {"gamma": 0.1}), ("fast_dllm (τ=0.9)", "fast_dllm", {"threshold": 0.9}),
          ("fast_dllm (τ=0.99)", "fast_dllm", {"threshold": 0.99}))


class HindsightSet(Controller):
    """Commits the greedy maximal jointly safe set along the confidence ranking (module docstring);
    ``checks[r]`` is row ``r``'s verifier. A study instrument, not a registered controller."""

    ROW = "_hindsight.row"

    def __init__(self, checks: Sequence[Check]) -> None:
        self.checks = list(checks)

    def reset(self, state: DecodeState) -> None:
        state.memory[self.ROW] = torch.arange(state.batch_size, device=state.seeds.device)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        commit = torch.zeros_like(f.eligible)
        rows = state.memory[self.ROW].tolist()
        gen = state.context.generation
        for b, r in enumerate(rows):
            el = f.eligible[b].nonzero(as_tuple=True)[0]
            if not len(el):
                continue
            order = el[torch.argsort(f.confidence[b, el], descending=True, stable=True)]
            flags = greedy_safe_set(self.checks[r], gen[b].tolist(), state.mask_token_id,
                                    [(int(f.position[b, i]), int(f.x0[b, i])) for i in order])
            keep = order[torch.tensor(flags, dtype=torch.bool)] if flags and any(flags) else order[:1]
            commit[b, keep] = True
        return Decision(commit=commit)


def set_bound_row(loaded: Any, task: Any, config: DecodeConfig, n: int, batch: int = 50) -> dict[str, Any]:
    """Accuracy, mean NFE and tokens per forward of :class:`HindsightSet` on ``n`` test prompts."""
    examples = task.examples("test", n)
    tok, right, nfe, answers, t0 = loaded.tokenizer, [], [], [], time.perf_counter()
    for i in range(0, n, batch):
        chunk = examples[i:i + batch]
        checks = [lambda t, c, ex=ex: task.completable(ex, t, c) for ex in chunk]
        res = decode(loaded.denoiser, [tok.encode(ex.prompt) for ex in chunk], HindsightSet(checks), config)
        right += [task.score(ex, tok.decode(g, stop_at_eos=True)) for ex, g in zip(chunk, res.generated.tolist())]
        nfe += res.nfe.tolist()
        answers += res.answer_tokens.tolist()
    mean_nfe = sum(nfe) / len(nfe)
    return {"strategy": "set bound (hindsight)", "accuracy": sum(right) / len(right), "nfe": mean_nfe,
            "tpf": tokens_per_forward(answers, nfe), "seconds": round(time.perf_counter() - t0, 1)}


def rows_beside(loaded: Any, task: Any, config: DecodeConfig, n: int) -> list[dict[str, Any]]:
    """The :data:`BESIDE` strategies on the same prompts (the oracle's reference decode is not counted)."""
    from adaptive_decoding.framework.engine.evaluate import evaluate

    out = []
    for label, name, params in BESIDE:
        res = evaluate(loaded, task, build_controller(name, **params), config, strategy=label, n=n, batch_size=50)
        out.append({"strategy": label, "accuracy": res.accuracy, "nfe": res.nfe, "tpf": res.tpf})
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adaptive_decoding.experiments.studies.set_bound", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="phrases")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="task parameter, e.g. grade=hard; repeatable")
    p.add_argument("--model", default=None, help="default: the task's built-in model")
    p.add_argument("--n", type=int, default=100, help="test prompts (default: 100)")
    args = p.parse_args(argv)
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.training.zoo import load_model_for_task

    try:
        task = get_task(args.task, **parse_assignments(args.task_param, option="--task-param"))
    except ParameterError as err:
        p.error(str(err))
    if args.n < 1:
        p.error(f"--n {args.n} must be >= 1")
    loaded, name = load_model_for_task(task, args.model, progress=False)
    config = DecodeConfig(gen_length=task.gen_length, block_length=task.default_block_length)
    rows = rows_beside(loaded, task, config, args.n) + [set_bound_row(loaded, task, config, args.n)]
    print(f"{task.name} {task.get_params()} on {name}: {args.n} test prompts, G={config.gen_length}, "
          f"blocks of {config.effective_block_length}\n")
    print("| strategy | accuracy | NFE | tokens per forward |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['strategy']} | {r['accuracy']:.3f} | {r['nfe']:.2f} | {r['tpf']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
