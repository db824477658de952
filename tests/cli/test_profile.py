"""``adec profile`` (framework/profiling.py): the bare loop it compares against decodes exactly what
``decode`` does with LLaDA's rule, so the timing comparison is like for like; the command prints
the table and the ratios, and refuses bad sizes. (Times are measured by the command, never here.)"""

from __future__ import annotations

import json

import pytest
import torch

from adaptive_decoding.framework import DecodeConfig, build_controller, decode
from adaptive_decoding.framework.cli.main import main
from adaptive_decoding.framework.profiling import bare_loop, profile_model, ratios, run_profile
from adaptive_decoding.framework.profiling.options import ProfileArch, ProfileOptions, ProfileSweep


@pytest.fixture(scope="module")
def model():
    return profile_model(ProfileArch.build(vocab_size=512, d_model=32, n_layers=1, n_heads=2, mlp_hidden=64))


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_the_bare_loop_decodes_exactly_what_decode_does(model, cache):
    prompts = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(1)).tolist()
    ours = decode(model, prompts, build_controller("llada", steps=8),
                  DecodeConfig(gen_length=16, block_length=8, cache=cache))
    tokens, nfe, _, _ = bare_loop(model, prompts, 16, 8, 8, cache)
    assert torch.equal(tokens[:, 12:], ours.generated)
    assert ours.nfe.tolist() == [nfe, nfe] == [8, 8]


def test_run_profile_rows_and_ratios(model):
    rows = run_profile(model, ProfileOptions.from_flat({
        "batches": [1], "caches": ["none", "dual"], "temperatures": [0.0, 1.0], "prompt_length": 8, "gen_length": 16,
        "block_length": 8, "steps": 8, "repeats": 1}))
    assert [(r.loop, r.cache, r.temperature) for r in rows] == [
        (loop, cache, t) for cache in ("none", "dual") for t in (0.0, 1.0) for loop in ("decode", "bare")]
    assert all(r.nfe == 8 and r.forward_ms_per_step > 0 and r.window_logits_mb > 0 for r in rows)
    # every later step holds at least its window's logits; the first also allocates the cache
    assert all(r.window_logits_mb <= r.median_step_peak_mb <= r.step_peak_mb for r in rows)
    assert all(r.first_step_peak_mb > r.median_step_peak_mb for r in rows if r.cache == "dual")
    lines = ratios(rows)
    assert len(lines) == 4 and any("speed-up per token vs cache=none" in line for line in lines)
    assert any("step vs greedy" in line for line in lines)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_the_verify_loop_pays_no_extra_forward_and_decodes_the_same(model, cache):
    # LLaDA's rule that asks for WINO's verification: the shadow block rides in each step's forward
    from adaptive_decoding.framework.profiling import _Verifying

    prompts = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(2)).tolist()
    config = DecodeConfig(gen_length=16, block_length=8, cache=cache)
    plain = decode(model, prompts, build_controller("llada", steps=8), config)
    seen = []
    verifying = _Verifying(build_controller("llada", steps=8))
    verifying.decide = lambda f, s: seen.append(f.verify_prob) or verifying.controller.decide(f, s)
    ver = decode(model, prompts, verifying, config)
    assert torch.equal(ver.generated, plain.generated) and ver.nfe.tolist() == plain.nfe.tolist() == [8, 8]
    assert sum(v is not None for v in seen) >= 6  # every step with a decided token of this decode verified it
    rows = run_profile(model, ProfileOptions.from_flat({
        "batches": [1], "caches": [cache], "temperatures": [0.0], "prompt_length": 8, "gen_length": 16,
        "block_length": 8, "steps": 8, "repeats": 1, "loops": ["decode", "verify"]}))
    assert [r.loop for r in rows] == ["decode", "verify"] and rows[1].nfe == 8
    assert "step with WINO's verification vs without" in ratios(rows)[0]
    with pytest.raises(ValueError, match="unknown profile loop.*'nope'.*decode, bare, verify"):
        run_profile(model, ProfileOptions(sweep=ProfileSweep(loops=("nope",))))
    with pytest.raises(ValueError, match="unknown profile loop.*'nope'.*decode, bare, verify"):
        ProfileOptions.from_flat({"loops": ["decode", "nope"]})  # refused when built, before any work


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--batch", "1", "--cache", "dual", "--temperature", "0", "--repeats", "1",
                 "--prompt-length", "8", "--gen-length", "16", "--block-length", "8", "--vocab-size", "256",
                 "--d-model", "32", "--layers", "1", "--heads", "2", "--device", "cpu", "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "| decode | 1 | dual | 0 |" in text and "| bare | 1 | dual | 0 |" in text
    assert json.loads(out.read_text())["rows"][0]["cache"] == "dual"


@pytest.mark.parametrize("args, message", [
    (["--tokens-per-step", "0"], "--tokens-per-step=0 is out of range"),
    (["--block-length", "5"], "--block-length 5 must divide --gen-length 256"),
    (["--batch", "0"], "every batch size must be ≥ 1"),
])
def test_cli_refuses_bad_sizes_before_any_work(args, message, capsys):
    assert main(["profile", *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_a_bad_cache_mode(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--cache", "triple"])
    assert "invalid choice: 'triple'" in capsys.readouterr().err


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_memory_is_measured_per_step(model, cache):
    from adaptive_decoding.framework.profiling import _measure

    prompts = [[5, 6, 7, 8]]
    config = DecodeConfig(gen_length=16, block_length=8, cache=cache)
    nfe, _, _, mem = _measure(lambda: (int(decode(model, prompts, build_controller("llada", steps=8),
                                                   config).nfe[0]), 0.0, 0.0), 1, model)
    assert nfe == 8 and len(mem.span_peaks_mb) == 8  # one span per forward
    window_logits_mb = 8 * model.vocab_size * 4 / 2**20
    assert min(mem.span_peaks_mb) >= window_logits_mb  # each step allocates at least its window's logits
    assert mem.peak_mb >= max(mem.span_peaks_mb)
    # after the forward the step holds its logits (at least) and never more than its own peak
    assert all(window_logits_mb <= t <= s for t, s in zip(mem.tail_peaks_mb, mem.span_peaks_mb))
    assert "core" not in vars(model)  # the forward marker is removed afterwards


# ------------------------------------------------------------------ block-causal archs (--arch), tiny shapes
TINY = {  # config keys of each arch's real config.json, a tiny body (the profile's real shapes take minutes)
    "llada2": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "intermediate_size": 96, "num_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2,
               "moe_intermediate_size": 32, "vocab_size": 512, "block_size": 8, "mask_token_id": 500,
               "eos_token_id": 501, "pad_token_id": 501},
    "sdar": {"hidden_size": 40, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "intermediate_size": 96, "vocab_size": 512, "mask_token_id": 500, "eos_token_id": 501},
    "fast_dllm_v2": {"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
                     "vocab_size": 512, "bd_size": 8, "mask_token_id": 500, "eos_token_id": 501},
}


def _shape_args(arch):
    return ["--shape", *(f"{k}={v}" for k, v in TINY[arch].items())]


@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("arch", sorted(TINY))
def test_the_bare_loop_decodes_a_block_causal_model_as_decode_does(arch, cache):
    from adaptive_decoding.framework.profiling.shapes import block_profile_model

    model = block_profile_model(arch, 2, overrides=TINY[arch])
    b = model.block_size
    prompts = torch.randint(0, 400, (2, 2 * b), generator=torch.Generator().manual_seed(3)).tolist()
    config = DecodeConfig(gen_length=16, block_length=b, cache=cache, eos_stop=False)
    ours = decode(model, prompts, build_controller("llada", steps=8), config)
    tokens, nfe, _, _ = bare_loop(model, prompts, 16, b, 8, cache)
    assert torch.equal(tokens[:, 2 * b:], ours.generated)
    assert ours.nfe.tolist() == [nfe, nfe] == [8, 8]
    with pytest.raises(ValueError, match=f"blocks of {b} after prompts of a multiple of {b} tokens"):
        bare_loop(model, [p[:-1] for p in prompts], 16, b, 8, cache)


@pytest.mark.parametrize("arch", sorted(TINY))
def test_cli_profiles_a_block_causal_arch_with_both_cache_modes(arch, tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile", "--arch", arch, "--batch", "1", "--temperature", "0", "--repeats", "1",
                 "--prompt-length", "8", "--gen-length", "16", "--device", "cpu", "--json", str(out),
                 *_shape_args(arch)])
    assert code == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["loop"], r["cache"]) for r in rows] == [
        (loop, cache) for cache in ("none", "block") for loop in ("decode", "bare")]
    assert len({r["nfe"] for r in rows}) == 1 and rows[0]["nfe"] > 0  # the exact cache runs the same forwards
    assert "| decode | 1 | none | 0 |" in text and "| decode | 1 | block | 0 |" in text
    assert "speed-up per token vs cache=none" in text and "ms per token" in text
    assert "2 of its" in text and "layers (cut on CPU" in text and "overridden:" in text


def test_cli_refuses_an_unknown_arch_naming_the_allowed_ones(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--arch", "gpt2"])
    err = capsys.readouterr().err
    assert "invalid choice: 'gpt2'" in err and all(a in err for a in ("llada", "llada2", "sdar", "fast_dllm_v2"))


@pytest.mark.parametrize("args, message", [
    (["--arch", "sdar", "--cache", "dual"], "--cache dual does not apply to --arch sdar; allowed: none, block"),
    (["--cache", "block"], "--cache block does not apply to --arch llada; allowed: none, prefix, dual"),
    (["--arch", "llada2", "--block-length", "16"], "--block-length 16 is not the block size llada2 was trained "
                                                    "with; allowed: 32"),
    (["--arch", "llada2", "--d-model", "64"], "--d-model shape(s) the llada body only"),
    (["--arch", "fast_dllm_v2", "--prompt-length", "40"], "allowed: a multiple of 32"),
    (["--arch", "llada2", "--layers", "1"], "--layers 1 is too few for llada2: at least 2"),
    (["--arch", "sdar", "--shape", "hidden=8"], "unknown sdar config key(s) ['hidden']; allowed:"),
    (["--shape", "hidden_size=8"], "--shape overrides a block-causal arch's config"),
])
def test_cli_refuses_bad_arch_flags_before_any_work(args, message, capsys):
    assert main(["profile", "--device", "cpu", *args]) == 2
    assert message in capsys.readouterr().err
