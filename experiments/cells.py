"""One cell of an experiment: its model (built-in, hub, trained on the fly, toy), its strategy, its
evaluation and metrics.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from adaptive_decoding.experiments.options import ShardedEvaluation
from adaptive_decoding.experiments.spec import Cell, Experiment, ensure_text_task

# ====================================================================== models
_MODEL_CACHE: dict[str, Any] = {}


def resolve_device(device: str, local_rank: int = 0) -> str:
    import torch

    if device == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return f"cuda:{local_rank}"
    return device


def load_any_model(model: Any, device: str = "cpu") -> Any:
    """A :class:`LoadedModel` from a model entry (names, folders, hub names, mappings); cached per process."""
    key = json.dumps([model, device], sort_keys=True, default=str)
    if key in _MODEL_CACHE:
        return _MODEL_CACHE[key]
    if isinstance(model, dict) and "factory" in model:
        mod, _, attr = str(model["factory"]).partition(":")
        loaded = getattr(importlib.import_module(mod),
                         attr)(**{"device": device, **(model.get("kwargs") or {})})
    else:
        opts = dict(model) if isinstance(model, dict) else {"name": model}
        name = opts.pop("name")
        from adaptive_decoding.framework.tasks.text import TEXT_MODEL
        from adaptive_decoding.framework.training.text_model import load_text_model

        if name == TEXT_MODEL:
            loaded = load_text_model(device=device)
        elif opts:
            from adaptive_decoding.framework.models.hub_loading import load_hub_model

            opts.setdefault("chat", None)  # as load_model and adec decode: the chat template when there is one
            loaded = load_hub_model(name, device=device, **opts)
        elif name.count("/") == 1 and not Path(name).expanduser().exists() and not name.startswith((".",
                                                                                                    "~")):
            from adaptive_decoding.framework.models.hub_loading import load_hub_model

            loaded = load_hub_model(name, device=device)
        else:
            from adaptive_decoding.framework.training.zoo import load_model

            loaded = load_model(name, device=device)
    _MODEL_CACHE[key] = loaded
    return loaded


def tiny_model(task: str = "addition", size: str = "tiny", train_steps: int = 0, seed: int = 0,
               batch_size: int = 64, lr: float = 3e-3, device: str = "cpu",
               task_params: Optional[dict] = None) -> Any:
    """A :class:`TinyDenoiser` built from a config for ``task`` and trained ``train_steps`` steps with the
    masked-diffusion loss (plain torch, seeded: the same weights in every process). For tests and demos."""
    import torch

    from adaptive_decoding.framework.models.protocol import LoadedModel
    from adaptive_decoding.framework.models.tiny import MODEL_SIZES, TinyConfig, TinyDenoiser
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.training.data import collate
    from adaptive_decoding.framework.training.masked_diffusion import (
        forward_process,
        masked_diffusion_loss,
        sample_t,
    )

    ensure_text_task()
    t = get_task(task, **(task_params or {}))
    tok = t.tokenizer
    torch.manual_seed(seed)
    den = TinyDenoiser(TinyConfig(vocab_size=tok.vocab_size, mask_token_id=tok.mask_token_id,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                  max_len=t.canvas_length, structure=getattr(t, "attention_structure", None),
                                  **MODEL_SIZES[size]))
    if train_steps:
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(den.parameters(), lr=lr)
        stream = t.iter_examples("train", seed=seed)
        den.train()
        for _ in range(int(train_steps)):
            batch = collate(t, [next(stream) for _ in range(batch_size)])
            x0, ans = batch["input_ids"], batch["answer_mask"]
            tt = sample_t(x0.shape[0], True, g)
            xt, masked, p_mask = forward_process(x0, ans, tok.mask_token_id, tt, 1e-3, g)
            loss = masked_diffusion_loss(den(xt, attention_mask=batch["attention_mask"]), x0, masked, p_mask,
                                         ans)
            opt.zero_grad()
            loss.backward()
            opt.step()
    den.eval().to(device)
    return LoadedModel(denoiser=den, tokenizer=tok, name=f"tiny-model-{task}-{size}-{train_steps}", task=task,
                       info={"train_steps": train_steps, "seed": seed, "size": size})


def toy_model(task: str = "addition", low: float = 0.3, high: float = 0.99, salt: int = 0,
              device: str = "cpu",
              task_params: Optional[dict] = None) -> Any:
    """:class:`adaptive_decoding.framework.testing.toys.ContextToyDenoiser` over the task's vocabulary: designed,
    context-dependent
    confidences in ``[low, high]`` (so NFE is ragged across samples), exact in every process. For tests."""
    from adaptive_decoding.framework.models.protocol import LoadedModel
    from adaptive_decoding.framework.tasks.base import get_task
    from adaptive_decoding.framework.testing.toys import ContextToyDenoiser

    ensure_text_task()
    tok = get_task(task, **(task_params or {})).tokenizer
    den = ContextToyDenoiser(vocab_size=tok.vocab_size + 3, low=low, high=high, salt=salt).to(device)
    return LoadedModel(denoiser=den, tokenizer=tok, name=f"toy-{task}", task=task, info={"toy": True})


# ====================================================================== evaluating one cell
def build_cell(cell: Cell, task: Any, config_seed: Optional[int] = None) -> tuple[Any, Any, Any]:
    """The cell's ``(controller, DecodeConfig, Lookahead or None)`` for ``task``."""
    from adaptive_decoding.experiments.strategies import Strategy
    from adaptive_decoding.framework.engine.config import DecodeConfig
    from adaptive_decoding.framework.engine.controller_io import build_controller

    cfg_kw = {"gen_length": task.gen_length, "block_length": task.default_block_length}
    if cell.controller.startswith("tuned:"):
        from adaptive_decoding.framework.engine.controller_io import load_decode_config

        cfg_kw.update({k: v for k, v in (load_decode_config(cell.controller[6:]) or {}).items()
                       if k != "seed"})
    cfg_kw.update(cell.decode)
    cfg_kw["seed"] = cell.seed if config_seed is None else config_seed
    config = DecodeConfig.build(**cfg_kw)
    params = Strategy(cell.strategy.label, cell.controller, cell.params).resolve(
        config.gen_length, config.effective_block_length)
    controller = build_controller(cell.controller, **params)
    lookahead = None
    if cell.lookahead:
        from adaptive_decoding.framework.engine.lookahead import Lookahead

        lookahead = Lookahead.build(**cell.lookahead)
    return controller, config, lookahead


def evaluate_cell(cell: Cell, loaded: Any, task: Any, exp: Experiment, dist: Any = None) -> Any:
    """Decode the cell's examples and score them; an :class:`adaptive_decoding.framework.engine.evaluate.EvalResult`.

    With a :class:`adaptive_decoding.experiments.distributed.DistContext` of several ranks, the examples are sharded
    across ranks and gathered (every rank returns the same result).
    """
    from adaptive_decoding.experiments.distributed import evaluate_sharded

    controller, config, lookahead = build_cell(cell, task)
    return evaluate_sharded(loaded, task, controller, config, cell_evaluation(cell, exp), dist=dist,
                            lookahead=lookahead)


def cell_evaluation(cell: Cell, exp: Experiment) -> ShardedEvaluation:
    """The cell's :class:`~adaptive_decoding.experiments.options.ShardedEvaluation`: the experiment file's ``split``,
    ``batch_size``, ``repeats`` and ``data_seed``, the cell's ``n`` and its strategy's label."""
    return ShardedEvaluation.build(split=exp.split, n=cell.n, batch_size=exp.batch_size, data_seed=exp.data_seed,
                                   repeats=exp.repeats, strategy=cell.strategy.label)


def compute_cell_metrics(cell: Cell, task: Any, samples: list[dict], device: str = "cpu",
                         only: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """The cell's metrics on its per-sample records: ``{name: MetricResult}``."""
    from adaptive_decoding.experiments.metrics import MetricContext, compute_metrics

    specs = [(n, p) for n, p in cell.metrics if only is None or n in only]
    if not specs:
        return {}
    ctx = MetricContext(task=task, device=device)
    return compute_metrics(specs, [s["output"] for s in samples], [s["answer"] for s in samples],
                           [s["prompt"] for s in samples], ctx)
