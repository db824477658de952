"""LLaDA's ``confidence_eos_inf`` (``confidence_eos_eot_inf``) with several end-of-text tokens.

LLaDA-Instruct ends an answer with ``<|eot_id|>`` (126348) and pads with ``<|endoftext|>``
(126081); the option must rank a prediction of *either* last. The designed toy below has an EOS
(the loop's ``eos_token_id``) and a second end token EOT that the model lists in ``eos_token_ids``,
both predicted far more confidently than the content.
"""

from __future__ import annotations

import torch

from adaptive_decoding.controllers.baselines import Sequential, end_token_ids
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import DecodeState
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.testing.toys import ToyDenoiser

V = 16
EOS, EOT = V - 2, 12  # ToyDenoiser's EOS is V − 2; EOT is an ordinary id the model names as an end
ANSWER = [3, 5, EOT, EOS, EOS, EOS]
CONF = [0.5, 0.6, 0.99, 0.98, 0.97, 0.96]  # content unsure, the end tokens confident


class TwoEndsToy(ToyDenoiser):
    """ToyDenoiser whose text ends with EOT or EOS, as LLaDA-Instruct's ends with <|eot_id|> or EOS."""

    def __init__(self, ends=(EOS, EOT)) -> None:
        super().__init__(ANSWER, CONF, vocab_size=V, second=[0.01] * len(ANSWER))
        self.eos_token_ids = tuple(ends)


def order(res, row=0, p=2):
    """Generation positions committed at each step."""
    return [t["commit"][row, p:p + len(ANSWER)].nonzero().squeeze(1).tolist() for t in res.trace]


def run(model, eos_inf):
    ctrl = build_controller("llada", steps=len(ANSWER), confidence_eos_inf=eos_inf)  # one token per step
    return decode(model, [[0, 1]], ctrl, DecodeConfig(gen_length=len(ANSWER)), trace=True)


def test_every_end_token_is_committed_after_the_content():
    r = run(TwoEndsToy(), eos_inf=True)
    assert r.generated[0].tolist() == ANSWER
    # content first (0.6 before 0.5), then the end tokens by their own confidence: EOT 0.99, EOS ...
    assert order(r) == [[1], [0], [2], [3], [4], [5]]


def test_with_only_the_loops_eos_the_eot_would_jump_the_queue():
    """The bug this fixes: a model exposing only eos_token_id lets <|eot_id|> (0.99) go first."""
    r = run(TwoEndsToy(ends=(EOS,)), eos_inf=True)
    assert order(r) == [[2], [1], [0], [3], [4], [5]]
    r = run(TwoEndsToy(), eos_inf=False)  # the option off: pure confidence order
    assert order(r) == [[2], [3], [4], [5], [1], [0]]


def test_llada_random_and_end_token_sources():
    r = decode(TwoEndsToy(), [[0, 1]], build_controller("llada_random", steps=len(ANSWER), confidence_eos_inf=True),
               DecodeConfig(gen_length=len(ANSWER)), trace=True)
    assert sorted(sum(order(r)[:2], [])) == [0, 1]  # random among the content, the ends last
    st = DecodeState(config=DecodeConfig(gen_length=4), seeds=torch.zeros(1, dtype=torch.long), mask_token_id=V - 1,
                     eos_token_id=EOS)
    assert end_token_ids(st) == (EOS,)
    st.context.eos_token_ids = (EOS, EOT)  # what the loop fills in from a TwoEndsToy
    assert end_token_ids(st) == (EOS, EOT)
    st.context.eos_token_ids = (EOT, 7)
    assert end_token_ids(st) == (EOS, EOT, 7)
    seen = []  # the loop fills the context with the model's end tokens

    class Spy(Sequential):
        def decide(self, f, state):
            seen.append(end_token_ids(state))
            return super().decide(f, state)

    decode(TwoEndsToy(), [[0, 1]], Spy(), DecodeConfig(gen_length=2))
    assert seen and all(ids == (EOS, EOT) for ids in seen)
