"""Measure Fast-dLLM v2's approximate sub-block cache (``sub_block_cache``) against the exact block cache
on a tiny Fast-dLLM v2 checkpoint built from its config (nothing downloaded): how many generated
tokens and answers differ, the forwards (NFE, and how many ran the whole block or a sub-block alone),
the query positions run through the network, and the decode time (median of ``--repeats``).

The checkpoint is the test suite's (``tests/fixtures/real_format/families.py``: Qwen2 body, tied
embeddings, random weights, the final norm scaled by 40 so that threshold decisions vary), with
``bd_size`` = ``--block``. Run from the repository root::

    python -m adaptive_decoding.experiments.studies.sub_block_cache --block 8 --small 2 4 --threshold 0.9 0.6
    python -m adaptive_decoding.experiments.studies.sub_block_cache --block 32 --small 8 --threshold 0.9 --gen-length 64
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.controller_io import build_controller
from adaptive_decoding.framework.engine.loop import decode
from adaptive_decoding.framework.models.arch import load_architecture
from adaptive_decoding.framework.models.own import OwnArchitectureDenoiser

ROOT = Path(__file__).resolve().parents[1]
MASK, V, EOS = 310, 320, 81


def tiny_fast_dllm_v2(block: int, seed: int = 7) -> OwnArchitectureDenoiser:
    """The tiny Fast-dLLM v2 checkpoint of the tests (``bd_size`` = ``block``), loaded and sharpened."""
    name = "_adec_real_format_families"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "fixtures" / "real_format" / "families.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    fam = sys.modules[name]
    folder = Path(tempfile.mkdtemp(prefix="adec-sub-block-")) / "ckpt"
    fam.build(folder, fam.fast_dllm_v2_config(bd_size=block, mask_token_id=MASK, eos_token_id=EOS), seed=seed)
    own = load_architecture(folder, dtype=torch.float32)
    with torch.no_grad():
        own.norm.weight.mul_(40.0)
    return OwnArchitectureDenoiser(own, mask_token_id=MASK, vocab_size=V, eos_token_id=EOS)


def query_positions(model: OwnArchitectureDenoiser) -> tuple[list[int], object]:
    """A counter of the query positions each forward of ``model``'s network runs (a forward hook)."""
    count = [0]

    def hook(module, args, kwargs, out):
        count[0] += int(args[0].shape[0] * args[0].shape[1]) if args else int(kwargs["input_ids"].numel())

    return count, model.model.register_forward_hook(hook, with_kwargs=True)


def measure(model, prompts: list[list[int]], gen_length: int, threshold: float, small: int, sub: bool,
            repeats: int) -> dict:
    """One configuration: the generation, NFE, whole-block forwards, query positions and median seconds."""
    ctrl = build_controller("fast_dllm_v2", threshold=threshold, small_block_size=small)
    config = DecodeConfig(gen_length=gen_length, cache="block", sub_block_cache=small if sub else None)
    count, handle = query_positions(model)
    res = decode(model, prompts, ctrl, config)
    handle.remove()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        decode(model, prompts, ctrl, config)
        seconds.append(time.perf_counter() - t0)
    return {"tokens": res.generated, "answers": res.answer_tokens, "nfe": int(res.nfe.sum()),
            "whole": int(res.cache_refreshes.sum()), "queries": count[0], "seconds": statistics.median(seconds)}


def compare(exact: dict, approx: dict) -> str:
    """One table row: what differs from the exact decode, the forwards and the time."""
    differ = exact["tokens"] != approx["tokens"]
    rows = differ.any(1)
    n = exact["tokens"].numel()
    return (f"{int(differ.sum())}/{n} tokens ({100 * float(differ.sum()) / n:.1f}%), {int(rows.sum())}/"
            f"{differ.shape[0]} rows | NFE {exact['nfe']} -> {approx['nfe']} | whole-block forwards "
            f"{exact['nfe']} -> {approx['whole']} ({approx['nfe'] - approx['whole']} sub-block alone) | query "
            f"positions {exact['queries']} -> {approx['queries']} ({approx['queries'] / exact['queries']:.2f}x) | "
            f"{1000 * exact['seconds']:.0f} -> {1000 * approx['seconds']:.0f} ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--block", type=int, default=8, help="the checkpoint's bd_size (default 8)")
    p.add_argument("--small", type=int, nargs="+", default=[2, 4], help="sub-block sizes s (dividing --block)")
    p.add_argument("--threshold", type=float, nargs="+", default=[0.9, 0.6], help="fast_dllm_v2's τ")
    p.add_argument("--prompts", type=int, default=32, help="random prompts of 3 to 20 tokens (seed 0)")
    p.add_argument("--gen-length", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = tiny_fast_dllm_v2(args.block)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 300, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 21, (args.prompts,), generator=g)]
    print(f"tiny Fast-dLLM v2 (bd_size {args.block}), {args.prompts} prompts of 3-20 tokens, G {args.gen_length}, "
          f"batch {args.prompts}, cache=block with and without sub_block_cache=s, {torch.get_num_threads()} threads")
    for threshold in args.threshold:
        for small in args.small:
            exact = measure(model, prompts, args.gen_length, threshold, small, False, args.repeats)
            approx = measure(model, prompts, args.gen_length, threshold, small, True, args.repeats)
            print(f"τ={threshold:g} s={small}: {compare(exact, approx)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
