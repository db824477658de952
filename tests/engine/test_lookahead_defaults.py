"""The lookahead's defaults are the configured escalating rules verifier: ``Lookahead.build(scorer="sudoku_rules",
escalate=[0.99])`` and the lookahead of experiments/configs/lookahead_confirm.yaml decode the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.lookahead import Branching, Lookahead, Ranking, Rollout

ROOT = Path(__file__).resolve().parents[2]
ROW = "margin_topk + lookahead (rules verifier, escalate 0.99, lazy)"


def _configured_row() -> dict:
    doc = yaml.safe_load((ROOT / "experiments" / "configs" / "lookahead_confirm.yaml").read_text())
    return next(s for s in doc["strategies"] if s.get("label") == ROW)


def test_each_part_has_the_facades_default_and_the_facade_only_routes_them():
    la = Lookahead()
    for part in (Branching, Rollout, Ranking):
        for name in part.params:
            assert getattr(la, name) == part.default(name), (part.__name__, name)
    assert set(Lookahead.params) == {*Branching.params, *Rollout.params, *Ranking.params, "budget"}
    assert la.budget == 128


def test_defaults_decode_sudoku9_as_the_configured_escalating_rules_verifier():
    import adaptive_decoding.scorers as scorers  # noqa: F401 - registers sudoku_rules
    from adaptive_decoding.framework.engine.evaluate import decode_texts
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.training.zoo import load_model

    row = _configured_row()
    configured = Lookahead.build(**row["lookahead"])
    default = Lookahead.build(scorer="sudoku_rules", escalate=[0.99])
    assert default.get_params() == configured.get_params()
    task = get_task("sudoku9")
    loaded = load_model("tiny-sudoku9", device="cpu", progress=False)
    examples = task.examples("test", 4)
    cfg = DecodeConfig.build(gen_length=task.gen_length, block_length=task.default_block_length, seed=0,
                             **row.get("decode", {}))
    runs = []
    for la in (configured, default):
        params = dict(row["params"], base={"name": "margin_topk", "params": {"eta": 0.9}})  # a point of its sweep
        _, results, gen = decode_texts(loaded, examples, build_controller(row["controller"], **params),
                                       cfg, ids=[e.id for e in examples], lookahead=la, task=task)
        (res,) = results
        runs.append((gen, res.nfe.tolist(), res.lookahead_nfe.tolist(), res.escalations.tolist()))
    assert runs[0] == runs[1]
    assert sum(runs[0][2]) > 0  # the lookahead searched


def test_the_loops_lookahead_budget_moved_to_the_lookahead():
    with pytest.raises(ParameterError, match=r"lookahead_budget is no longer a decoding option.*--lookahead budget=N"):
        DecodeConfig.build(gen_length=8, lookahead_budget=16)
    from adaptive_decoding.framework.cli.main import build_parser
    from adaptive_decoding.framework.cli.options import resolve_decoding

    args = build_parser().parse_args(["decode", "--prompt", "x", "--controller", "margin_topk",
                                      "--set", "lookahead_budget=128"])
    with pytest.raises(ParameterError, match=r"lookahead_budget is no longer a decoding option.*--lookahead budget=N"):
        resolve_decoding(args)
    spent = torch.tensor([0, 5, 20])
    assert Lookahead(budget=16).budget_left(None, spent).tolist() == [16, 11, -4]


def test_the_lookahead_takes_its_parts_options_and_build_routes_the_flat_keys_to_them():
    from adaptive_decoding.framework.jobs.plan import describe_lookahead

    parts = Lookahead(Branching(width=3, escalate=[0.99]), Rollout(rollout="sequential", max_depth=4, advance=4),
                      Ranking(scorer="logprob", rescore="pll"), budget=32)
    flat = Lookahead.build(width=3, escalate=[0.99], rollout="sequential", max_depth=4, advance=4, scorer="logprob",
                           rescore="pll", budget=32)
    assert (flat.branching.width, flat.rollout_rule.max_depth, flat.ranking.rescore) == (3, 4, "pll")
    assert parts.get_params() == flat.get_params()
    # get_params stays flat (the lookahead: mapping, results files' settings hash) and round-trips
    assert set(flat.get_params()) == {"scorer", *Lookahead.params} == set(Lookahead.flat_keys())
    assert Lookahead.build(**flat.get_params()).get_params() == flat.get_params()
    assert describe_lookahead(parts, "logprob") == describe_lookahead(flat, "logprob")
    # a flat key reads and writes through to its part
    flat.width = 4
    flat.set_params(rescore="none", budget=8)
    assert (flat.branching.width, flat.ranking.rescore, flat.budget) == (4, "none", 8)
    assert (flat.width, flat.rollout, flat.scorer) == (4, "sequential", "logprob")


def test_the_lookahead_refuses_an_unknown_key_and_a_part_of_the_wrong_kind():
    with pytest.raises(ParameterError, match=r"Lookahead has no parameter 'widht'; known: scorer, width"):
        Lookahead.build(widht=2)
    with pytest.raises(ParameterError, match=r"Lookahead has no parameter 'depth'"):
        Lookahead().set_params(depth=2)
    with pytest.raises(ParameterError, match=r"Lookahead.branching=\{'width': 2\} is not allowed; allowed: a Branching"):
        Lookahead(branching={"width": 2}).validate()
    with pytest.raises(ParameterError, match=r"Lookahead.width=0 is out of range"):
        Lookahead(Branching(width=0)).validate()
