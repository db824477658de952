"""Recording a controller's decisions (the learned policies' rollouts) must not change the decode: the
recorder passes on what the loop reads from the controller besides its decisions — the edits it may
make (``stay_limit``: LLaDA2.1's token-to-token editing) and its multi-block default (``d3llm``)."""

from __future__ import annotations

import pytest
import torch

from adaptive_decoding.framework import DecodeConfig, build_controller, decode
from adaptive_decoding.framework.learning.rollouts import StepRecorder
from adaptive_decoding.framework.testing.toys import BlockCausalToy, ContextToyDenoiser


class Recorder(StepRecorder):
    def record(self, f, state, rows, decision):
        return (rows,)


@pytest.mark.parametrize("name, params", [("llada21", {}), ("d3llm", {}), ("fast_dllm", {"threshold": 0.7})])
def test_a_recorded_decode_equals_the_unrecorded_one(name, params):
    model = BlockCausalToy(ContextToyDenoiser(), block_size=3)
    prompts, config = [[1, 2, 3], [4], [5, 6]], DecodeConfig(gen_length=9)
    plain = decode(model, prompts, build_controller(name, **params), config, seeds=[0, 1, 2])
    recorder = Recorder(build_controller(name, **params), gen_length=9)
    recorded = decode(model, prompts, recorder, config, seeds=[0, 1, 2])
    assert torch.equal(plain.generated, recorded.generated) and torch.equal(plain.nfe, recorded.nfe)
    assert len(recorder.records) == int(plain.steps.max())
