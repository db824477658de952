"""``adec profile``: per-step cost at real shapes (LLaDA's vocabulary, prompt 256, generation 256,
blocks of 32), ``decode`` beside a bare loop, for every KV-cache mode; see :mod:`framework.profiling`."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time


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
            "  adec profile --device cuda --dtype bfloat16 --d-model 4096 --layers 32 --heads 32 --mlp-hidden 12288"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (default: 1 8)")
    p.add_argument("--cache", nargs="+", default=["none", "prefix", "dual"], choices=["none", "prefix", "dual"],
                   help="cache modes (default: all three)")
    p.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0], help="temperatures (default: 0 1)")
    p.add_argument("--loops", nargs="+", default=["decode", "bare"], choices=["decode", "bare", "verify"],
                   help="what to time: decode (the framework's loop), bare (a hand-written block-only loop), "
                        "verify (decode plus WINO's verification of the decided tokens every step, the shadow "
                        "block, at the same NFE); default: decode bare")
    p.add_argument("--prompt-length", type=int, default=256)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--tokens-per-step", type=int, default=4,
                   help="tokens LLaDA's rule commits per step (NFE = gen_length / this; default 4)")
    p.add_argument("--vocab-size", type=int, default=126464, help="default: LLaDA's 126,464")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--mlp-hidden", type=int, default=None,
                   help="SwiGLU hidden width (default: 4 x d_model; LLaDA-8B's is 12288 = 3 x 4096)")
    p.add_argument("--query-chunk", type=int, default=None, metavar="N",
                   help="take every forward over more than N query rows (the full forwards: no cache, and each "
                        "block's refresh) N rows at a time: one chunk's activations instead of every row's, in "
                        "smaller matrix products (default: one pass)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per configuration, after one warm-up run that measures peak memory")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows and ratios as JSON")
    from framework.cli.options import DTYPES, device_arg

    p.add_argument("--dtype", default="auto", choices=DTYPES, help="auto = bfloat16 on a GPU, float32 on CPU")
    p.add_argument("--device", default="auto", type=device_arg, help="auto = CUDA when present, else CPU")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from framework.cli.errors import CLIError
    from framework.models.hub_loading import resolve_device, resolve_dtype
    from framework.profiling import as_dicts, markdown_table, profile_model, ratios, run_profile

    args.mlp_hidden = args.mlp_hidden or 4 * args.d_model
    for name in ("prompt_length", "gen_length", "block_length", "tokens_per_step", "repeats", "d_model", "layers",
                 "heads", "mlp_hidden", "query_chunk"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise CLIError(f"--{name.replace('_', '-')}={getattr(args, name)} is out of range; allowed: ≥ 1")
    if any(b < 1 for b in args.batch):
        raise CLIError(f"--batch {args.batch}: every batch size must be ≥ 1")
    if args.gen_length % args.block_length or args.block_length % args.tokens_per_step:
        raise CLIError(f"--block-length {args.block_length} must divide --gen-length {args.gen_length}, and "
                       f"--tokens-per-step {args.tokens_per_step} must divide the block length")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device) or torch.float32
    model = profile_model(args.vocab_size, args.d_model, args.layers, args.heads, args.mlp_hidden, device, dtype,
                          query_chunk=args.query_chunk)
    steps = args.gen_length // args.tokens_per_step
    n = len(args.batch) * len(args.cache) * len(args.temperature) * len(args.loops)
    t0 = time.perf_counter()
    with tqdm(total=n, desc="profile", file=sys.stderr, disable=not sys.stderr.isatty()) as bar:
        def progress(text: str) -> None:
            bar.set_postfix_str(text)
            bar.update(1) if bar.n < n else None

        rows = run_profile(model, batches=args.batch, caches=args.cache, temperatures=args.temperature,
                           prompt_length=args.prompt_length, gen_length=args.gen_length,
                           block_length=args.block_length, steps=steps, repeats=args.repeats, progress=progress,
                           loops=args.loops)
    params = sum(p.numel() for p in model.parameters())
    head = (f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, device {device}"
            f"{f' ({torch.cuda.get_device_name(device)}, torch {torch.__version__})' if device.startswith('cuda') else ''}, "
            f"{dtype}; "
            f"model: LLaDA architecture, vocab {args.vocab_size}, d_model {args.d_model}, {args.layers} layers, "
            f"{args.heads} heads, MLP {args.mlp_hidden}"
            f"{f', full forwards in chunks of {args.query_chunk} queries' if args.query_chunk else ''} "
            f"({params / 1e6:.0f}M parameters, random); prompt {args.prompt_length}, generation {args.gen_length}, "
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
