"""LLaDA-MoE-7B-A1B decodes as LLaDA does: the framework's own LLaDA-MoE under the ``llada``
controller equals LLaDA's published ``generate`` (ML-GSAI/LLaDA ``generate.py``: semi-autoregressive
blocks, ``steps // num_blocks`` steps a block, ``get_num_transfer_tokens``'s even split with the
remainder first, low-confidence remasking) re-written here at temperature 0 and run on the reference
network re-written from the published LLaDA-MoE modeling code (``tests/fixtures/real_format/
families.py``), on a tiny checkpoint in the real on-disk format (released ``model_type "llada"``,
``LLaDAMoEModelLM``, a softmax router, experts on layers 1-2).

One defect of the reference is fixed in it, as everywhere in this framework: the mask id is never a
prediction (``logits[..., mask_id] = -inf`` before the argmax; the published code can commit the
mask id, leaving the position masked)."""

from __future__ import annotations

import _adec_real_format_families as real_format_families  # loaded by tests/conftest.py
import pytest
import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.models.arch import LLaDAMoEModel, load_architecture
from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

MASK, V, EOS = 310, 320, 301
HEAD_SCALE = 40.0  # a sharper head: the confidences spread, so the order of commits is decided


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    fam = real_format_families
    folder = fam.build(tmp_path_factory.mktemp("lladamoe") / "ckpt", fam.llada_moe_config(), seed=4)
    own, ref = load_architecture(folder, dtype=torch.float32), fam.reference_model(folder)
    assert isinstance(own, LLaDAMoEModel)
    with torch.no_grad():
        own.norm.weight.mul_(HEAD_SCALE)
        ref.model.norm.weight.mul_(HEAD_SCALE)
    return OwnArchitectureDenoiser(own, mask_token_id=MASK, vocab_size=V, eos_token_id=EOS), ref, fam


def transfer_counts(masked: int, steps: int) -> list[int]:
    """``get_num_transfer_tokens``: ``masked // steps`` each step, the remainder to the first ones."""
    return [masked // steps + (1 if i < masked % steps else 0) for i in range(steps)]


@torch.no_grad()
def llada_generate(fam, ref, prompt: list[int], *, gen_length: int, block_length: int, steps: int
                   ) -> tuple[list[int], int]:
    """LLaDA's ``generate`` (temperature 0, ``remasking='low_confidence'``, no CFG), batch 1."""
    x = torch.full((1, len(prompt) + gen_length), MASK, dtype=torch.long)
    x[0, :len(prompt)] = torch.tensor(prompt)
    blocks, nfe = gen_length // block_length, 0
    for b in range(blocks):
        lo, hi = len(prompt) + b * block_length, len(prompt) + (b + 1) * block_length
        counts = transfer_counts(int((x[0, lo:hi] == MASK).sum()), steps // blocks)
        for n in counts:
            logits = fam.moe_forward(ref, x)[0].float()
            nfe += 1
            logits[:, MASK] = float("-inf")
            x0 = logits.argmax(-1)
            p = torch.softmax(logits, -1).gather(-1, x0[:, None])[:, 0]
            p[hi:] = float("-inf")
            conf = torch.where(x[0] == MASK, p, torch.tensor(float("-inf")))
            pick = torch.topk(conf, k=n).indices
            x[0, pick] = x0[pick]
    return x[0, len(prompt):].tolist(), nfe


@pytest.mark.parametrize("gen_length, block_length, steps", [(8, 8, 8), (8, 4, 4), (12, 4, 6), (12, 12, 4), (8, 8, 3),
                                                           (12, 4, 9)])
def test_llada_moe_under_the_llada_rule_equals_llada_generate(models, gen_length, block_length, steps):
    den, ref, fam = models
    ctrl = build_controller("llada", steps=steps)
    for prompt in ([5, 6, 7], [8, 9, 10, 11, 12], [20]):
        want, nfe = llada_generate(fam, ref, prompt, gen_length=gen_length, block_length=block_length, steps=steps)
        res = decode(den, [prompt], ctrl, DecodeConfig(gen_length=gen_length, block_length=block_length))
        assert res.generated[0].tolist() == want and int(res.nfe[0]) == nfe, (prompt, gen_length, steps)


def test_llada_moe_batches_and_caches_as_llada(models):
    """A ragged batch equals its rows; LLaDA-MoE is full attention, so Fast-dLLM's caches apply and
    the exact block cache is refused."""
    den, _, _ = models
    ctrl = build_controller("llada", steps=8)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [20]]
    config = DecodeConfig(gen_length=8, block_length=4, cache="prefix")
    batch = decode(den, prompts, ctrl, config)
    for i, p in enumerate(prompts):
        assert batch.generated[i].tolist() == decode(den, [p], ctrl, config).generated[0].tolist()
    from adaptive_decoding.framework.core.params import ParameterError

    with pytest.raises(ParameterError, match="cache='block' does not apply to a full model"):
        decode(den, prompts, ctrl, DecodeConfig(gen_length=8, cache="block"))
