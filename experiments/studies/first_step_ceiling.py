"""How much of the oracle's first step can a score commit before its first error?

The learned-controller target asks for 85% of the oracle's tokens per forward. The oracle commits,
at every step, the positions whose current prediction x0 already equals the token that
one-token-per-step decoding (``sequential``) ends with; most of its commits come in the first
forward. A controller that decides from a per-position score s (confidence, margin, −entropy, a
learned policy's p(safe), a probe on the model's hidden state) can do no better in that forward
than to commit the blanks ranked highest by s, down to the first one whose x0 is wrong. This module
measures, on the first forward of ``n`` test prompts:

* ``oracle``: the blanks the oracle commits (x0 right), per prompt;
* ``clean``: for each score, the blanks ranked before the first wrong one, per prompt: a hindsight
  bound (the cut-off is chosen per prompt knowing the answer), so a real threshold commits fewer;
* ``global cut``: the blanks one threshold on the score, the same for every prompt, commits while
  99% of the prompts commit no wrong blank (what a fixed rule on that score can do);
* ``auc``: how well the score ranks right above wrong x0 over all blanks (0.5 = chance).

``--train N`` fits two models on ``N`` training prompts' first forwards:

* a **probe**: logistic regression on the model's last hidden state (the input of its ``head``, the
  tiny models) plus confidence, margin and entropy, scored like the others: does the model know
  more about which predictions will stand than its output distribution says?
* an **adaptive count**: p(the r most confident blanks are all right | the prompt's sorted
  confidences, r), logistic; a prompt commits its leading ranks while p > q. Does the confidence
  profile tell, per prompt, how far down the ranking is safe (the gap between the hindsight bound
  and one cut-off for all)? Reported per q as blanks committed and prompts error-free.

    python -m adaptive_decoding.experiments.studies.first_step_ceiling --task sudoku9 --n 300 \
        --policy rl=runs/controllers/sudoku9-tiny-sudoku9-rl-res/mlp.pt --train 500
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import ParameterError, parse_assignments
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.loop import decode


def clean_prefix(score: torch.Tensor, right: torch.Tensor, blank: torch.Tensor) -> torch.Tensor:
    """Per row, the blanks ranked by ``score`` (highest first) before the first one not ``right``."""
    s = score.float().masked_fill(~blank, float("-inf"))
    order = s.argsort(dim=1, descending=True, stable=True)
    ok = (right | ~blank).gather(1, order).long().cumprod(1).sum(1)
    return torch.minimum(ok, blank.sum(1))


def global_cut(score: torch.Tensor, right: torch.Tensor, blank: torch.Tensor, keep: float = 0.99,
               grid: int = 200) -> tuple[float, float]:
    """One threshold t for every prompt (what a fixed rule on the score can do): the lowest of ``grid``
    quantiles of the blanks' scores at which at least ``keep`` of the prompts commit no wrong blank
    (s ≥ t); returns ``(t, mean blanks committed)``. ``(inf, 0)`` if none."""
    s = score.float().masked_fill(~blank, float("-inf"))
    best = (float("inf"), 0.0)
    for t in torch.quantile(score[blank].float(), torch.linspace(1, 0, grid)).tolist():
        commit = blank & (s >= t)
        if (~(commit & ~right).any(1)).float().mean() < keep:
            break
        best = (t, float(commit.sum(1).float().mean()))
    return best


def ranking_auc(score: torch.Tensor, right: torch.Tensor, blank: torch.Tensor) -> float:
    """P(score of a right blank > score of a wrong one), ties counted half (ROC AUC); NaN with one class."""
    from sklearn.metrics import roc_auc_score

    y = right[blank]
    if y.all() or not y.any():
        return float("nan")
    return float(roc_auc_score(y.numpy(), score[blank].double().numpy()))


class _FirstStep(Controller):
    """Records the first step's features (and the head's input, when hooked), commits everything."""

    name = "first_step_recorder"

    def __init__(self, hidden: Optional[dict] = None) -> None:
        self.hidden = hidden
        self.f: Optional[StepFeatures] = None
        self.h: Optional[torch.Tensor] = None

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        self.f, self.h = f, None if self.hidden is None else self.hidden.get("h")
        return Decision(commit=f.eligible.clone())


def first_step(loaded: Any, task: Any, split: str, n: int, policies: dict[str, str], batch: int = 100,
               hidden: bool = False) -> dict[str, Any]:
    """Scores, rightness and blanks of the first forward over ``n`` prompts of ``split``."""
    from adaptive_decoding.framework.learning.features import feature_matrix
    from adaptive_decoding.framework.learning.policy import load_policy

    den, tok = loaded.denoiser, loaded.tokenizer
    examples = task.examples(split, n, seed=0)
    g = int(task.gen_length)
    cfg = DecodeConfig(gen_length=g, block_length=g)
    store: dict = {}
    hook = None
    if hidden:
        if not hasattr(den, "head"):
            raise ValueError(f"--train's probe reads the input of the denoiser's 'head'; "
                             f"{type(den).__name__} has none")
        hook = den.head.register_forward_hook(lambda m, i, o: store.__setitem__("h", i[0].detach()))
    out: dict[str, list] = {"right": [], "blank": [], "hidden": []}
    try:
        for i in range(0, n, batch):
            chunk = examples[i:i + batch]
            prompts = [tok.encode(e.prompt) for e in chunk]
            ref = decode(den, prompts, build_controller("sequential"), cfg).generated
            rec = _FirstStep(store if hidden else None)
            r = decode(den, prompts, rec, cfg)
            f = rec.f
            blank = f.eligible.clone()
            for j, e in enumerate(chunk):  # givens are eligible canvas slots but no decision (Sudoku)
                blank[j, list(e.meta.get("givens", {}))] = False
            scores = {"confidence": f.confidence, "margin": f.margin, "neg_entropy": -f.entropy}
            for name, path in policies.items():
                pol = load_policy(path)
                scores[name] = pol.prob(feature_matrix(f, g, pol.structure), f.eligible)
            for name, s in scores.items():
                out.setdefault(name, []).append(s.float())
            out["right"].append(f.x0 == ref)
            out["blank"].append(blank)
            if hidden:
                g0 = int(r.gen_start[0])
                h = rec.h[:, g0:g0 + g] if rec.h.shape[1] > g else rec.h
                stats = torch.stack([f.confidence, f.margin, f.entropy], -1).float()
                out["hidden"].append(torch.cat([h.float(), stats], -1))
    finally:
        if hook is not None:
            hook.remove()
    return {k: torch.cat(v) for k, v in out.items() if v}


def probe_scores(train: dict, test: dict) -> torch.Tensor:
    """p(right) of a logistic regression on [hidden state, confidence, margin, entropy] of blanks."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x, y = train["hidden"][train["blank"]].numpy(), train["right"][train["blank"]].numpy()
    scaler = StandardScaler().fit(x)
    clf = LogisticRegression(max_iter=2000).fit(scaler.transform(x), y)
    flat = test["hidden"].reshape(-1, test["hidden"].shape[-1]).numpy()
    return torch.from_numpy(clf.predict_proba(scaler.transform(flat))[:, 1]).float().view(test["blank"].shape)


def _profile(d: dict, top: int) -> torch.Tensor:
    """The prompt's blanks' confidences, sorted, the first ``top`` (−1 past its blanks)."""
    s = d["confidence"].masked_fill(~d["blank"], -1.0).sort(1, descending=True).values[:, :top]
    return torch.nn.functional.pad(s, (0, top - s.shape[1]), value=-1.0)


def _rank_design(profile: torch.Tensor) -> torch.Tensor:
    """One row per (prompt, rank r): the profile, r one-hot, and the r-th confidence."""
    n, top = profile.shape
    eye = torch.eye(top)
    return torch.cat([torch.cat([profile, eye[r].expand(n, top), profile[:, r:r + 1]], 1)
                      for r in range(top)])


def adaptive_count(train: dict, test: dict, levels: Sequence[float] = (0.999, 0.995, 0.99, 0.98, 0.95, 0.9),
                   top: int = 60) -> list[dict]:
    """Per level q: mean blanks committed and the share of prompts with no wrong one, when each
    prompt commits its most confident blanks while p(prefix clean | profile, r) > q."""
    from sklearn.linear_model import LogisticRegression

    def clean_ranks(d: dict) -> torch.Tensor:  # [B, top]: is the prefix of length r + 1 clean?
        return torch.arange(top)[None, :] < clean_prefix(d["confidence"], d["right"], d["blank"])[:, None]

    clf = LogisticRegression(max_iter=3000).fit(_rank_design(_profile(train, top)).numpy(),
                                                clean_ranks(train).T.reshape(-1).numpy())
    p = torch.from_numpy(clf.predict_proba(_rank_design(_profile(test, top)).numpy())[:, 1]).view(top, -1).T
    clean = clean_prefix(test["confidence"], test["right"], test["blank"])
    rows = []
    for q in levels:
        k = (p > q).long().cumprod(1).sum(1).clamp(min=1)
        rows.append({"q": q, "commits": float(k.float().mean()),
                     "error_free": float((k <= clean).float().mean())})
    return rows


def report(data: dict, extra: Optional[dict] = None) -> list[dict]:
    """One row per score: AUC, clean commits (mean, median) and their share of the oracle's."""
    right, blank = data["right"], data["blank"]
    oracle = (right & blank).sum(1).float()
    scores = {k: v for k, v in data.items() if k not in ("right", "blank", "hidden")}
    scores.update(extra or {})
    rows = []
    for name, s in scores.items():
        c = clean_prefix(s, right, blank).float()
        t, cut = global_cut(s, right, blank)
        rows.append({"score": name, "auc": ranking_auc(s, right, blank), "clean_mean": float(c.mean()),
                     "global_cut": t, "global_cut_commits": cut,
                     "clean_median": float(c.median()), "oracle_mean": float(oracle.mean()),
                     "share_of_oracle": float((c / oracle.clamp(min=1)).mean()),
                     "blanks": float(blank.sum(1).float().mean())})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m adaptive_decoding.experiments.studies.first_step_ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="sudoku9")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="task parameter, e.g. grade=hard (the value read as --set reads it); repeatable")
    p.add_argument("--model", default=None, help="default: the task's tiny model")
    p.add_argument("--n", type=int, default=300, help="test prompts")
    p.add_argument("--policy", action="append", default=[], metavar="NAME=PATH", help="a learned policy file")
    p.add_argument("--train", type=int, default=0, metavar="N",
                   help="fit the hidden-state probe and the adaptive count on N training prompts")
    args = p.parse_args(argv)
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.training.zoo import load_model

    try:
        params = parse_assignments(args.task_param, option="--task-param")
    except ParameterError as err:
        p.error(str(err))
    policies = {}  # paths stay strings
    for item in args.policy:
        name, sep, path = item.partition("=")
        if not sep:
            p.error(f"--policy {item!r}: expected NAME=PATH")
        policies[name] = path
    if args.n < 1 or args.train < 0:
        p.error(f"--n {args.n} must be >= 1 and --train {args.train} >= 0")
    task = get_task(args.task, **params)
    loaded = load_model(args.model or f"tiny-{args.task}", progress=False)
    test = first_step(loaded, task, "test", args.n, policies, hidden=args.train > 0)
    extra, counts = {}, []
    if args.train:
        train = first_step(loaded, task, "train", args.train, {}, hidden=True)
        extra["probe (hidden + stats)"] = probe_scores(train, test)
        counts = adaptive_count(train, test)
    rows = report(test, extra)
    print(f"{args.task} {params or ''}: {args.n} test prompts, {rows[0]['blanks']:.1f} blanks each; the "
          f"oracle commits {rows[0]['oracle_mean']:.1f} in its first forward\n")
    print("| score | AUC | commits before the first error, per prompt in hindsight (mean / median) | share "
          "of the oracle's | one cut-off for all, 99% of prompts error-free: commits |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['score']} | {r['auc']:.3f} | {r['clean_mean']:.1f} / {r['clean_median']:.0f} | "
              f"{r['share_of_oracle']:.2f} | {r['global_cut_commits']:.1f} |")
    if counts:
        print("\nadaptive count (commit the most confident blanks while p(prefix clean) > q):\n")
        print("| q | blanks committed | prompts error-free |\n|---|---|---|")
        for c in counts:
            print(f"| {c['q']} | {c['commits']:.1f} | {c['error_free']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
