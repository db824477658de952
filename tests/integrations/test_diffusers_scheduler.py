"""diffusers' ``LLaDA2Pipeline`` with the framework's scheduler (:mod:`adaptive_decoding.framework.integrations.diffusers_scheduler`).

On a tiny LLaDA2-MoE checkpoint in the real on-disk format (blocks of 4; the same one, sharpened
the same way, as tests/engine/test_block_causal.py, where the framework's decode is checked against
LLaDA2.0's published ``generate``), the installed diffusers pipeline decodes with
``FrameworkScheduler`` + ``PipelineDenoiser``: the answers, the whole generation and the forwards
equal :func:`adaptive_decoding.framework.engine.loop.decode`'s, for ``llada2`` and ``fast_dllm`` on designed prompts and
for every registered controller. The pipeline's attention mask is shown not to be block-causal: what
transformers makes of it on LLaDA2's published path (token-causal, or no mask = bidirectional), and
what that does to the block's logits and tokens on the reference network.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from diffusers import LLaDA2Pipeline

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller import CONTROLLERS
from adaptive_decoding.framework.engine.controller_io import build_controller, save_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.engine.reference import with_reference
from adaptive_decoding.framework.integrations.diffusers_scheduler import FrameworkScheduler, PipelineDenoiser
from adaptive_decoding.framework.testing.controller_harness import conformance_params_of

BS, MASK, EOS, V = 4, 310, 300, 320
HEAD_SCALE = 40.0  # as in test_block_causal: a sharper head makes the decisions threshold-bound
ROOT = Path(__file__).resolve().parents[2]
# prompts shorter than, as long as and longer than a block; P + G a multiple of it, and not
CASES = [([5, 6, 7], 13), ([8, 9, 10, 11], 12), ([12, 13, 14, 15, 16, 17], 10), ([20, 21, 22, 23, 24], 11),
         ([30, 31, 32, 33], 16), ([5, 6, 7], 11)]


@pytest.fixture(scope="module")
def models(tiny_llada2):
    """(the framework's denoiser, the reference network) of one tiny LLaDA2-MoE checkpoint."""
    return tiny_llada2(block_size=BS, mask=MASK, eos=EOS, vocab=V, head_scale=HEAD_SCALE)


def pipeline(den, scheduler, model=None):
    pipe = LLaDA2Pipeline(model=model if model is not None else PipelineDenoiser(den, scheduler), scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, prompts, G, **kw):
    return pipe(input_ids=torch.tensor(prompts), gen_length=G, block_length=BS, output_type="seq",
                mask_token_id=MASK, eos_token_id=EOS, **kw).sequences


def answer(tokens: list[int]) -> list[int]:
    """Up to and including the first end-of-text."""
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


@pytest.mark.parametrize("name, params", [
    ("llada2", {}), ("llada2", {"threshold": 0.6}), ("llada2", {"threshold": 0.6, "steps": 2}),
    ("llada2", {"threshold": 0.3, "steps": 3}), ("fast_dllm", {"threshold": 0.9}), ("fast_dllm", {"threshold": 0.6}),
])
def test_the_pipeline_decodes_as_the_framework_token_and_nfe_identical(models, name, params):
    den, _ = models
    for prompt, G in CASES:
        want = decode(den, [prompt], build_controller(name, **params), DecodeConfig(gen_length=G))
        scheduler = FrameworkScheduler(name, params, gen_length=G, block_length=BS)
        pipe = pipeline(den, scheduler)
        got = run(pipe, [prompt], G)
        res = scheduler.result()
        assert answer(got[0].tolist()) == answer(want.generated[0].tolist()), (prompt, G)
        assert res.generated.tolist() == want.generated.tolist()
        assert res.nfe.tolist() == want.nfe.tolist() == [pipe.model.calls], (prompt, G)
        assert res.steps.tolist() == want.steps.tolist()


def test_the_designed_cases_commit_several_at_once_fall_back_and_stop_at_end_of_text(models):
    """The equivalence above is not one path: the cases include multi-commit steps, single-commit
    (fallback) steps, a row ended by an end-of-text block, and P + G not a multiple of the block."""
    den, _ = models
    multi = single = stopped = 0
    for prompt, G in CASES:
        res = decode(den, [prompt], build_controller("llada2", threshold=0.6), DecodeConfig(gen_length=G), trace=True)
        per_step = [int(r["commits"][0]) for r in res.trace]
        multi += sum(n > 1 for n in per_step)
        single += sum(n == 1 for n in per_step)
        stopped += int(EOS in res.generated[0].tolist() and int(res.nfe[0]) < G)
    assert multi and single and stopped and any((len(p) + G) % BS for p, G in CASES)


def test_a_batch_runs_its_rows_in_lock_step_and_equals_the_framework_batch(models):
    den, _ = models
    prompts, G = [[5, 6, 7, 8], [30, 31, 32, 33], [8, 9, 10, 11]], 16
    want = decode(den, prompts, build_controller("fast_dllm", threshold=0.6), DecodeConfig(gen_length=G))
    scheduler = FrameworkScheduler("fast_dllm", {"threshold": 0.6}, gen_length=G, block_length=BS)
    pipe = pipeline(den, scheduler)
    got = run(pipe, prompts, G)
    res = scheduler.result()
    assert res.generated.tolist() == want.generated.tolist() and res.nfe.tolist() == want.nfe.tolist()
    assert [answer(r) for r in got.tolist()] == [answer(r) for r in want.generated.tolist()]
    assert len(set(want.nfe.tolist())) > 1 and pipe.model.calls > min(want.nfe.tolist())  # some rows waited


def _every_controller():
    for name in CONTROLLERS.names():
        yield pytest.param(name, id=name)


@pytest.mark.parametrize("name", list(_every_controller()))
def test_every_registered_controller_runs_in_the_pipeline_as_in_decode(models, name):
    """Each registered controller (learned ones from a small policy file, the oracle with its reference)
    gives decode's generation and NFE, with every position decided; where decode refuses (a context it
    needs) the pipeline refuses the same way; adaptive block lengths are refused by name."""
    den, _ = models
    params = conformance_params_of(CONTROLLERS.get(name))
    for prompt in ([30, 31, 32, 33], [8, 9, 10, 11]):
        several = (getattr(CONTROLLERS.get(name), "default_block_add_threshold", None) or 1.0) < 1.0
        G, cfg = 16, DecodeConfig(gen_length=16, block_add_threshold=1.0 if several else None)
        with warnings.catch_warnings(record=True) as warned:  # d3llm: one block at a time in the pipeline
            warnings.simplefilter("always")
            scheduler = FrameworkScheduler(name, params, gen_length=G, block_length=BS)
        assert several == any("decodes one block at a time" in str(w.message) for w in warned)
        pipe = pipeline(den, scheduler)
        try:
            ctrl = build_controller(name, **params)
            scheduler.context = with_reference(None, den, [prompt], ctrl, cfg)
            want = decode(den, [prompt], ctrl, cfg, context=scheduler.context)
        except ParameterError as exc:  # e.g. a controller that needs the tokenizer in the context
            with pytest.raises(type(exc), match=re.escape(str(exc)[:60])):
                run(pipe, [prompt], G)
            continue
        if name == "cadllm":
            with pytest.raises(ParameterError, match=r"next_block_length=.*adaptive blocks.*blocks of 4"):
                run(pipe, [prompt], G)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run(pipe, [prompt], G)
        res = scheduler.result()
        assert not bool((res.generated == MASK).any())
        assert res.generated.tolist() == want.generated.tolist(), (name, prompt)
        assert res.nfe.tolist() == want.nfe.tolist() and int(res.nfe[0]) >= pipe.model.calls >= 1


def test_a_controller_instance_and_a_tuned_yaml_decode_as_the_name(models, tmp_path):
    den, _ = models
    prompt, G = [20, 21, 22, 23, 24], 11
    ctrl = build_controller("llada2", threshold=0.6, steps=2)
    path = save_controller(ctrl, tmp_path / "tuned.yaml")
    outs = []
    for spec, params in ((ctrl, None), (f"tuned:{path}", None), ("llada2", {"threshold": 0.6, "steps": 2})):
        scheduler = FrameworkScheduler(spec, params, gen_length=G, block_length=BS)
        run(pipeline(den, scheduler), [prompt], G)
        outs.append(scheduler.result().generated.tolist())
    assert outs[0] == outs[1] == outs[2]
    rebuilt = FrameworkScheduler.from_config(FrameworkScheduler(ctrl, gen_length=G, block_length=BS).config)
    assert rebuilt.config.controller == "llada2" and rebuilt.controller.get_params() == ctrl.get_params()


# ---------------------------------------------------------------------- errors, before any work where possible
def test_an_unknown_controller_fails_listing_the_known_ones():
    with pytest.raises(UnknownNameError, match=r"no_such_rule.*llada2"):
        FrameworkScheduler("no_such_rule", gen_length=8)
    with pytest.raises(ParameterError, match=r"llada2.threshold=1.5 is out of range"):
        FrameworkScheduler("llada2", {"threshold": 1.5}, gen_length=8)
    with pytest.raises(ParameterError, match=r"cache='block'.*allowed: none"):
        FrameworkScheduler("llada2", gen_length=8, decode={"cache": "block"})
    with pytest.raises(ParameterError, match=r"'temperature'.*the pipeline's temperature"):
        FrameworkScheduler("llada2", gen_length=8, decode={"temperature": 1.0})


def test_pipeline_settings_the_scheduler_cannot_follow_fail_clearly(models):
    den, _ = models
    scheduler = FrameworkScheduler("llada2", gen_length=None, block_length=BS)
    pipe = pipeline(den, scheduler)
    with pytest.raises(ParameterError, match=r"needs gen_length"):
        run(pipe, [[5, 6, 7]], 13)
    scheduler = FrameworkScheduler("llada2", gen_length=13, block_length=8)
    pipe = pipeline(den, scheduler)
    with pytest.raises(ParameterError, match=r"block_length=8 is not the block size.*allowed: 4"):
        pipe(input_ids=torch.tensor([[5, 6, 7]]), gen_length=13, output_type="seq", mask_token_id=MASK)
    assert pipe.model.calls == 0
    scheduler = FrameworkScheduler("llada2", gen_length=9, block_length=BS)
    with pytest.raises(ValueError, match=r"pipeline's gen_length is not the scheduler's gen_length=9"):
        run(pipeline(den, scheduler), [[5, 6, 7]], 13)
    scheduler = FrameworkScheduler("llada2", gen_length=13, block_length=BS)
    with pytest.raises(ParameterError, match=r"top_k=5"):
        run(pipeline(den, scheduler), [[5, 6, 7]], 13, top_k=5)
    with pytest.warns(UserWarning, match=r"threshold=0.2 has no effect.*controller_params"):
        run(pipeline(den, scheduler), [[5, 6, 7]], 13, threshold=0.2)
    ragged = dict(input_ids=torch.tensor([[0, 5, 6, 7], [4, 5, 6, 7]]), attention_mask=torch.tensor([[0, 1, 1, 1]] * 2))
    with pytest.raises(ValueError, match=r"left-padded"):
        pipeline(den, FrameworkScheduler("llada2", gen_length=12, block_length=BS))(
            **ragged, gen_length=12, block_length=BS, output_type="seq", mask_token_id=MASK)


# ---------------------------------------------------------------------- the pipeline's attention mask
class Spy(torch.nn.Module):
    """A pipeline model that records its arguments and serves the framework's block-causal logits."""

    def __init__(self, inner: PipelineDenoiser, reading=None) -> None:
        super().__init__()
        self.inner, self.reading, self.seen = inner, reading, []

    @property
    def device(self):
        return self.inner.device

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        self.seen.append((input_ids.clone(), attention_mask.clone(), position_ids.clone()))
        if self.reading is None:
            return self.inner(input_ids, attention_mask=attention_mask, position_ids=position_ids)
        self.inner.scheduler.observe(self.inner.denoiser, input_ids, attention_mask)
        return self.reading(input_ids, attention_mask, position_ids)


def _hub_masks():
    try:
        from transformers.modeling_attn_mask_utils import (
            _prepare_4d_causal_attention_mask,
            _prepare_4d_causal_attention_mask_for_sdpa,
        )
    except ImportError:  # pragma: no cover - transformers removed the API the published code calls
        pytest.skip("transformers no longer has _prepare_4d_causal_attention_mask")
    return _prepare_4d_causal_attention_mask, _prepare_4d_causal_attention_mask_for_sdpa


def block_causal(T: int) -> torch.Tensor:
    """LLaDA2.0 generate's mask: ``tril(ones(nb, nb))`` repeated by the block size, ``[T, T]`` bool."""
    nb = T // BS
    return torch.tril(torch.ones(nb, nb)).repeat_interleave(BS, 0).repeat_interleave(BS, 1).bool()


def test_the_pipeline_passes_a_2d_padding_mask_that_llada2s_published_path_makes_token_causal(models):
    """What the model gets: ``[B, T]`` ones over prompt + generation (zeros past P + G), positions
    ``arange(T)``. On LLaDA2's published path transformers makes it token-causal (eager), or no mask
    at all (SDPA, a window without zeros): bidirectional under the hub attention's is_causal=False."""
    causal, for_sdpa = _hub_masks()
    den, _ = models
    scheduler = FrameworkScheduler("llada2", gen_length=11, block_length=BS)
    spy = Spy(PipelineDenoiser(den, scheduler))
    run(pipeline(den, scheduler, spy), [[5, 6, 7]], 11)
    ids, mask, pos = spy.seen[0]
    assert mask.shape == ids.shape == (1, 4) and mask.tolist() == [[1, 1, 1, 1]]
    assert pos.tolist() == [list(range(4))]
    _, last, _ = spy.seen[-1]  # P + G = 14: the last block [12, 16) has a padded tail
    assert last.shape == (1, 16) and last[0, 14:].tolist() == [0, 0] and bool(last[0, :14].all())
    T = last.shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = causal(last, (1, T), torch.zeros(1, T, 8), 0)[0, 0] == 0
        sdpa_ones = for_sdpa(torch.ones(1, T, dtype=torch.long), (1, T), torch.zeros(1, T, 8), 0)
    assert torch.equal(eager[:14, :14], torch.ones(14, 14).tril().bool())  # token-causal
    assert sdpa_ones is None  # no mask: every column sees every column
    want = block_causal(T)
    assert not bool(eager[12, 13]) and bool(want[12, 13])  # inside the block: causal hides what LLaDA2 sees
    assert not bool(want[3, 12])  # and no earlier block sees a later one, which the bidirectional window allows


def _readings(den, ref):
    """The pipeline's 2-D mask read three ways, on the reference network (LLaDA2's published forward)."""
    causal, _ = _hub_masks()

    def token_causal(ids, mask, pos):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m4 = causal(mask, ids.shape, torch.zeros(*ids.shape, 8), 0)
        return type("Out", (), {"logits": ref(ids, attention_mask=m4, position_ids=pos).logits})

    def bidirectional(ids, mask, pos):
        return type("Out", (), {"logits": ref(ids, attention_mask=mask.bool()[:, None, None, :].expand(
            -1, 1, ids.shape[1], -1), position_ids=pos).logits})

    def generate_mask(ids, mask, pos):
        m4 = block_causal(ids.shape[1])[None, None] & mask.bool()[:, None, None, :]
        return type("Out", (), {"logits": ref(ids, attention_mask=m4, position_ids=pos).logits})

    return {"token-causal": token_causal, "bidirectional": bidirectional, "block-causal": generate_mask}


def test_only_the_block_causal_reading_is_llada2s_and_the_adapter_computes_it(models):
    """On the reference network: the block's logits under the token-causal and bidirectional readings
    differ from those under generate's block-causal mask, which PipelineDenoiser's equal; decoding with
    the wrong readings changes the tokens, with the adapter it is the framework's decode."""
    den, ref = models
    x = torch.tensor([[5, 6, 7] + [MASK] * 9])
    mask, pos = torch.ones_like(x), torch.arange(12)[None]
    readings = _readings(den, ref)
    with torch.no_grad():
        block = {k: f(x, mask, pos).logits[:, -BS:].float() for k, f in readings.items()}
        ours = PipelineDenoiser(den, FrameworkScheduler("llada2", gen_length=9, block_length=BS))
        ours.scheduler.set_timesteps(4, block_length=BS)
        mine = ours(x, attention_mask=mask, position_ids=pos).logits.float()
    assert torch.allclose(mine, block["block-causal"], atol=1e-4, rtol=1e-4)
    for wrong in ("token-causal", "bidirectional"):
        assert (block[wrong] - block["block-causal"]).abs().max() > 1e-2, wrong
    differs = {k: 0 for k in readings}
    for prompt, G in CASES:
        want = decode(den, [prompt], build_controller("llada2", threshold=0.6), DecodeConfig(gen_length=G))
        for key, reading in readings.items():
            scheduler = FrameworkScheduler("llada2", {"threshold": 0.6}, gen_length=G, block_length=BS)
            spy = Spy(PipelineDenoiser(den, scheduler), reading)
            run(pipeline(den, scheduler, spy), [prompt], G)
            differs[key] += scheduler.result().generated.tolist() != want.generated.tolist()
    assert differs["block-causal"] == 0 and differs["token-causal"] > 0 and differs["bidirectional"] > 0


def test_the_docs_example_runs():
    """docs/models.md's diffusers example, as written (a tiny checkpoint built from config)."""
    text = (ROOT / "docs" / "models.md").read_text()
    section = text.split("## diffusers", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    exec(compile(code, "docs/models.md", "exec"), {})


def test_multi_block_decoding_is_refused_by_name_before_any_forward():
    """The pipeline's window is one block: an explicit ``block_add_threshold`` below 1 is refused."""
    with pytest.raises(ParameterError, match=r"block_add_threshold=0\.1.*one block at a time.*allowed: 1\.0"):
        FrameworkScheduler("d3llm", gen_length=16, block_length=BS, decode={"block_add_threshold": 0.1})
