"""The published baselines every result is compared with, as controllers.

* ``sequential``: one token per step, the most confident (the one-token-per-step reference).
* ``llada`` / ``llada_random``: LLaDA's fixed number of steps per block with low-confidence or
  random remasking, and LLaDA's split of a block's tokens over its steps
  (``base = n // steps``, the first ``n % steps`` steps take one more).
* ``dream_confidence`` / ``dream_margin`` / ``dream_entropy``: Dream's top-k by confidence
  (``maskgit_plus``), margin (``topk_margin``) and negative entropy (``entropy``), committing
  ``int(n · (1 − s/t))`` tokens at step i with ``t, s`` consecutive timesteps of
  ``linspace(1, ε, steps + 1)``, all remaining tokens at the last step.
* ``dream_origin``: Dream's default ``origin`` algorithm: every masked position is revealed
  independently with probability ``1 − s/t`` (all at the last step).
* ``fast_dllm``: Fast-dLLM's threshold rule: every position whose confidence is at least the
  threshold, at least the most confident one.
* ``eb``: the entropy-bounded sampler: sort by an error proxy and commit the largest prefix whose
  summed entropy minus its largest entropy stays within γ.

Where a published schedule would spend a forward pass committing nothing (LLaDA with more steps
than tokens in a block, Dream's first steps when ``n·(1−s/t) < 1``), the loop commits the single
most confident token instead: a step never commits zero tokens, so NFE ≤ the scheduled steps.
Dream counts masked tokens as a batch average (``mask_index.sum() / B``); we count them per
sample, so a sample's schedule does not depend on its batch. Features use the untempered
softmax (LLaDA's convention), also at temperature > 0, where Dream scores tempered probabilities.
"""

from __future__ import annotations

from typing import Optional

import torch

from adaptive_decoding.framework.core.params import Param, ParameterError
from adaptive_decoding.framework.core.rng import gumbel_at, uniform_at
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller, Decision, DecodeState
from adaptive_decoding.framework.engine.features import StepFeatures
from adaptive_decoding.framework.engine.selection import select_topk

RANDOM_REMASK_SALT = 0x11ADA
DREAM_ALG_SALT = 0xD8EA


def _steps_per_block(owner: Controller, steps: int, state: DecodeState) -> int:
    nb = state.config.num_blocks
    if steps % nb != 0:
        raise ParameterError(
            f"{owner.display_name()}.steps={steps} must be a multiple of the number of blocks "
            f"({nb} = gen_length {state.config.gen_length} / block_length "
            f"{state.config.effective_block_length}); change steps or --set block_length"
        )
    return steps // nb


@CONTROLLERS.register("sequential", aliases=("one_per_step",))
class Sequential(Controller):
    """One token per step, the most confident eligible one (the reference decoder)."""

    kind = "reference"
    params: dict = {}

    def __init__(self) -> None:
        pass

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        return Decision(commit=select_topk(f.confidence, f.eligible, 1))


def end_token_ids(state: DecodeState) -> tuple[int, ...]:
    """Every token id that ends the text: the loop's ``eos_token_id`` plus ``state.context.eos_token_ids``
    (which the loop fills with the model's ``eos_token_ids``: LLaDA-Instruct ends answers with
    ``<|eot_id|>`` as well as ``<|endoftext|>``), each once, in that order."""
    ids: list[int] = [] if state.eos_token_id is None else [int(state.eos_token_id)]
    for i in state.context.eos_token_ids:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    return tuple(ids)


def llada_transfer_count(n_at_start: torch.Tensor, block_step: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's ``get_num_transfer_tokens``: tokens to commit at ``block_step`` of a block that
    started with ``n_at_start`` masked tokens, spread over ``steps`` steps."""
    base = n_at_start // steps
    rem = n_at_start % steps
    return base + (block_step < rem).long()


#: the ``steps`` of a rule that falls back on LLaDA's schedule (KLASS, PC-Sampler, Prophet)
SCHEDULE_STEPS = Param(int, low=1, nullable=True, doc="LLaDA schedule: steps over all blocks; null = gen_length "
                       "(one token a step)")


def llada_schedule(owner: Controller, steps: Optional[int], f: StepFeatures, state: DecodeState) -> torch.Tensor:
    """Tokens to commit this step under LLaDA's schedule of ``steps`` over all blocks (``None`` =
    ``gen_length``, one token a step), long ``[B]``: :func:`llada_transfer_count`, every remaining
    token from the block's last scheduled step on, at least one."""
    spb = _steps_per_block(owner, steps or state.config.gen_length, state)
    k = llada_transfer_count(f.block_masked_at_start, f.block_step, spb)
    return torch.where(f.block_step >= spb - 1, f.n_eligible, k).clamp(min=1)


@CONTROLLERS.register("llada")
class LLaDA(Controller):
    """LLaDA: fixed steps per block, commit the k most confident (low-confidence remasking).

    ``confidence_eos_inf`` is LLaDA's ``confidence_eos_eot_inf`` (paper, Appendix B.4): a position
    whose prediction is an end-of-text token, ``<|endoftext|>`` (126081) or ``<|eot_id|>`` (126348)
    for LLaDA-Instruct, i.e. any of :func:`end_token_ids`, is ranked below every other, so answers
    are written before their end. (ML-GSAI/LLaDA's ``generate.py`` sets the EOS logit to −inf only
    in ``logits_with_noise`` after ``x0`` is drawn, where it has no effect, and the EOT logit in
    ``logits`` before the softmax, which also renormalises the other probabilities; we follow the
    stated intent for both ids and rank by the unrenormalised confidence.)
    """

    kind = "baseline"
    params = {
        "steps": Param(int, low=1, doc="total steps over all blocks (a multiple of the block count)",
                       tune=(8, 64)),
        "remasking": Param(str, choices=("low_confidence", "random"), doc="which tokens stay masked"),
        "confidence_eos_inf": Param(bool, doc="rank end-of-text predictions last: EOS and the model's other "
                                              "end tokens, e.g. LLaDA's eot_id (LLaDA's confidence_eos_eot_inf)"),
    }

    def __init__(self, steps: int = 32, remasking: str = "low_confidence", confidence_eos_inf: bool = False) -> None:
        self.steps = steps
        self.remasking = remasking
        self.confidence_eos_inf = confidence_eos_inf

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        _steps_per_block(self, self.steps, state)

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        k = llada_schedule(self, self.steps, f, state)
        if self.remasking == "random":
            scores = uniform_at(state.seeds, f.step, RANDOM_REMASK_SALT, f.position).float()
        else:
            scores = f.confidence
        ends = end_token_ids(state) if self.confidence_eos_inf else ()
        if ends:  # an end-of-text prediction gets confidence below any real one: committed last
            is_end = torch.isin(f.x0, torch.tensor(ends, dtype=f.x0.dtype, device=f.x0.device))
            scores = torch.where(is_end, torch.full_like(scores, -1.0), scores)
        return Decision(commit=select_topk(scores, f.eligible, k), info={"k": k})


@CONTROLLERS.register("llada_random")
class LLaDARandom(LLaDA):
    """LLaDA with random remasking: the k committed tokens are chosen uniformly at random."""

    stochastic = True
    params = {"steps": LLaDA.params["steps"], "confidence_eos_inf": LLaDA.params["confidence_eos_inf"]}

    def __init__(self, steps: int = 32, confidence_eos_inf: bool = False) -> None:
        self.steps = steps
        self.confidence_eos_inf = confidence_eos_inf

    @property
    def remasking(self) -> str:  # fixed for this variant
        return "random"


DREAM_ALGS = {"maskgit_plus": "confidence", "topk_margin": "margin", "entropy": "neg_entropy"}


class _Dream(Controller):
    """Dream's diffusion_generate top-k schedule; the subclass fixes the confidence measure."""

    kind = "baseline"
    alg = "maskgit_plus"
    params = {
        "steps": Param(int, low=1, doc="steps over all blocks (Dream's diffusion_steps)", tune=(8, 64)),
        "eps": Param(float, low=0.0, high=1.0, low_exclusive=True, doc="final timestep ε"),
        "alg_temp": Param(float, low=0.0, nullable=True,
                          doc="null = top-k; > 0 = sample positions ∝ softmax(confidence / alg_temp)"),
    }

    def __init__(self, steps: int = 32, eps: float = 1e-3, alg_temp: float | None = None) -> None:
        self.steps = steps
        self.eps = eps
        self.alg_temp = alg_temp

    @property
    def stochastic(self) -> bool:  # type: ignore[override]
        return bool(self.alg_temp)

    def reset(self, state: DecodeState) -> None:
        super().reset(state)
        _steps_per_block(self, self.steps, state)

    def scores(self, f: StepFeatures) -> torch.Tensor:
        if self.alg == "maskgit_plus":
            return f.confidence
        if self.alg == "topk_margin":
            return f.margin
        return -f.entropy

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        spb = _steps_per_block(self, self.steps, state)
        i = f.block_step.double()
        t = 1.0 - i * (1.0 - self.eps) / spb
        s = 1.0 - (i + 1.0) * (1.0 - self.eps) / spb
        n = f.n_eligible
        k = (n.double() * (1.0 - s / t)).floor().long()
        k = torch.where(f.block_step >= spb - 1, n, k).clamp(min=1)
        scores = self.scores(f)
        if self.alg_temp:
            g = gumbel_at(state.seeds, f.step, DREAM_ALG_SALT, f.position)
            scores = torch.log_softmax(
                torch.where(f.eligible, scores / self.alg_temp, torch.full_like(scores, -1e9)), dim=-1
            ) + g
        return Decision(commit=select_topk(scores, f.eligible, k), info={"k": k})


@CONTROLLERS.register("dream_confidence", aliases=("dream_maskgit_plus",))
class DreamConfidence(_Dream):
    """Dream maskgit_plus: commit the top-k positions by confidence p(x0)."""

    alg = "maskgit_plus"


@CONTROLLERS.register("dream_margin", aliases=("dream_topk_margin",))
class DreamMargin(_Dream):
    """Dream topk_margin: commit the top-k positions by margin top1 − top2."""

    alg = "topk_margin"


@CONTROLLERS.register("dream_entropy")
class DreamEntropy(_Dream):
    """Dream entropy: commit the top-k positions by negative entropy −H."""

    alg = "entropy"


@CONTROLLERS.register("dream_origin")
class DreamOrigin(_Dream):
    """Dream origin: each masked position is revealed independently with probability 1 − s/t."""

    alg = "origin"
    stochastic = True  # type: ignore[assignment]
    params = {k: v for k, v in _Dream.params.items() if k != "alg_temp"}

    def __init__(self, steps: int = 32, eps: float = 1e-3) -> None:
        self.steps = steps
        self.eps = eps

    alg_temp = None

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        spb = _steps_per_block(self, self.steps, state)
        i = f.block_step.double()
        t = 1.0 - i * (1.0 - self.eps) / spb
        s = 1.0 - (i + 1.0) * (1.0 - self.eps) / spb
        p_reveal = torch.where(f.block_step >= spb - 1, torch.ones_like(t), 1.0 - s / t)
        u = uniform_at(state.seeds, f.step, DREAM_ALG_SALT + 1, f.position)
        commit = f.eligible & (u < p_reveal[:, None])
        # never an empty step: reveal the position with the smallest draw
        commit = commit | select_topk(-u.float(), f.eligible, 1)
        return Decision(commit=commit)


@CONTROLLERS.register("fast_dllm", aliases=("fast_dllm_threshold",))
class FastDLLM(Controller):
    """Fast-dLLM threshold: commit every position with confidence ≥ threshold (at least one)."""

    kind = "baseline"
    params = {
        "threshold": Param(float, low=0.0, doc="commit where confidence >= threshold; > 1 = one token per step",
                           tune=(0.5, 0.99)),
    }

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        commit = f.eligible & (f.confidence >= self.threshold)  # Fast-dLLM keeps c >= threshold
        commit = commit | select_topk(f.confidence, f.eligible, 1)
        return Decision(commit=commit)


EB_ORDERS = ("entropy", "confidence", "margin")


@CONTROLLERS.register("eb", aliases=("eb_sampler",))
class EBSampler(Controller):
    """Entropy-bounded sampler: largest prefix (by error proxy) with ΣH − max H ≤ γ."""

    kind = "baseline"
    params = {
        "gamma": Param(float, low=0.0, doc="entropy budget γ (0 = one token per step)", tune=(0.01, 2.0),
                       log=True),
        "order": Param(str, choices=EB_ORDERS, doc="error proxy used to sort positions"),
    }

    def __init__(self, gamma: float = 0.1, order: str = "entropy") -> None:
        self.gamma = gamma
        self.order = order

    def decide(self, f: StepFeatures, state: DecodeState) -> Decision:
        proxy = {"entropy": -f.entropy, "confidence": f.confidence, "margin": f.margin}[self.order]
        masked_proxy = torch.where(f.eligible, proxy.float(), torch.full_like(proxy, float("-inf"), dtype=torch.float))
        order = torch.argsort(masked_proxy, dim=1, descending=True, stable=True)
        h_sorted = f.entropy.gather(1, order)
        ok_sorted = f.eligible.gather(1, order)
        h_sorted = torch.where(ok_sorted, h_sorted, torch.zeros_like(h_sorted))
        cum = h_sorted.cumsum(1)
        run_max = h_sorted.cummax(1).values
        within = ((cum - run_max) <= self.gamma + 1e-12) & ok_sorted
        # a prefix: stop at the first position that breaks the bound
        prefix = within.long().cumprod(1).bool()
        prefix[:, 0] |= ok_sorted[:, 0]
        commit = torch.zeros_like(f.eligible)
        commit.scatter_(1, order, prefix)
        return Decision(commit=commit & f.eligible)
