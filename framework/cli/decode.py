"""``adec decode``: decode prompts with any controller and print text (or JSON per sample)."""

from __future__ import annotations

import argparse
import json
import sys

from adaptive_decoding.framework.cli.options import (
    add_decoding_args,
    add_lookahead_args,
    build_lookahead,
    load_cli_model,
    model_options,
    resolve_decoding,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decode", help="decode prompts with a controller",
        description=(
            "Decode prompts with a masked diffusion LM and a controller. Prompts come from --prompt "
            "(repeatable) or a JSONL file of {\"prompt\": ..., \"id\": ...} lines.\n\n"
            "--model is a folder, a built-in name or a hub name org/name from the local Hugging Face "
            "cache (never downloaded). An instruct model's prompts are wrapped in its chat template "
            "unless --no-chat-template.\n\n"
            "Examples:\n  adec decode --model tiny-addition --prompt '123+456=' "
            "--controller fast_dllm --set threshold=0.9 --json\n"
            "  adec decode --model GSAI-ML/LLaDA-8B-Instruct --prompt 'What is 12*7?' "
            "--controller fast_dllm --set gen_length=64 --set block_length=32"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_decoding_args(p)
    add_lookahead_args(p)
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    p.add_argument("--prompt-file", metavar="JSONL", help="a JSONL file of prompts")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per sample: prompt, prompt_ids, generated_ids, text, nfe, steps, "
                        "answer_tokens (to the first end-of-text), tokens_per_forward (answer_tokens / nfe), "
                        "remasks (revocable decoding)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per batch (default: 64)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from adaptive_decoding.framework.cli.errors import CLIError
    from adaptive_decoding.framework.engine.context import DecodeContext
    from adaptive_decoding.framework.engine.evaluate import item_seeds
    from adaptive_decoding.framework.engine.loop import decode

    options = model_options(args)  # a device this machine lacks fails here, before any work
    prompts: list[str] = list(args.prompt)
    ids: list[str] = [f"prompt-{i}" for i in range(len(prompts))]
    if args.prompt_file:
        from adaptive_decoding.framework.tasks.prompts import read_prompts

        items, problems = read_prompts(args.prompt_file, on_error="refuse")
        prompts += [it.prompt for it in items]
        ids += [it.id or f"line-{it.line or n}" for n, it in enumerate(items)]
    if not prompts:
        raise CLIError("no prompts: give --prompt TEXT (repeatable) or --prompt-file FILE.jsonl")
    if args.batch_size < 1:
        raise CLIError(f"--batch-size={args.batch_size} must be ≥ 1")
    loaded = load_cli_model(args.model, options)
    defaults = {}
    t = None
    if getattr(loaded, "task", None):
        from adaptive_decoding.framework.tasks.base import get_task

        t = get_task(loaded.task)
        defaults = {"gen_length": t.gen_length, "block_length": t.default_block_length}
    setup = resolve_decoding(args, defaults)
    lookahead = build_lookahead(args)
    tok = loaded.tokenizer
    for start in range(0, len(prompts), args.batch_size):
        chunk, chunk_ids = prompts[start : start + args.batch_size], ids[start : start + args.batch_size]
        try:
            enc = [tok.encode(p) for p in chunk]
        except ValueError as exc:
            raise CLIError(f"cannot tokenize prompt: {exc}") from None
        res = decode(loaded.denoiser, enc, setup.controller, setup.config,
                     seeds=item_seeds(chunk_ids, setup.config.seed), lookahead=lookahead,
                     context=DecodeContext.for_batch(tok, chunk, task=t, gen_length=setup.config.gen_length))
        for i, p in enumerate(chunk):
            gen = res.generated[i].tolist()
            text = tok.decode(gen, stop_at_eos=True)
            if args.json:
                print(json.dumps({
                    "id": chunk_ids[i], "prompt": p, "prompt_ids": enc[i], "generated_ids": gen,
                    "text": text, "nfe": int(res.nfe[i]), "steps": int(res.steps[i]),
                    "answer_tokens": int(res.answer_tokens[i]),
                    "tokens_per_forward": float(res.tokens_per_forward[i]),
                    "remasks": int(res.remasks[i]) if res.remasks is not None else 0,
                    "controller": setup.controller_name,
                    "chat_template": bool(getattr(tok, "chat", False)),
                }))
            else:
                print(f"{p}{text}\t(nfe={int(res.nfe[i])})")
        sys.stdout.flush()
    return 0
