"""The engine on a CUDA device: the same decisions as on CPU, the cache modes, the lookahead, the profile.

On a machine with a CUDA device they compare it with the CPU (``experiments/gpu_profile.sh`` runs
them first). Without one (CI) they run on CPU against CPU, at a small vocabulary where LLaDA's real
one would only cost time: that keeps the checks themselves working, and the batch and bfloat16
checks still hold there. ``ADEC_TEST_DEVICE`` names another device. The models are the tiny real-format LLaDA and Dream checkpoints
of ``tests/fixtures/real_format`` in float32 (TF32 off, so CPU and GPU agree to rounding and every
decision below is compared exactly), and the shipped ``tiny-sudoku9``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from adaptive_decoding.framework import DecodeConfig, build_controller, decode
from adaptive_decoding.framework.learning.policy import tiny_policy_file
from adaptive_decoding.framework.models.arch import load_architecture
from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

DEVICE = os.environ.get("ADEC_TEST_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
VOCAB = 126464 if torch.device(DEVICE).type == "cuda" else 2048  # LLaDA's real one where it is cheap
BUILD = Path(__file__).resolve().parents[1] / "fixtures" / "real_format" / "build.py"

CACHES = ("none", "prefix", "dual")
# every commit rule family: fixed steps, thresholds, top-k by margin / entropy, random, verify, revise, learned
STRATEGIES = [
    ("llada", {"steps": 8}), ("llada_random", {"steps": 8}), ("fast_dllm", {"threshold": 0.2}),
    ("fast_dllm_factor", {}), ("margin_topk", {}), ("entropy_topk", {}), ("eb", {}), ("dream_confidence", {}),
    ("wino", {}), ("remdm", {}), ("cadllm", {}), ("temporal_stability", {}),
    *[(name, {"policy": str(tiny_policy_file(kind)), "threshold": 0.5})
      for name, kind in (("learned", "mlp"), ("learned_window", "transformer"), ("logreg", "logreg"))],
]
PROMPTS = [[3, 40, 7, 99, 12], [250, 8], [17, 17, 60, 61, 2, 90, 33]]


@pytest.fixture(scope="module", autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _own(folder):
    arch = load_architecture(folder)
    return OwnArchitectureDenoiser(arch, mask_token_id=arch.mask_token_id if arch.mask_token_id is not None else 310,
                                   vocab_size=arch.vocab_size, eos_token_id=arch.eos_token_id,
                                   pad_token_id=arch.pad_token_id)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("_adec_real_format_build", BUILD)
    build = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(build)
    llada = _own(build.build_llada(tmp_path_factory.mktemp("llada") / "ckpt", seed=5, n_kv_heads=2, init_std=0.3))
    dream = _own(build.build_dream(tmp_path_factory.mktemp("dream") / "ckpt", seed=6))
    return {name: (m, copy.deepcopy(m).to(DEVICE)) for name, m in (("llada", llada), ("dream", dream))}


def _run(model, name, params, prompts=PROMPTS, seeds=(3, 4, 5), **cfg):
    return decode(model, prompts, build_controller(name, **params), DecodeConfig(**cfg), seeds=list(seeds))


@pytest.mark.parametrize("which", ["llada", "dream"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_rule_and_cache_mode_decides_on_the_device_as_on_cpu(which, temperature, models):
    cpu, gpu = models[which]
    differ = []
    for cache in CACHES:
        for name, params in STRATEGIES:
            cfg = dict(gen_length=16, block_length=4, temperature=temperature, cache=cache)
            try:
                want = _run(cpu, name, params, **cfg)
            except (ValueError, NotImplementedError) as err:  # a rule that refuses this cache mode
                with pytest.raises(type(err)):
                    _run(gpu, name, params, **cfg)
                continue
            got = _run(gpu, name, params, **cfg)
            assert got.generated.device.type == torch.device(DEVICE).type
            if not (torch.equal(got.generated.cpu(), want.generated) and torch.equal(got.nfe.cpu(), want.nfe)):
                differ.append(f"{name} cache={cache}: nfe {got.nfe.tolist()} vs {want.nfe.tolist()}")
    assert not differ, differ


@pytest.mark.parametrize("which", ["llada", "dream"])
@pytest.mark.parametrize("cache", CACHES)
def test_a_ragged_batch_equals_its_rows_on_the_device(which, cache, models):
    _, gpu = models[which]
    for name, params in STRATEGIES[:3]:
        batch = _run(gpu, name, params, gen_length=16, block_length=4, cache=cache, temperature=1.0)
        for i, p in enumerate(PROMPTS):
            one = _run(gpu, name, params, prompts=[p], seeds=[(3, 4, 5)[i]], gen_length=16, block_length=4,
                       cache=cache, temperature=1.0)
            assert torch.equal(one.generated[0], batch.generated[i]), (name, i)
            assert int(one.nfe[0]) == int(batch.nfe[i])


def test_the_escalating_verifier_lookahead_on_the_device_scores_as_on_cpu():
    import adaptive_decoding.scorers as scorers  # noqa: F401 - registers sudoku_rules
    from adaptive_decoding.framework.engine.evaluate import evaluate
    from adaptive_decoding.framework.engine.lookahead import Lookahead
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.training.zoo import load_model

    task = get_task("sudoku9")
    out = {}
    for device in ("cpu", DEVICE):
        loaded = load_model("tiny-sudoku9", device=device, progress=False)
        ctrl = build_controller("confidence_ladder", base={"name": "margin_topk", "params": {"eta": 0.9}},
                                depth_high=64, depth_mid=64, d_max=64)
        la = Lookahead.build(scorer="sudoku_rules", width=2, max_depth=64, rollout="controller", rescore="none",
                             advance=64, lazy=True, escalate=[0.99], budget=128)
        cfg = DecodeConfig.build(gen_length=81, block_length=81, seed=0)
        out[device] = evaluate(loaded, task, ctrl, cfg, n=24, batch_size=24, lookahead=la)
    cpu, gpu = out["cpu"], out[DEVICE]
    assert [s.correct for s in gpu.samples] == [s.correct for s in cpu.samples]
    assert gpu.nfe == pytest.approx(cpu.nfe) and gpu.lookahead_nfe == pytest.approx(cpu.lookahead_nfe)


def test_bfloat16_decodes_every_position_with_the_cache():
    from adaptive_decoding.framework.profiling import ProfileArch, profile_model

    model = profile_model(ProfileArch.build(vocab_size=VOCAB, d_model=256, n_layers=2, n_heads=4, mlp_hidden=512),
                          device=DEVICE, dtype=torch.bfloat16)
    prompts = torch.randint(0, VOCAB - 400, (2, 40), generator=torch.Generator().manual_seed(0)).tolist()
    for cache in CACHES:
        r = _run(model, "fast_dllm", {"threshold": 0.9}, prompts=prompts, seeds=(1, 2), gen_length=64,
                 block_length=32, cache=cache, temperature=1.0)
        assert (r.generated != model.mask_token_id).all() and (r.generated < VOCAB).all()
        assert (r.nfe >= 2).all() and (r.nfe <= 64 + (2 if cache != "none" else 0)).all()


def test_the_profile_times_and_measures_every_step_on_the_device():
    from adaptive_decoding.framework.profiling import ProfileArch, ProfileOptions, profile_model, run_profile

    model = profile_model(ProfileArch.build(vocab_size=VOCAB, d_model=256, n_layers=2, n_heads=4, mlp_hidden=512),
                          device=DEVICE, dtype=torch.bfloat16)
    rows = run_profile(model, ProfileOptions.from_flat({
        "batches": [2], "temperatures": [0.0, 1.0], "prompt_length": 32, "gen_length": 64, "block_length": 32,
        "repeats": 2, "loops": ["decode", "bare", "verify"]}))
    assert len(rows) == 3 * 2 * 3
    for r in rows:
        assert r.nfe == 16 and r.forward_ms_per_step > 0 and r.rest_ms_per_step >= 0
        assert r.peak_mb > 0 and r.step_peak_mb == r.step_peak_mb  # the per-step replay ran (not NaN)
