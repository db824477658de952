"""dInfer's hierarchy and credit rules, KLASS, PC-Sampler, Prophet and Slow-Fast decide as their
published code, step by step, on designed toys.

Each ``reference_*`` below is a small decode loop (a batch of one, the whole canvas every forward,
as the published code runs) written from the published function it names; the controller runs in
this framework's loop on the same toy, and the positions committed at every step must be equal.
"""

from __future__ import annotations

import json
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.testing.toys import ContextToyDenoiser, ToyDenoiser

Steps = list[list[int]]
#: a reference step: (gen logits [1, G, V] float64, masked [1, G], block (s, e), block step) -> (commit, x0)
StepFn = Callable[[torch.Tensor, torch.Tensor, tuple[int, int], int], tuple[torch.Tensor, torch.Tensor]]


def engine_steps(model: nn.Module, prompt: list[int], name: str, gen_length: int, block_length=None,
                 **params) -> Steps:
    """The positions the registered controller commits at each step of the framework's loop."""
    r = decode(model, [prompt], build_controller(name, **params),
               DecodeConfig(gen_length=gen_length, block_length=block_length), trace=True)
    p = len(prompt)
    assert not (r.tokens[0, p:] == model.mask_token_id).any()
    return [t["commit"][0, p:p + gen_length].nonzero().squeeze(1).tolist() for t in r.trace]


def gen_logits(model: nn.Module, x: torch.Tensor, p: int) -> torch.Tensor:
    """The generation's logits in float64, the mask token never predicted (as the framework's models)."""
    z = model(x).double()[:, p:]
    z[..., model.mask_token_id] = float("-inf")
    return z


def block_loop(model: nn.Module, prompt: list[int], gen_length: int, block_length: int, step: StepFn) -> Steps:
    """LLaDA's semi-autoregressive loop: blocks in order, a forward and one ``step`` until the block is decided."""
    p, mask = len(prompt), model.mask_token_id
    x = torch.tensor([prompt + [mask] * gen_length])
    out: Steps = []
    for s in range(0, gen_length, block_length):
        e, i = s + block_length, 0
        while (x[0, p + s:p + e] == mask).any():
            masked = x[:, p:] == mask
            commit, x0 = step(gen_logits(model, x, p), masked, (s, e), i)
            commit = commit & masked
            if commit.any():
                out.append(commit[0].nonzero().squeeze(1).tolist())
            x[:, p:] = torch.where(commit, x0, x[:, p:])
            i += 1
    return out


def in_block(t: torch.Tensor, se: tuple[int, int], fill) -> torch.Tensor:
    out = torch.full_like(t, fill)
    out[:, se[0]:se[1]] = t[:, se[0]:se[1]]
    return out


def num_transfer_tokens(n: int, steps: int) -> list[int]:
    """LLaDA's get_num_transfer_tokens for one row."""
    return [n // steps + (1 if i < n % steps else 0) for i in range(steps)]


# --------------------------------------------------------------------------- dInfer: hierarchy
def reference_hierarchy(threshold, low_threshold) -> StepFn:
    """HierarchyDecoder.get_transfer_index on the block."""
    def step(z, masked, se, i):
        s, e = se
        logits, mask_index = z[:, s:e], masked[:, s:e]
        b, l = mask_index.shape  # noqa: E741
        x0 = logits.argmax(-1)
        x0_p = F.log_softmax(logits, -1).gather(-1, x0[..., None]).squeeze(-1).exp()
        neg = torch.finfo(x0_p.dtype).min
        confidence = torch.where(mask_index, x0_p, torch.tensor(neg, dtype=x0_p.dtype))
        prev = torch.cat([mask_index.new_zeros((b, 1)), mask_index[:, :-1]], 1)
        seg_id = torch.cumsum((mask_index & ~prev).long(), -1) - 1
        seg_id = torch.where(mask_index, seg_id, 0)
        seg_max = torch.full((b, l), neg, dtype=confidence.dtype).scatter_reduce(
            1, seg_id, confidence, reduce="amax", include_self=True)
        transfer = confidence == seg_max.gather(1, seg_id)
        if low_threshold is not None:
            transfer &= confidence > low_threshold
        if threshold is not None:
            transfer |= confidence > threshold
        transfer |= F.one_hot(confidence.argmax(-1), l).bool()
        return F.pad(transfer & mask_index, (s, z.shape[1] - e)), F.pad(x0, (s, z.shape[1] - e))
    return step


HIER_CONF = [0.95, 0.5, 0.6, 0.2, 0.35, 0.1, 0.8, 0.25]


def test_hierarchy_commits_segment_maxima_as_dinfer():
    """τ = 0.9, τ_low = 0.3: 0 (> τ), 6 (the one segment's max), 2 (max of [1, 5]; 7 = 0.25 ≤ τ_low),
    1 and 4 (maxima of [1] and [3, 5]), then the block's best alone: 7, 3, 5."""
    model = ToyDenoiser(list(range(1, 9)), HIER_CONF, second=[min(c, 1 - c) / 2 for c in HIER_CONF])
    ours = engine_steps(model, [1, 2], "hierarchy", 8)
    assert ours == [[0], [6], [2], [1, 4], [7], [3], [5]]
    assert ours == block_loop(model, [1, 2], 8, 8, reference_hierarchy(0.9, 0.3))


@pytest.mark.parametrize("threshold, low", [(0.9, 0.3), (None, 0.4), (0.7, None)])
@pytest.mark.parametrize("salt", [0, 1, 2])
def test_hierarchy_equals_dinfer_on_the_context_toy(threshold, low, salt):
    model = ContextToyDenoiser(salt=salt)
    ours = engine_steps(model, [3, 1 + salt], "hierarchy", 16, 8, threshold=threshold, low_threshold=low)
    assert ours == block_loop(model, [3, 1 + salt], 16, 8, reference_hierarchy(threshold, low))


# --------------------------------------------------------------------------- dInfer: credit
def reference_credit(threshold, alpha=0.7, gamma=0.2, beta=0.8) -> StepFn:
    """CreditThresholdParallelDecoder.decode: _apply_credit_fusion, then get_transfer_index_threshold."""
    mats: dict = {}

    def step(z, masked, se, i):
        s, e = se
        logits, mask_index = z[:, s:e].float(), masked[:, s:e]
        mat, it = mats.get(se, (torch.zeros(logits.shape), 0))
        if it > 0:
            mat.mul_(beta)
        top1_probs, top1_idx = torch.max(F.softmax(logits, -1), dim=-1)
        mat.scatter_add_(2, top1_idx[..., None], (top1_probs.pow(gamma) * mask_index)[..., None])
        mats[se] = (mat, it + 1)
        fused = logits + alpha * torch.log(mat + 1)
        x0 = fused.argmax(-1)
        x0_p = F.softmax(fused, -1).gather(-1, x0[..., None]).squeeze(-1)
        confidence = torch.where(mask_index, x0_p, float("-inf"))
        actual = (confidence.max(1)[0] - 1e-5).clamp(-1000, threshold)[:, None]
        pad = (s, z.shape[1] - e)
        return F.pad(confidence >= actual, pad), F.pad(x0, pad)
    return step


def test_credit_commits_repeated_predictions_earlier_as_dinfer():
    """τ = 0.9: p = 0.85 passes at step 1 with its credit (p̃ ≈ 0.901), the two p = 0.8 positions
    at step 2 (tied p̃, both within 1e-5 of the best); fast_dllm at 0.9 takes one a step."""
    conf = [0.95, 0.8, 0.8, 0.5, 0.3, 0.85]
    model = ToyDenoiser([1, 2, 3, 4, 5, 6], conf, second=[(1 - c) / 2 for c in conf])
    ours = engine_steps(model, [1, 2], "credit", 6)
    assert ours == [[0, 5], [1, 2], [3], [4]]
    assert ours == block_loop(model, [1, 2], 6, 6, reference_credit(0.9))
    assert len(engine_steps(model, [1, 2], "fast_dllm", 6)) == 6


@pytest.mark.parametrize("threshold", [0.9, 0.6])
@pytest.mark.parametrize("salt", [0, 3])
def test_credit_equals_dinfer_on_the_context_toy(threshold, salt):
    model = ContextToyDenoiser(salt=salt, low=0.5)
    ours = engine_steps(model, [4, 2], "credit", 16, 8, threshold=threshold)
    assert ours == block_loop(model, [4, 2], 16, 8, reference_credit(threshold))


# --------------------------------------------------------------------------- KLASS
def reference_klass(gen_length, conf_threshold=0.6, kl_threshold=0.015, h=2, steps=None, block_length=None) -> StepFn:
    """stable_confident_decode (alg = klass, unmask_strategy = all): KL history over the canvas."""
    state: dict = {}
    spb = (steps or gen_length) // (gen_length // (block_length or gen_length))

    def step(z, masked, se, i):
        p_curr = F.softmax(z, -1)
        p_prev = state.get("p_prev", torch.zeros_like(p_curr))
        hist = state.get("kl_history", torch.zeros((*z.shape[:2], h), dtype=torch.float64))
        x0 = p_curr.argmax(-1)
        conf = p_curr.gather(-1, x0[..., None]).squeeze(-1)
        kl = (p_curr * (torch.log(p_curr + 1e-12) - torch.log(p_prev + 1e-12))).sum(-1)
        hist = torch.roll(hist, -1, -1)
        hist[..., -1] = kl
        state["p_prev"], state["kl_history"] = p_curr.clone(), hist
        mask_index = in_block(masked, se, False)
        stable = (hist < kl_threshold).all(-1) if i >= h - 1 else torch.zeros_like(mask_index)
        ready = stable & (conf > conf_threshold) & mask_index
        if ready.any():
            return ready, x0
        if i == 0:
            state["ntt"] = num_transfer_tokens(int(mask_index.sum()), spb)
        k = state["ntt"][i]
        top = torch.topk(torch.where(mask_index, conf, float("-inf"))[0], k).indices
        return F.one_hot(top, z.shape[1]).sum(0).bool()[None], x0
    return step


class SettlingDenoiser(nn.Module):
    """Position i predicts a token that changes every call (p = 0.7 − 0.01·i) until call ``settle[i]``,
    then its answer with p = 0.8 + 0.01·i, unchanged: its KL between calls drops to 0."""

    def __init__(self, settle: list[int], vocab_size: int = 16, prompt_length: int = 1) -> None:
        super().__init__()
        self.settle, self.p, self.vocab_size = torch.tensor(settle), prompt_length, vocab_size
        self.mask_token_id, self.eos_token_id, self.pad_token_id = vocab_size - 1, vocab_size - 2, vocab_size - 3
        self.calls = 0

    def forward(self, input_ids, attention_mask=None):
        b, l = input_ids.shape  # noqa: E741
        g = self.settle.numel()
        i = torch.arange(g)
        settled = self.calls >= self.settle
        x0 = torch.where(settled, 1 + i % 3, 4 + (i + self.calls) % 8)
        conf = torch.where(settled, 0.8 + 0.01 * i, 0.7 - 0.01 * i)
        probs = torch.full((b, l, self.vocab_size), 1e-6)
        probs.scatter_(2, input_ids[..., None], 1.0)
        gen = ((1 - conf) / (self.vocab_size - 2))[:, None].repeat(1, self.vocab_size)
        gen[i, x0] = conf
        gen[:, self.mask_token_id] = 0.0
        probs[:, self.p:self.p + g] = gen
        self.calls += 1
        return probs.log()


def test_klass_commits_stable_confident_positions_together_as_published():
    """Positions 0-3 are settled from the start, 4-5 from call 3, 6-7 from call 5. Calls 0 and 1
    fall back to the most confident (3, then 2); at call 2 positions 0 and 1 have had KL 0 for two
    steps: both; then fallbacks while 4-7 settle."""
    ours = engine_steps(SettlingDenoiser([0, 0, 0, 0, 3, 3, 5, 5]), [0], "klass", 8)
    assert ours == [[3], [2], [0, 1], [5], [4], [7], [6]]
    ref = block_loop(SettlingDenoiser([0, 0, 0, 0, 3, 3, 5, 5]), [0], 8, 8, reference_klass(8))
    assert ours == ref


@pytest.mark.parametrize("salt", [0, 5])
def test_klass_equals_published_on_the_context_toy(salt):
    model = ContextToyDenoiser(salt=salt)
    ours = engine_steps(model, [2, 2], "klass", 12, kl_threshold=0.5, conf_threshold=0.3)
    assert ours == block_loop(model, [2, 2], 12, 12, reference_klass(12, 0.3, 0.5))


def test_klass_waits_one_step_more_at_a_later_block_start():
    """The documented difference: KLASS compares a block's first step with the previous block's last
    forward (the whole canvas); the window here does not see that position before, so the second
    block's settled positions are ready at its block step 2, not 1."""
    settle = [0] * 8
    ours = engine_steps(SettlingDenoiser(settle), [0], "klass", 8, 4)
    ref = block_loop(SettlingDenoiser(settle), [0], 8, 4, reference_klass(8, block_length=4))
    assert ours[:3] == ref[:3] == [[3], [2], [0, 1]]
    assert ref[3:] == [[7], [4, 5, 6]] and ours[3:] == [[7], [6], [4, 5]]


def test_klass_strategies_and_validation():
    model = SettlingDenoiser([0] * 6)
    assert engine_steps(model, [0], "klass", 6, unmask_strategy="max_conf") == [[5], [4], [3], [2], [1], [0]]
    with pytest.raises(ParameterError, match="kl_threshold"):
        build_controller("klass", kl_threshold=0.0)
    with pytest.raises(ParameterError, match="unmask_strategy"):
        build_controller("klass", unmask_strategy="random")


# --------------------------------------------------------------------------- PC-Sampler
def reference_pc_sampler(gen_length, block_length, lambd=0.25, alpha=10.0, steps=None, table=None) -> StepFn:
    """generate_with_pc_sampler's step: pc_sampler_function over the block, top-k of LLaDA's schedule."""
    spb = (steps or gen_length) // (gen_length // block_length)
    ntt: dict = {}

    def step(z, masked, se, i):
        s, e = se
        x0 = z.argmax(-1)
        x0_p = F.softmax(z.float(), -1).gather(-1, x0[..., None]).squeeze(-1)
        bg = table if table is not None else torch.full((z.shape[-1],), 1.0 / z.shape[-1])
        ce = (-x0_p[:, s:e] * torch.log(bg[x0[:, s:e]] + 1e-9)).clamp(max=alpha)
        scores = torch.exp(-lambd * torch.arange(e - s, dtype=torch.float32)) * ce
        confidence = torch.where(masked[:, s:e], scores, float("-inf"))
        if i == 0:
            ntt[se] = num_transfer_tokens(int(masked[:, s:e].sum()), spb)
        top = torch.topk(confidence[0], ntt[se][i]).indices + s
        return F.one_hot(top, z.shape[1]).sum(0).bool()[None], x0
    return step


def count_file(tmp_path, counts: dict[int, int], total: int):
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({"num_token": total, "p_baseline_dict": {str(k): v for k, v in counts.items()}}))
    table = torch.full((16,), 1.0 / total)
    for k, v in counts.items():
        table[k] = v / total
    return str(path), table


def test_pc_sampler_puts_rare_tokens_before_frequent_ones(tmp_path):
    """Token 1 is half the corpus: at position 0 with p = 0.95 it scores 0.95·log 2 = 0.66, below
    position 1's rare token 3 (p = 0.7: e^−0.25·0.7·log 200 = 2.89), so position 1 goes first."""
    path, table = count_file(tmp_path, {1: 500, 2: 100, 3: 5}, 1000)
    model = ToyDenoiser([1, 3, 2, 3, 1, 2], [0.95, 0.7, 0.6, 0.9, 0.99, 0.5])
    ours = engine_steps(model, [4, 5], "pc_sampler", 6, frequencies=path)
    assert ours[0] == [1]
    assert ours == block_loop(model, [4, 5], 6, 6, reference_pc_sampler(6, 6, table=table))
    assert engine_steps(model, [4, 5], "llada", 6, steps=6)[0] == [4]  # plain confidence: position 4


@pytest.mark.parametrize("steps, block, lambd", [(16, 8, 0.25), (8, 8, 0.25), (4, 16, 1.0), (16, 16, 0.0)])
def test_pc_sampler_equals_published_on_the_context_toy(tmp_path, steps, block, lambd):
    path, table = count_file(tmp_path, {i: 10 * (i + 1) ** 2 for i in range(13)}, 10000)
    model = ContextToyDenoiser(salt=steps + block)
    for frequencies, tab in ((path, table), (None, None)):
        ours = engine_steps(model, [1, 7], "pc_sampler", 16, block, steps=steps, lambd=lambd, frequencies=frequencies)
        assert ours == block_loop(model, [1, 7], 16, block, reference_pc_sampler(16, block, lambd, 10.0, steps, tab))


def test_pc_sampler_refuses_an_unreadable_count_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ParameterError, match="frequencies"):
        engine_steps(ToyDenoiser([1], [0.9]), [1], "pc_sampler", 1, frequencies=str(bad))


# --------------------------------------------------------------------------- Prophet
def reference_prophet(gen_length, thresholds=(7.5, 5.0, 2.5), steps=None) -> StepFn:
    """generate_earlyexit.generate, its answer region being the block's masked positions: the mean
    top-2 logit gap against should_early_exit's phase thresholds, then fill every mask."""
    max_steps = steps or gen_length
    state = {"global_step": 0}

    def should_early_exit(current_step, answer_gap):
        progress = current_step / max_steps
        if progress < 0.33:
            return answer_gap >= thresholds[0]
        if progress < 0.67:
            return answer_gap >= thresholds[1]
        return answer_gap >= thresholds[2]

    def step(z, masked, se, i):
        s, e = se
        state["global_step"] += 1
        x0 = z.argmax(-1)
        region = masked[0, s:e].nonzero().squeeze(1) + s
        top2 = torch.topk(z[0, region], 2, dim=-1).values
        if should_early_exit(state["global_step"], float((top2[:, 0] - top2[:, 1]).mean())):
            return masked.clone(), x0
        x0_p = F.softmax(z, -1).gather(-1, x0[..., None]).squeeze(-1)
        if i == 0:
            state[se] = num_transfer_tokens(int(masked[:, s:e].sum()), max_steps // (gen_length // (e - s)))
        top = torch.topk(torch.where(in_block(masked, se, False), x0_p, float("-inf"))[0], state[se][i]).indices
        return F.one_hot(top, z.shape[1]).sum(0).bool()[None], x0
    return step


PROPHET_CONF = [0.999, 0.998, 0.997, 0.996] + [0.9 - 0.001 * i for i in range(8)]
PROPHET_SECOND = [1e-4] * 4 + [0.07] * 8


def test_prophet_goes_all_in_once_the_gap_clears_the_phase_threshold():
    """Gaps log(0.99x/1e-4) ≈ 9.2 at four positions, log(0.89x/0.07) ≈ 2.55 at eight: the mean
    (≤ 4.8) never clears τ_early = 7.5 or τ_mid = 5.0; at step 9 of 12 (progress 0.75) τ_late = 2.5
    does: the 4 remaining positions go in one step."""
    model = ToyDenoiser(list(range(1, 13)), PROPHET_CONF, second=PROPHET_SECOND, prompt_length=1)
    ours = engine_steps(model, [1], "prophet", 12)
    assert ours[:8] == [[0], [1], [2], [3], [4], [5], [6], [7]] and ours[8:] == [[8, 9, 10, 11]]
    assert ours == block_loop(model, [1], 12, 12, reference_prophet(12))


@pytest.mark.parametrize("thresholds", [(7.5, 5.0, 2.5), (3.0, 2.0, 1.0), (1.5, 1.0, 0.5)])
def test_prophet_equals_published_on_the_context_toy(thresholds):
    model = ContextToyDenoiser(salt=int(thresholds[0] * 2), low=0.5)
    names = dict(zip(("early_threshold", "mid_threshold", "late_threshold"), thresholds))
    ours = engine_steps(model, [5, 3], "prophet", 16, **names)
    assert ours == block_loop(model, [5, 3], 16, 16, reference_prophet(16, thresholds))


def test_prophet_after_exit_commits_each_later_block_in_one_step():
    model = ToyDenoiser(list(range(1, 13)), [0.999] * 12, second=[1e-5] * 12, prompt_length=1)
    assert engine_steps(model, [1], "prophet", 12, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


# --------------------------------------------------------------------------- Slow-Fast
def reference_slowfast(model: nn.Module, prompt: list[int], gen_length: int, block_length: int, tau=0.9,
                       tau_span=0.3, k_explore=6, window=2, std_max=1.0) -> Steps:
    """generate_slow_fast_sampling for a batch of one (no cache, no CFG): the positions of each forward
    that committed something (its exploration steps past the block's last mask commit nothing)."""
    p, mask = len(prompt), model.mask_token_id
    x = torch.tensor([prompt + [mask] * gen_length])
    out: Steps = []

    def forward():
        z = gen_logits(model, x, p)
        x0 = z.argmax(-1)[0]
        conf = F.softmax(z, -1)[0].gather(-1, x0[:, None]).squeeze(-1)
        return x0, torch.where(x[0, p:] == mask, conf, float("-inf"))

    def fill(x0, conf, lo, hi):
        scope_mask = x[0, p + lo:p + hi] == mask
        hc = (conf[lo:hi] >= tau) & scope_mask
        chosen = hc.nonzero().squeeze(1) if hc.sum() > 1 else torch.topk(conf[lo:hi], 1).indices
        if scope_mask.sum() == 0:
            return
        x[0, p + lo + chosen] = x0[lo + chosen]
        out.append(sorted((lo + chosen).tolist()))

    for bs in range(0, gen_length, block_length):
        be, last, actual = bs + block_length, 0, block_length
        while (x[0, p + bs:p + be] == mask).any():
            determined, history = False, []
            for k_step in range(k_explore):
                x0, conf = forward()
                if not determined:
                    scope = conf[bs + last:be]
                    above = (scope >= tau_span).nonzero().squeeze(1)
                    est = min(max(1, last + (int(above.max()) + 1 if len(above) else 1)), block_length)
                    history = (history + [est])[-window:]
                    if len(history) >= window:
                        if float(torch.tensor(history, dtype=torch.float64).std(unbiased=False)) < std_max:
                            actual, determined = history[-1], True
                        else:
                            actual = max(1, min(int(sum(history) / len(history)), block_length))
                            determined = k_step == k_explore - 1
                fill(x0, conf, bs + last, be)
            if not determined:
                actual = max(1, min(int(sum(history) / len(history)), block_length)) if history else block_length // 2
            while (x[0, p + bs + last:p + bs + actual] == mask).any():
                x0, conf = forward()
                fill(x0, conf, bs + last, bs + actual)
            last = actual
    return out


class FrontierDenoiser(nn.Module):
    """Confidence by distance to the decided prefix d (the first masked generation position): 0.95
    for i < d + 2, 0.5 for i < d + 6, else 0.1 − 0.001·i; answer ``1 + i mod 5``."""

    def __init__(self, g: int, vocab_size: int = 16, prompt_length: int = 1) -> None:
        super().__init__()
        self.g, self.p, self.vocab_size = g, prompt_length, vocab_size
        self.mask_token_id, self.eos_token_id, self.pad_token_id = vocab_size - 1, vocab_size - 2, vocab_size - 3

    def forward(self, input_ids, attention_mask=None):
        b, l = input_ids.shape  # noqa: E741
        i = torch.arange(self.g)
        masked = input_ids[:, self.p:self.p + self.g] == self.mask_token_id
        d = torch.where(masked.any(1), masked.float().argmax(1), torch.tensor(self.g))[:, None]
        conf = torch.where(i < d + 2, 0.95, torch.where(i < d + 6, 0.5, 0.1 - 0.001 * i))
        probs = torch.full((b, l, self.vocab_size), 1e-6)
        probs.scatter_(2, input_ids[..., None], 1.0)
        gen = ((1 - conf) / (self.vocab_size - 2))[..., None].repeat(1, 1, self.vocab_size)
        gen.scatter_(2, (1 + i % 5).expand(b, -1)[..., None], conf[..., None])
        gen[..., self.mask_token_id] = 0.0
        probs[:, self.p:self.p + self.g] = gen
        return probs.log()


def test_slowfast_explores_then_fills_the_span_as_published():
    """The span settles at d + 6 (the farthest p ≥ 0.3); exploration commits the two p = 0.95
    positions at a time, the fast phase fills what is left of the span."""
    model = FrontierDenoiser(24)
    ours = engine_steps(model, [0], "slowfast", 24)
    assert ours[:2] == [[0, 1], [2, 3]]
    assert ours == reference_slowfast(model, [0], 24, 24)


@pytest.mark.parametrize("params", [{}, {"exploration_steps": 2, "threshold": 0.7},
                                    {"stability_window": 3, "stability_std": 0.5, "span_threshold": 0.5},
                                    {"exploration_steps": 1, "stability_window": 2}])
@pytest.mark.parametrize("block", [16, 8])
def test_slowfast_equals_published_on_the_context_toy(params, block):
    model = ContextToyDenoiser(salt=block + len(params), low=0.2)
    ours = engine_steps(model, [6, 1], "slowfast", 16, block, **params)
    names = {"threshold": "tau", "span_threshold": "tau_span", "exploration_steps": "k_explore",
             "stability_window": "window", "stability_std": "std_max"}
    assert ours == reference_slowfast(model, [6, 1], 16, block, **{names[k]: v for k, v in params.items()})


def test_slowfast_fixes_a_stable_span_after_two_equal_estimates():
    """Static confidences: the estimate is 6 at both of the first two steps (std 0 < 1), so the span is
    fixed at [0, 6); exploration goes on for its 6 steps, one token a step once the p = 0.95 pair is in."""
    conf = [0.95, 0.94, 0.6, 0.59, 0.58, 0.57] + [0.1 - 0.01 * i for i in range(6)]
    model = ToyDenoiser([1 + i % 5 for i in range(12)], conf, second=[min(c, 1 - c) / 2 for c in conf],
                        prompt_length=1)
    ours = engine_steps(model, [0], "slowfast", 12)
    assert ours[:6] == [[0, 1], [2], [3], [4], [5], [6]]
    assert ours == reference_slowfast(model, [0], 12, 12)
