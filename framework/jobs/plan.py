"""Planning a job: check the options and items before any work, group items by settings, chunk them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.rng import stable_seed
from adaptive_decoding.framework.engine.config import DecodeConfig
from adaptive_decoding.framework.engine.context import DecodeContext, MissingContextError
from adaptive_decoding.framework.engine.controller import Controller, DecodeState
from adaptive_decoding.framework.jobs.errors import failure_reason
from adaptive_decoding.framework.jobs.output import SCHEMA
from adaptive_decoding.framework.tasks.prompts import ON_ERROR, LineProblem, PromptItem


# ---------------------------------------------------------------------------------- job
@dataclass
class _Group:
    config: DecodeConfig
    controller: Controller
    overrides: dict[str, Any]


@dataclass
class WorkItem:
    item: PromptItem
    id: str
    group: _Group
    seed: int
    ids: list[int] = field(default_factory=list)
    mode: str = "normal"  # normal | no_lookahead | fallback
    mode_failures: int = 0
    retries: int = 0
    fallback_reason: Optional[str] = None


def as_factory(obj: Any) -> Callable[..., Controller]:
    if isinstance(obj, Controller):
        return lambda **over: type(obj).build(**{**obj.get_params(), **over}) if over else obj
    if callable(obj):
        return obj
    raise ParameterError(f"controller_factory={obj!r} is neither a Controller nor a callable returning one")


def controller_name(ctrl: Controller) -> str:
    return type(ctrl).display_name()


def dry_reset(ctrl: Controller, config: DecodeConfig, mask_id: int, context: Optional[DecodeContext] = None) -> None:
    """Run the controller's ``reset`` once so that its own config checks fire before any work; with
    ``context`` (a job's :meth:`DecodeContext.for_batch` of one item), what the controller needs of the
    decode context is checked too (without, a :class:`MissingContextError` is left to that check)."""
    state = DecodeState(config=config, seeds=torch.zeros(1, dtype=torch.long), mask_token_id=mask_id,
                        context=context or DecodeContext())
    try:
        ctrl.reset(state)
    except MissingContextError:
        if context is not None:
            raise


def describe_lookahead(lookahead: Any, spec: Optional[str]) -> Optional[dict]:
    """What identifies a lookahead in the settings hash (never an object address)."""
    if lookahead is None:
        return None
    params = {}
    if hasattr(lookahead, "get_params"):
        for key, value in lookahead.get_params().items():
            if value is None or isinstance(value, (str, int, float, bool)):
                params[key] = value
            elif hasattr(value, "to_dict"):
                params[key] = jsonable(value.to_dict())
        params.setdefault("context", None)  # a key the lookahead had before its context came from the decode call;
        # kept so that results files written then resume under the same settings hash
    return {"type": type(lookahead).__qualname__, "spec": spec, "params": params}


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def short_hash(obj: Any, n: int = 16) -> str:
    data = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.blake2b(data, digest_size=n // 2).hexdigest()


def context_length(loaded_model: Any) -> Optional[int]:
    """The most positions the denoiser accepts (prompt + G), or ``None`` when it does not say."""
    den = loaded_model.denoiser
    for holder in (den, getattr(den, "config", None)):
        if holder is None:
            continue
        for attr in ("max_len", "max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(holder, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    value = (loaded_model.info or {}).get("max_len")
    return value if isinstance(value, int) else None


def check_job_options(batch_size: int, item_timeout_s: Optional[float], job_timeout_s: Optional[float],
                      max_retries: int, on_error: str = "refuse", grow_after: int = 4,
                      names: Optional[dict[str, str]] = None) -> None:
    """Raise :class:`ParameterError` naming the option, the value and the allowed range.

    ``names`` renames options in the messages (a command passes its flags: ``--batch-size``).
    """
    names = names or {}

    def bad(name: str, value: Any, allowed: str) -> ParameterError:
        return ParameterError(f"{names.get(name, name)}={value!r} is out of range; allowed: {allowed}")

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise bad("batch_size", batch_size, "integer in [1, inf)")
    for name, value in (("item_timeout_s", item_timeout_s), ("job_timeout_s", job_timeout_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0 or not math.isfinite(value)):
            raise bad(name, value, "number in (0, inf) or null")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise bad("max_retries", max_retries, "integer in [0, inf)")
    if isinstance(grow_after, bool) or not isinstance(grow_after, int) or grow_after < 1:
        raise bad("grow_after", grow_after, "integer in [1, inf)")
    if on_error not in ON_ERROR:
        raise ParameterError(f"on_error={on_error!r} is not allowed; allowed: one of 'skip', 'refuse'")


def check_items(items: Sequence[PromptItem], controller_factory: Controller | Callable[..., Controller],
                config: DecodeConfig) -> list[LineProblem]:
    """The problems of the items' per-item ``params`` (and duplicate ids), without a model.

    The job runs the same checks itself; a command calls this first so that bad input is refused
    before a model is loaded (or trained).
    """
    factory = as_factory(controller_factory)
    base_ctrl = factory()
    return plan_work(items, factory, base_ctrl, config, 0, "")[1]


def plan_work(items: Sequence[PromptItem], factory: Callable[..., Controller], base_ctrl: Controller,
          config: DecodeConfig, mask_id: int, settings_hash: str) -> tuple[list[WorkItem], list[LineProblem]]:
    """Validate per-item params, group items by settings, give every item its id and seed."""
    cfg_keys = set(DecodeConfig.param_names())
    ctrl_keys = set(type(base_ctrl).param_names())
    base_group = _Group(config, base_ctrl, {})
    base_key = short_hash([{k: v for k, v in config.get_params().items() if k != "seed"}, {}])
    groups: dict[str, _Group] = {base_key: base_group}
    works: list[WorkItem] = []
    problems: list[LineProblem] = []
    occurrences: dict[str, int] = {}
    ids: dict[str, Optional[int]] = {}
    for n, item in enumerate(items):
        def label(reason: str, line: Optional[int] = item.line, n: int = n) -> LineProblem:
            return LineProblem(line, reason) if line is not None else LineProblem(None, f"item {n}: {reason}")

        params = dict(item.params or {})
        unknown = [k for k in params if k not in cfg_keys and k not in ctrl_keys]
        if unknown:
            problems.append(label(
                f"params: unknown key {unknown[0]!r}; decoding options: {', '.join(sorted(cfg_keys))}; "
                f"{controller_name(base_ctrl)} parameters: {', '.join(sorted(ctrl_keys)) or '(none)'}"))
            continue
        group = base_group
        seed = config.seed
        if params:
            cfg_over = {k: v for k, v in params.items() if k in cfg_keys}
            ctrl_over = {k: v for k, v in params.items() if k in ctrl_keys and k not in cfg_keys}
            try:
                item_cfg = DecodeConfig.build(**{**config.get_params(), **cfg_over})
                seed = item_cfg.seed
                key = short_hash([{k: v for k, v in item_cfg.get_params().items() if k != "seed"}, ctrl_over])
                if key not in groups:
                    ctrl = factory(**ctrl_over) if ctrl_over else base_ctrl
                    ctrl.validate()
                    dry_reset(ctrl, item_cfg, mask_id)
                    groups[key] = _Group(item_cfg, ctrl, ctrl_over)
                group = groups[key]
            except ParameterError as exc:
                problems.append(label(f"params: {exc}"))
                continue
        if item.id is not None:
            item_id = item.id
        else:
            basis = [item.prompt, jsonable(params), settings_hash]
            k = short_hash(basis)
            occurrences[k] = occurrences.get(k, 0) + 1
            item_id = "h" + short_hash(basis + [occurrences[k]])
        if item_id in ids:
            first = ids[item_id]
            where = f" (first on line {first})" if first else ""
            problems.append(label(f"duplicate id {item_id!r}{where}"))
            continue
        ids[item_id] = item.line
        works.append(WorkItem(item=item, id=item_id, group=group, seed=stable_seed(seed, item_id)))
    return works, problems


def push_chunks(explicit: deque, batch: list[WorkItem], size: int) -> None:
    """Put ``batch`` back at the front of the work, in order, as chunks of at most ``size``."""
    for chunk in reversed([batch[i:i + size] for i in range(0, len(batch), size)]):
        explicit.appendleft(chunk)


def take_batch(queue: deque, size: int) -> list[WorkItem]:
    first = queue.popleft()
    batch = [first]
    while queue and len(batch) < size and queue[0].group is first.group:
        batch.append(queue.popleft())
    return batch


def base_row(w: WorkItem, loaded_model: Any, settings_hash: str, controller: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "id": w.id, "status": "ok", "prompt": w.item.prompt,
        "params": jsonable(w.item.params or {}),
        "meta": jsonable(w.item.meta) if w.item.meta is not None else None,
        "line": w.item.line, "model": str(loaded_model.name), "controller": controller,
        "settings": settings_hash,
        "seed": w.seed, "text": None, "prompt_ids": None, "generated_ids": None, "nfe": None, "steps": None,
        "lookahead_nfe": None, "lookahead_fallbacks": None, "remasks": None,
        "fallback": w.fallback_reason is not None,
        "fallback_reason": w.fallback_reason,
        "error": None, "error_type": None, "retries": w.retries, "batch_size": None, "latency_s": None,
    }


def error_row(w: WorkItem, loaded_model: Any, settings_hash: str, kind: str, reason: str,
               fallback: Optional[Controller] = None) -> dict[str, Any]:
    ctrl = fallback if (w.mode == "fallback" and fallback is not None) else w.group.controller
    row = base_row(w, loaded_model, settings_hash, controller_name(ctrl))
    row.update(status="error", error=reason or kind, error_type=kind,
               prompt_ids=list(w.ids) if w.ids else None)
    return row


def precheck(w: WorkItem, tokenizer: Any, loaded_model: Any, settings_hash: str) -> Optional[dict]:
    """An error row for an item that cannot run (deterministic, so not retried), else ``None``."""
    if not w.item.prompt or not w.item.prompt.strip():
        return error_row(w, loaded_model, settings_hash, "empty_prompt", "prompt is empty")
    try:
        w.ids = [int(t) for t in tokenizer.encode(w.item.prompt)]
    except Exception as exc:  # noqa: BLE001
        return error_row(w, loaded_model, settings_hash, "encode",
                          f"the tokenizer cannot encode the prompt: {failure_reason(exc)}")
    if not w.ids:
        return error_row(w, loaded_model, settings_hash, "empty_prompt", "prompt encodes to 0 tokens")
    ctx = context_length(loaded_model)
    need = len(w.ids) + w.group.config.gen_length
    if ctx is not None and need > ctx:
        return error_row(w, loaded_model, settings_hash, "too_long",
                          f"prompt of {len(w.ids)} tokens + gen_length {w.group.config.gen_length} = {need} "
                          f"positions exceeds the model's context of {ctx} positions")
    return None
