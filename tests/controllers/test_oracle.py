"""The oracle controller: the reference's output with the fewest forward passes the toys allow."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.controllers.oracle import MissingReferenceError, oracle_decode
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext
from adaptive_decoding.framework.engine.controller_io import (
    build_controller,
    load_controller,
    save_controller,
)
from adaptive_decoding.framework.engine.evaluate import evaluate, item_seeds
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.reference import decode_with_reference, reference_spec
from adaptive_decoding.framework.tasks.base import get_task
from adaptive_decoding.framework.testing.carry import carry_model
from adaptive_decoding.framework.testing.toys import ContextToyDenoiser, CouplingDenoiser, ToyDenoiser

PROMPTS = [[1, 2], [3], [4, 5, 6], [7, 8, 9, 10]]
SEEDS = [11, 12, 13, 14]


def commits(result):
    return [rec["commits"].tolist() for rec in result.trace]


@pytest.mark.parametrize("block_length, blocks", [(None, 1), (4, 2), (2, 4)])
def test_context_free_toy_needs_one_forward_per_block(block_length, blocks):
    toy = ToyDenoiser(answer=[1, 2, 3, 4, 5, 6, 7, 8], conf=[0.95, 0.5, 0.99, 0.45, 0.92, 0.6, 0.7, 0.8])
    out, ref = oracle_decode(toy, [[0, 0]], DecodeConfig(gen_length=8, block_length=block_length))
    assert out.generated.tolist() == ref.generated.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert out.nfe.tolist() == [blocks] and ref.nfe.tolist() == [8]


@pytest.mark.parametrize("block_length, nfe, per_step", [(None, 2, [3, 1]), (2, 3, [1, 1, 2])])
def test_coupled_pair_is_committed_one_word_at_a_time(block_length, nfe, per_step):
    """While both words are masked, the second predicts the wrong pair's word: the oracle must
    commit the first alone, then the second; everything else goes in the first step of its block."""
    model = CouplingDenoiser()
    out, ref = oracle_decode(model, [[5]], DecodeConfig(gen_length=4, block_length=block_length))
    assert torch.equal(out.generated, ref.generated) and out.generated[0, :2].tolist() == [0, 1]
    assert out.nfe.tolist() == [nfe] and ref.nfe.tolist() == [4]
    assert commits(out) == [[c] for c in per_step]
    assert all(int(rec["forced"].sum()) == 0 for rec in out.trace)


def test_carry_toy_reaches_the_designed_minimum():
    """On the carry toy a digit is right only once every lower digit is decided if it receives a
    carry, so the fewest forward passes are 1 + carries, exactly what the oracle spends."""
    loaded, task = carry_model(), get_task("addition", digits=2)
    config = DecodeConfig(gen_length=task.gen_length)
    ex = task.examples("test", 32)
    res = evaluate(loaded, task, build_controller("oracle"), config, split="test", n=32, batch_size=8)
    ref = evaluate(loaded, task, build_controller("sequential"), config, split="test", n=32, batch_size=8)
    assert [s.nfe for s in res.samples] == [1 + e.meta["carries"] for e in ex]
    assert res.accuracy == 1.0 and ref.accuracy == 1.0 and res.forced_steps == 0
    assert ref.nfe == task.gen_length
    answers = [s.answer_tokens for s in res.samples]  # up to and including the first [EOS]
    assert answers == [len(task.tokenizer.encode(e.answer)) + 1 for e in ex]
    assert res.tpf == pytest.approx(sum(answers) / sum(1 + e.meta["carries"] for e in ex))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_output_equals_reference_batch_invariant_with_forced_steps(temperature):
    """On the context toy every commit changes every prediction, so steps where nothing matches
    happen: the oracle then writes the reference token, and still ends at the reference output."""
    model = ContextToyDenoiser()
    config = DecodeConfig(gen_length=8, temperature=temperature)
    out, ref = oracle_decode(model, PROMPTS, config, seeds=SEEDS)
    assert torch.equal(out.generated, ref.generated)
    assert (out.nfe <= ref.nfe).all() and (out.nfe < ref.nfe).any()
    assert int(out.forced.sum()) == 0  # the loop never had to add a token
    forced = sum(int(rec["forced"].sum()) for rec in out.trace)
    assert forced > 0
    for i, (p, s) in enumerate(zip(PROMPTS, SEEDS)):
        single, _ = oracle_decode(model, [p], config, seeds=[s])
        assert torch.equal(single.generated[0], out.generated[i]) and int(single.nfe[0]) == int(out.nfe[i])
    again, _ = oracle_decode(model, PROMPTS, config, seeds=SEEDS)
    assert torch.equal(again.generated, out.generated) and torch.equal(again.nfe, out.nfe)


def test_other_reference_and_round_trip(tmp_path):
    model = ContextToyDenoiser()
    config = DecodeConfig(gen_length=8, block_length=4)
    out, ref = oracle_decode(model, PROMPTS, config, seeds=SEEDS, reference="fast_dllm")
    assert torch.equal(out.generated, ref.generated) and (out.nfe <= ref.nfe).all()
    oracle = build_controller("oracle", reference="llada")
    path = save_controller(oracle, tmp_path / "oracle.yaml")
    assert load_controller(path) == oracle and load_controller(path).get_params() == {"reference": "llada"}


def test_missing_or_mismatched_reference_fails_clearly():
    oracle = build_controller("oracle")
    config = DecodeConfig(gen_length=8)
    # no model reaches a controller: without a reference the oracle refuses and says how to give one
    with pytest.raises(MissingReferenceError, match=r"reference_tokens.*decode_with_reference"):
        decode(ContextToyDenoiser(), PROMPTS, oracle, config, seeds=SEEDS)
    # the callers that honour Controller.reference_param run the reference first
    auto = decode_with_reference(ContextToyDenoiser(), PROMPTS, oracle, config, seeds=SEEDS)
    seq = decode(ContextToyDenoiser(), PROMPTS, build_controller("sequential"), config, seeds=SEEDS)
    assert torch.equal(auto.generated, seq.generated) and (auto.nfe <= seq.nfe).all()
    given = decode(ContextToyDenoiser(), PROMPTS, oracle, config, seeds=SEEDS,
                   context=DecodeContext(reference_tokens=seq.generated))
    assert torch.equal(given.generated, auto.generated) and torch.equal(given.nfe, auto.nfe)
    with pytest.raises(ValueError, match=r"context.reference_tokens.*batch = 4"):
        decode(ContextToyDenoiser(), PROMPTS, oracle, config, context=DecodeContext(reference_tokens=seq.generated[:2]))
    oracle.bind_reference(torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(MissingReferenceError, match=r"shape \(2, 8\).*\[4, 8\]"):
        decode(ContextToyDenoiser(), PROMPTS, oracle, config)
    with pytest.raises(ParameterError, match="circular"):
        build_controller("oracle", reference="oracle")
    with pytest.raises(Exception, match="unknown controller 'nope'"):
        build_controller("oracle", reference="nope")


def test_evaluate_runs_the_reference_the_oracle_names():
    """``evaluate`` honours ``Controller.reference_param``: the oracle through it equals ``oracle_decode``."""
    loaded, task = carry_model(), get_task("addition", digits=2)
    config = DecodeConfig(gen_length=task.gen_length)
    ex = task.examples("test", 16)
    direct, _ = oracle_decode(loaded.denoiser, [loaded.tokenizer.encode(e.prompt) for e in ex], config,
                              seeds=item_seeds([e.id for e in ex], config.seed))
    via = evaluate(loaded, task, build_controller("oracle"), config, split="test", n=16, batch_size=8)
    assert [s.nfe for s in via.samples] == direct.nfe.tolist()
    assert [s.output for s in via.samples] == [loaded.tokenizer.decode(g, stop_at_eos=True)
                                               for g in direct.generated.tolist()]
    assert reference_spec(build_controller("oracle", reference="llada")) == "llada"
    assert reference_spec(build_controller("sequential")) is None
