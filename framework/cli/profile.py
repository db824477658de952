"""``adec profile``: per-step cost at real shapes (LLaDA's vocabulary, prompt 256, generation 256,
blocks of 32), ``decode`` beside a bare loop, for every KV-cache mode; see :mod:`adaptive_decoding.framework.profiling`.
``--arch llada2 | sdar | fast_dllm_v2`` profiles a block-causal model at a released checkpoint's
shapes instead (:mod:`adaptive_decoding.framework.profiling.shapes`), with ``cache = none | block``."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

#: the flags that shape the default (LLaDA) body, with their defaults; block-causal archs use real shapes
LLADA_BODY = {"vocab_size": 126464, "d_model": 512, "layers": 8, "heads": 8, "block_length": 32}
BLOCK_ARCH_DEFAULT_LAYERS = 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="time and memory of a decoding step at real shapes, beside a bare loop",
        description=(
            "Build a LLaDA-architecture model from a config with the real vocabulary (126,464 ids; random "
            "weights, nothing downloaded) and decode random prompts with LLaDA's fixed-step rule, through "
            "'decode' and through a bare block-only loop (same forwards and cache policy, then a softmax over "
            "the block and the top-k commit), for every cache mode and temperature. Prints per-step "
            "milliseconds split into the forward and the rest, ms per generated token, memory from PyTorch's "
            "allocator (every allocation and free replayed in a separate warm-up run: the run's peak, the first "
            "step, which allocates the KV cache, and the largest and median later step, whole and once the "
            "forward has returned), and the ratios the engine is held to.\n\n"
            "Examples:\n"
            "  adec profile                                   # CPU, batch 1 and 8 (slow: minutes)\n"
            "  adec profile --batch 1 --cache none dual --temperature 0 --repeats 1\n"
            "  adec profile --loops decode verify --temperature 0   # what WINO's verification costs a step\n"
            "  adec profile --batch 1 --loops decode --temperature 0 --d-model 4096 --layers 2 --heads 32 \\\n"
            "      --mlp-hidden 12288 --dtype bfloat16           # LLaDA-8B's width and dtype, two layers, on CPU\n"
            "  adec profile --device cuda --dtype bfloat16 --d-model 4096 --layers 32 --heads 32 --mlp-hidden 12288\n\n"
            "Block-causal models at a released checkpoint's shapes (random weights; 2 layers unless --layers; "
            "cache none and block, side by side; --shape KEY=VALUE overrides a config key):\n"
            "  adec profile --arch llada2 --batch 1 --temperature 0   # LLaDA2.0-mini: 2 of 20 layers, layer 0 dense\n"
            "  adec profile --arch sdar --batch 1 --temperature 0     # SDAR-1.7B, block 4\n"
            "  adec profile --arch fast_dllm_v2 --batch 1 --temperature 0 --device cuda --layers 28"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from adaptive_decoding.framework.profiling.shapes import ARCH_NAMES

    p.add_argument("--arch", default="llada", choices=ARCH_NAMES,
                   help="llada (default): LLaDA's architecture with the body the flags below give; llada2 "
                        "(LLaDA2.0-mini's shapes), sdar (SDAR-1.7B's), fast_dllm_v2 (Fast-dLLM v2 1.5B's): "
                        "block-causal, their own blocks, cache none and block")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default: 1 8)")
    p.add_argument("--cache", nargs="+", default=None, choices=["none", "prefix", "dual", "block", "sub_block"],
                   help="cache modes (default: every mode of the arch: none prefix dual for llada, none block "
                        "for a block-causal arch; sub_block: block with Fast-dLLM v2's approximate sub-block "
                        "cache, sub-blocks of 8)")
    p.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0], help="temperatures (default: 0 1)")
    p.add_argument("--loops", nargs="+", default=["decode", "bare"], choices=["decode", "bare", "verify"],
                   help="what to time: decode (the framework's loop), bare (a hand-written block-only loop), "
                        "verify (decode plus WINO's verification of the decided tokens every step, the shadow "
                        "block, at the same NFE); default: decode bare")
    p.add_argument("--prompt-length", type=int, default=256)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--block-length", type=int, default=None,
                   help="default 32; a block-causal arch decodes in its own blocks (only that value is allowed)")
    p.add_argument("--tokens-per-step", type=int, default=4,
                   help="tokens LLaDA's rule commits per step (NFE = gen_length / this; default 4)")
    p.add_argument("--vocab-size", type=int, default=None, help="default: LLaDA's 126,464 (--arch llada only)")
    p.add_argument("--d-model", type=int, default=None, help="default 512 (--arch llada only)")
    p.add_argument("--layers", type=int, default=None,
                   help=f"default 8 for llada; a block-causal arch's layers are cut to this many (default "
                        f"{BLOCK_ARCH_DEFAULT_LAYERS}; llada2 needs 2: layer 0 dense, then MoE)")
    p.add_argument("--heads", type=int, default=None, help="default 8 (--arch llada only)")
    p.add_argument("--shape", nargs="+", default=None, metavar="KEY=VALUE",
                   help="a block-causal arch: override keys of its config.json (e.g. a tiny body: hidden_size=64 "
                        "num_experts=8); the header names them")
    p.add_argument("--mlp-hidden", type=int, default=None,
                   help="SwiGLU hidden width (default: 4 x d_model; LLaDA-8B's is 12288 = 3 x 4096; --arch llada only)")
    p.add_argument("--query-chunk", type=int, default=None, metavar="N",
                   help="take every forward over more than N query rows (the full forwards: no cache, and each "
                        "block's refresh) N rows at a time: one chunk's activations instead of every row's, in "
                        "smaller matrix products (default: one pass)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per configuration, after one warm-up run that measures peak memory")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows and ratios as JSON")
    from adaptive_decoding.framework.cli.options import DTYPES, device_arg

    p.add_argument("--dtype", default="auto", choices=DTYPES, help="auto = bfloat16 on a GPU, float32 on CPU")
    p.add_argument("--device", default="auto", type=device_arg, help="auto = CUDA when present, else CPU")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from adaptive_decoding.framework.models.hub_loading import resolve_device, resolve_dtype
    from adaptive_decoding.framework.profiling import as_dicts, markdown_table, ratios, run_profile

    overrides = _check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device) or torch.float32
    options = profile_options(args)
    model, described = _build_model(args, device, dtype, overrides)
    n = len(args.batch) * len(args.cache) * len(args.temperature) * len(args.loops)
    t0 = time.perf_counter()
    with tqdm(total=n, desc="profile", file=sys.stderr, disable=not sys.stderr.isatty()) as bar:
        def progress(text: str) -> None:
            bar.set_postfix_str(text)
            bar.update(1) if bar.n < n else None

        rows = run_profile(model, options, progress=progress)
    head = (f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, device {device}"
            f"{f' ({torch.cuda.get_device_name(device)}, torch {torch.__version__})' if device.startswith('cuda') else ''}, "
            f"{dtype}; "
            f"model: {described}; prompt {args.prompt_length}, generation {args.gen_length}, "
            f"block {args.block_length}, {args.tokens_per_step} token{'s' if args.tokens_per_step != 1 else ''} per step; "
            f"medians of {args.repeats} run{'s' if args.repeats != 1 else ''}; "
            f"{time.perf_counter() - t0:.0f} s in all")
    print(head + "\n")
    print(markdown_table(rows) + "\n")
    print("\n".join(ratios(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setup": head, "rows": as_dicts(rows), "ratios": ratios(rows)}, f, indent=2)
    return 0


def profile_options(args: argparse.Namespace) -> Any:
    """The :class:`~adaptive_decoding.framework.profiling.options.ProfileOptions` of the (checked) flags: the shapes and
    the sweep, LLaDA's steps = ``--gen-length / --tokens-per-step``."""
    from adaptive_decoding.framework.profiling.options import ProfileOptions

    return ProfileOptions.from_flat({
        "batches": args.batch, "prompt_length": args.prompt_length, "gen_length": args.gen_length,
        "block_length": args.block_length, "steps": args.gen_length // args.tokens_per_step,
        "caches": args.cache, "temperatures": args.temperature, "loops": args.loops, "repeats": args.repeats,
    })


def _check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Fill the arch's defaults into ``args`` and refuse bad values before any work; returns the
    block-causal arch's config overrides (``--shape``)."""
    from adaptive_decoding.framework.cli.errors import CLIError

    overrides = _check_arch_flags(args)
    for name in ("prompt_length", "gen_length", "block_length", "tokens_per_step", "repeats", "d_model", "layers",
                 "heads", "mlp_hidden", "query_chunk"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise CLIError(f"--{name.replace('_', '-')}={getattr(args, name)} is out of range; allowed: ≥ 1")
    if any(b < 1 for b in args.batch):
        raise CLIError(f"--batch {args.batch}: every batch size must be ≥ 1")
    if args.gen_length % args.block_length or args.block_length % args.tokens_per_step:
        raise CLIError(f"--block-length {args.block_length} must divide --gen-length {args.gen_length}, and "
                       f"--tokens-per-step {args.tokens_per_step} must divide the block length")
    if args.arch != "llada" and args.prompt_length % args.block_length:
        raise CLIError(f"--prompt-length {args.prompt_length}: a block-causal arch's profile needs prompts of whole "
                       f"blocks; allowed: a multiple of {args.block_length}")
    return overrides


def _check_arch_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The arch-dependent defaults (body, block length, cache modes) and the flags each arch allows."""
    from adaptive_decoding.framework.cli.errors import CLIError

    if args.arch == "llada":
        if args.shape:
            raise CLIError("--shape overrides a block-causal arch's config (--arch llada2, sdar, fast_dllm_v2); "
                           "--arch llada takes --d-model, --layers, --heads, --mlp-hidden, --vocab-size")
        for name, value in LLADA_BODY.items():
            setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
        args.mlp_hidden = args.mlp_hidden or 4 * args.d_model
        _check_caches(args, ("none", "prefix", "dual"))
        return {}
    given = [f"--{n.replace('_', '-')}" for n in ("vocab_size", "d_model", "heads", "mlp_hidden", "query_chunk")
             if getattr(args, n) is not None]
    if given:
        raise CLIError(f"{', '.join(given)} shape(s) the llada body only; --arch {args.arch} has its checkpoint's "
                       "shapes (override a config key with --shape KEY=VALUE)")
    overrides = _parse_shape(args.shape or [])
    block = int(overrides.get("bd_size" if args.arch == "fast_dllm_v2" else "block_size", _arch_block(args.arch)))
    if args.block_length not in (None, block):
        raise CLIError(f"--block-length {args.block_length} is not the block size {args.arch} was trained with; "
                       f"allowed: {block}")
    args.block_length = block
    args.layers = args.layers or BLOCK_ARCH_DEFAULT_LAYERS
    _check_caches(args, ("none", "block", "sub_block"), default=("none", "block"))
    return overrides


def _arch_block(arch: str) -> int:
    """The block size in ``arch``'s config (SDAR, LLaDA2: ``block_size``; Fast-dLLM v2: ``bd_size``)."""
    from adaptive_decoding.framework.profiling.shapes import ARCHS

    config = ARCHS[arch].config
    return int(config.get("block_size") or config["bd_size"])


def _check_caches(args: argparse.Namespace, allowed: tuple[str, ...], default: tuple[str, ...] = ()) -> None:
    """``--cache`` defaults to ``default`` (every mode in ``allowed`` if empty); any other fails naming them."""
    from adaptive_decoding.framework.cli.errors import CLIError

    args.cache = args.cache or list(default or allowed)
    bad = [c for c in args.cache if c not in allowed]
    if bad:
        raise CLIError(f"--cache {' '.join(bad)} does not apply to --arch {args.arch}; allowed: {', '.join(allowed)}")


def _parse_shape(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, each value read as JSON (numbers, true/false, null) or else as text."""
    from adaptive_decoding.framework.cli.errors import CLIError

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--shape {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def _build_model(args: argparse.Namespace, device: str, dtype: Any, overrides: dict[str, Any]) -> tuple[Any, str]:
    """The profiled model and the header's description of it."""
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.profiling import ProfileArch, profile_model

    if args.arch == "llada":
        arch = ProfileArch.build(vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.layers,
                                 n_heads=args.heads, mlp_hidden=args.mlp_hidden, query_chunk=args.query_chunk)
        model = profile_model(arch, device=device, dtype=dtype)
        params = sum(p.numel() for p in model.parameters())
        return model, (f"LLaDA architecture, vocab {args.vocab_size}, d_model {args.d_model}, {args.layers} layers, "
                       f"{args.heads} heads, MLP {args.mlp_hidden}"
                       f"{f', full forwards in chunks of {args.query_chunk} queries' if args.query_chunk else ''} "
                       f"({params / 1e6:.0f}M parameters, random)")
    from adaptive_decoding.framework.models.arch.errors import (
        CheckpointFormatError,
        UnsupportedArchitectureError,
    )
    from adaptive_decoding.framework.profiling.shapes import block_profile_model, describe

    try:
        model = block_profile_model(args.arch, args.layers, device, dtype, overrides=overrides)
    except (ValueError, CheckpointFormatError, UnsupportedArchitectureError) as err:
        raise CLIError(str(err)) from None
    return model, describe(args.arch, model, overrides)
