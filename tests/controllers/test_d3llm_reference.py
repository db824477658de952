"""``d3llm`` with multi-block decoding against d3LLM's published ``generate_multi_block``
(hao-ai-lab/d3LLM ``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py``), written out below from that
code: its block states, the block-adding and activation rules, the entropy threshold with the
lowest entropy always kept, and the forced lowest-entropy commit in the first fully activated block.
On a designed toy whose entropies move with the context, tokens and NFE are identical over a grid
of τ and ``block_add_threshold`` (the published defaults among them), and the toy is checked to
exercise what makes the rule multi-block: several active blocks, commits outside the first, and
the forced commit in the first block.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaptive_decoding.controllers.d3llm import D3LLM
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.loop import decode

V, MASK, EOS, PAD, ORDINARY = 10, 9, 8, 7, 7
P, G, BLOCK = 2, 16, 4


class EntropyToy(torch.nn.Module):
    """Masked generation position i predicts ``(3i + Σ prompt + Σ decided tokens left of it) mod 7``
    with logit ``β_i + 0.45·(decided positions left of it)`` over six ordinary rivals at 0, so its
    entropy falls as the text left of it is written; ``β_i = 2 + 2.5·sin(1.7 i + 0.3)`` makes some
    later positions surer than earlier ones. The mask id is never predicted."""

    vocab_size, mask_token_id, eos_token_id, pad_token_id = V, MASK, EOS, PAD

    def forward(self, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        b, L = input_ids.shape
        out = torch.full((b, L, V), -30.0)
        out.scatter_(2, input_ids.clamp(max=V - 1).unsqueeze(-1), 0.0)
        gen = input_ids[:, P:P + G]
        decided = gen != MASK
        left_count = torch.cumsum(decided.long(), 1) - decided.long()
        left_sum = torch.cumsum(torch.where(decided, gen, 0), 1) - torch.where(decided, gen, 0)
        i = torch.arange(G)
        answer = (3 * i[None] + input_ids[:, :P].sum(1, keepdim=True) + left_sum) % ORDINARY
        beta = 2.0 + 2.5 * torch.sin(1.7 * i.float() + 0.3)
        z = torch.zeros(b, G, V)
        z[..., ORDINARY:] = -1e4
        z.scatter_(2, answer.unsqueeze(-1), (beta[None] + 0.45 * left_count.float()).unsqueeze(-1))
        out[:, P:P + G] = torch.where(decided[..., None], out[:, P:P + G], z)
        return out


# ---------------------------------------------------------------------- d3LLM's code, written out
def entropy_transfer(logits, mask_index, x, threshold):
    """d3LLM's get_transfer_index_entropy at temperature 0 with a threshold (batch of one)."""
    x0 = torch.argmax(logits, dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    entropy = -torch.sum(p * torch.log(p + 1e-12), dim=-1)
    x0 = torch.where(mask_index, x0, x)
    selection = torch.where(mask_index, entropy, torch.inf)
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    n = mask_index.sum(dim=1, keepdim=True)
    _, select_index = torch.topk(selection[0], k=int(n[0]), largest=False)
    transfer[0, select_index] = True
    for k in range(1, int(n[0])):
        if entropy[0, select_index[k]] > threshold:
            transfer[0, select_index[k]] = False
    return x0, transfer


def new_block(bid, x, block_states, decoded_token_threshold):
    start = P + (bid - 1) * BLOCK
    prev = block_states[bid - 1]
    return {"start": start, "end": start + BLOCK, "mask_count": int((x[:, start:start + BLOCK] == MASK).sum()),
            "total_masks": BLOCK, "is_complete": 1 - prev["mask_count"] / prev["total_masks"] >= decoded_token_threshold}


def update_activation(block_states, decoded_token_threshold):
    for bid in sorted(block_states):
        if bid > 0 and not block_states[bid]["is_complete"]:
            prev = block_states[bid - 1]
            if 1 - prev["mask_count"] / prev["total_masks"] >= decoded_token_threshold:
                block_states[bid]["is_complete"] = True


def force_first_block(logits, mask_for_decode, x0, transfer, block_states):
    """The lowest-entropy position of the first fully activated block with masks, if it got none."""
    first = next((b for b in sorted(block_states)
                  if b > 0 and block_states[b]["is_complete"] and block_states[b]["mask_count"] > 0), None)
    if first is None:
        return False
    start, end = block_states[first]["start"], block_states[first]["end"]
    if transfer[:, start:end].any():
        return False
    p = F.softmax(logits[:, start:end].to(torch.float64), dim=-1)
    entropy = torch.where(mask_for_decode[:, start:end], -torch.sum(p * torch.log(p + 1e-12), dim=-1), torch.inf)
    best = int(entropy[0].argmin())
    transfer[0, start + best] = True
    x0[0, start + best] = torch.argmax(logits[0, start + best], dim=-1)
    return True


def reference_multi_block(model, prompt, threshold, block_add_threshold, decoded_token_threshold):
    """d3LLM's generate_multi_block (no early stop, temperature 0): tokens, NFE and per step the
    number of active blocks, whether a later block got a commit, whether the first block was forced."""
    x = torch.full((1, P + G), MASK, dtype=torch.long)
    x[:, :P] = torch.as_tensor(prompt)
    block_states = {0: {"start": 0, "end": P, "mask_count": 0, "total_masks": P, "is_complete": True}}
    num_blocks, next_block_id = G // BLOCK, 1
    block_states[1] = new_block(1, x, block_states, decoded_token_threshold)
    next_block_id = 2
    nfe, log = 0, []
    while True:
        mask_index = x == MASK
        if mask_index[:, P:].sum() == 0 and next_block_id > num_blocks:
            break
        nfe += 1
        update_activation(block_states, decoded_token_threshold)
        if next_block_id <= num_blocks:
            last = block_states[max(block_states)]
            if 1 - last["mask_count"] / last["total_masks"] >= block_add_threshold or last["mask_count"] == 0:
                block_states[next_block_id] = new_block(next_block_id, x, block_states, decoded_token_threshold)
                next_block_id += 1
        rightmost = max(b for b in block_states if block_states[b]["is_complete"] or block_states[b]["mask_count"] > 0)
        active_end = block_states[rightmost]["end"]
        logits = model(x)
        mask_for_decode = mask_index.clone()
        mask_for_decode[:, active_end:] = 0
        x0, transfer = entropy_transfer(logits, mask_for_decode, x, threshold)
        forced = force_first_block(logits, mask_for_decode, x0, transfer, block_states)
        x[transfer] = x0[transfer]
        first_open = min(b for b in block_states if b > 0 and block_states[b]["mask_count"] > 0)
        later = bool(transfer[:, block_states[first_open]["end"]:].any())
        for bid in sorted(block_states):
            if bid > 0 and block_states[bid]["mask_count"] > 0:
                s, e = block_states[bid]["start"], block_states[bid]["end"]
                block_states[bid]["mask_count"] -= int(transfer[:, s:e].sum())
        open_blocks = sum(1 for b in block_states if b > 0 and block_states[b]["start"] < active_end
                          and block_states[b]["end"] > P + (first_open - 1) * BLOCK)
        log.append({"active": open_blocks, "later": later, "forced": forced})
    return x[0, P:], nfe, log


# ---------------------------------------------------------------------- the comparison
PROMPTS = ([1, 2], [4, 0], [6, 5])
GRID = [(tau, bat) for tau in (0.3, 0.5, 1.0) for bat in (0.0, 0.1, 0.25, 0.5, 1.0)]


def ours(prompt, threshold, bat, cache="none"):
    config = DecodeConfig(gen_length=G, block_length=BLOCK, block_add_threshold=bat, cache=cache)
    return decode(EntropyToy(), [prompt], D3LLM(threshold=threshold), config, trace=True)


@pytest.mark.parametrize("threshold, bat", GRID)
def test_tokens_and_nfe_equal_d3llm_generate_multi_block(threshold, bat):
    for prompt in PROMPTS:
        ref_tokens, ref_nfe, _ = reference_multi_block(EntropyToy(), prompt, threshold, bat, 0.95)
        got = ours(prompt, threshold, bat)
        assert got.generated[0].tolist() == ref_tokens.tolist(), (prompt, threshold, bat)
        assert int(got.nfe[0]) == ref_nfe, (prompt, threshold, bat)
        assert int(got.forced[0]) == 0


def test_the_toy_exercises_several_blocks_later_commits_and_the_forced_first_block():
    logs = [step for tau, bat in GRID if bat < 1.0 for p in PROMPTS
            for step in reference_multi_block(EntropyToy(), p, tau, bat, 0.95)[2]]
    assert max(s["active"] for s in logs) >= 3
    assert sum(s["later"] for s in logs) >= 10
    assert sum(s["forced"] for s in logs) >= 5
    # our trace agrees on where the forced commit happened (the decision's info)
    forced_ours = sum(int(t["first_block_forced"].sum()) for tau, bat in GRID for p in PROMPTS
                      for t in ours(p, tau, bat).trace)
    forced_ref = sum(s["forced"] for tau, bat in GRID for p in PROMPTS
                     for s in reference_multi_block(EntropyToy(), p, tau, bat, 0.95)[2])
    assert forced_ours == forced_ref


def test_published_defaults_are_the_controllers():
    c = D3LLM()
    assert c.threshold == 0.5 and D3LLM.default_block_add_threshold == 0.1
    got = decode(EntropyToy(), [PROMPTS[0]], c, DecodeConfig(gen_length=G, block_length=BLOCK))
    ref_tokens, ref_nfe, _ = reference_multi_block(EntropyToy(), PROMPTS[0], 0.5, 0.1, 0.95)
    assert got.generated[0].tolist() == ref_tokens.tolist() and int(got.nfe[0]) == ref_nfe


@pytest.mark.parametrize("threshold, bat", [(0.5, 0.1), (1.0, 0.25)])
def test_decoded_token_threshold_changes_no_decision(threshold, bat):
    """What docs/controllers.md says of d3LLM's decoded_token_threshold, on the published code."""
    for prompt in PROMPTS:
        runs = {dtt: reference_multi_block(EntropyToy(), prompt, threshold, bat, dtt)[:2] for dtt in (0.0, 0.5, 0.95, 1.0)}
        tokens = {tuple(t.tolist()) for t, _ in runs.values()}
        assert len(tokens) == 1 and len({n for _, n in runs.values()}) == 1


def test_a_batch_equals_single_rows():
    config = DecodeConfig(gen_length=G, block_length=BLOCK, block_add_threshold=0.25)
    batch = decode(EntropyToy(), [list(p) for p in PROMPTS], D3LLM(threshold=0.5), config)
    for i, p in enumerate(PROMPTS):
        single = decode(EntropyToy(), [p], D3LLM(threshold=0.5), config)
        assert batch.generated[i].tolist() == single.generated[0].tolist()
        assert int(batch.nfe[i]) == int(single.nfe[0])


def test_bad_threshold_is_refused_with_name_value_and_range():
    with pytest.raises(ParameterError, match=r"d3llm\.threshold=-0\.1.*allowed"):
        D3LLM.build(threshold=-0.1)


def test_entropy_toy_is_what_its_docstring_says():
    x = torch.tensor([[1, 2] + [MASK] * G])
    p = EntropyToy()(x)[0, P:].softmax(-1)
    assert float(p[:, MASK].max()) < 1e-30
    h = -(p * p.clamp_min(1e-30).log()).sum(-1)
    assert h.max() > 1.0 and h.min() < 0.5 and not math.isclose(float(h[0]), float(h[1]))
    assert np.unique(h.numpy().round(4)).size == G  # no ties in the first step
