"""Save and load a controller (and the decoding options it was tuned with) as YAML.

The file is plain, human-editable YAML::

    controller: margin_topk          # a registered name (built-in or entry point)
    params: {eta: 0.27, k: 3, adapt: true, beta: 0.9}
    decode: {gen_length: 32, block_length: 8, ...}   # optional: adaptive_decoding.framework.engine.config.DecodeConfig
    extra: {study: ..., accuracy: 0.91, nfe: 11.5}   # optional: free-form provenance

``--controller tuned:PATH`` (see :func:`adaptive_decoding.framework.engine.controller_io.build_controller`) calls
:func:`load_controller`. As with transformers' ``GenerationConfig``, a saved config that does not
validate is refused, with the file, the parameter and its allowed range in the message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.core.registry import UnknownNameError
from adaptive_decoding.framework.engine.controller import CONTROLLERS, Controller

FORMAT_KEYS = ("controller", "params", "decode", "extra")


def _plain(value: Any, where: str) -> Any:
    """``value`` as YAML-safe builtins (tuples become lists, 0-d tensors numbers)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    if hasattr(value, "get_params"):
        return _plain(value.get_params(), where)
    raise TypeError(f"{where}={value!r} cannot be saved as YAML; use numbers, strings, lists or dicts")


def save_controller(
    controller: Controller,
    path: str | os.PathLike,
    decode_config: Any = None,
    extra: Optional[Mapping[str, Any]] = None,
) -> Path:
    """Write ``controller`` (its registered name and ``get_params()``) to ``path`` as YAML.

    Args:
        controller: a registered controller instance (its name must resolve back to its class).
        path: the file to write (parent folders are created).
        decode_config: a :class:`adaptive_decoding.framework.engine.config.DecodeConfig` or a dict of its params.
        extra: free-form provenance (study name, objective values, seed, ...).
    """
    name = controller.display_name()
    try:
        registered = CONTROLLERS.get(name)
    except UnknownNameError:
        registered = None
    if registered is not type(controller):
        raise ValueError(
            f"cannot save {type(controller).__qualname__}: its name {name!r} does not resolve to it in "
            f"the controller registry; register it (CONTROLLERS.register or an "
            f"'adaptive_decoding.controllers' entry point) so that the file can be loaded"
        )
    controller.validate()
    doc: dict[str, Any] = {"controller": name, "params": _plain(controller.get_params(), "params")}
    if decode_config is not None:
        params = decode_config.get_params() if hasattr(decode_config, "get_params") else dict(decode_config)
        doc["decode"] = _plain(params, "decode")
    if extra:
        doc["extra"] = _plain(dict(extra), "extra")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _read(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"controller config {str(path)!r} not found")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ParameterError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(doc, dict) or "controller" not in doc:
        raise ParameterError(
            f"{path}: expected a mapping with keys {', '.join(FORMAT_KEYS)} (at least 'controller'), "
            f"got {type(doc).__name__}"
        )
    unknown = [k for k in doc if k not in FORMAT_KEYS]
    if unknown:
        raise ParameterError(f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(FORMAT_KEYS)}")
    for key in ("params", "decode", "extra"):
        if doc.get(key) is not None and not isinstance(doc[key], dict):
            raise ParameterError(f"{path}: {key!r} must be a mapping, got {doc[key]!r}")
    return doc


def load_controller(path: str | os.PathLike, **overrides: Any) -> Controller:
    """Build the controller saved at ``path``; ``overrides`` replace saved parameters.

    Raises:
        FileNotFoundError: the file does not exist (the message names it).
        ParameterError: the file's name is unknown or its parameters do not validate; the message
            starts with the file and keeps the parameter, the value and the allowed range.
    """
    doc = _read(path)
    name = doc["controller"]
    try:
        cls = CONTROLLERS.get(str(name))
    except UnknownNameError as exc:
        raise ParameterError(f"{path}: {exc}") from None
    params = {**(doc.get("params") or {}), **overrides}
    try:
        return cls.build(**params)  # type: ignore[return-value]
    except ParameterError as exc:
        raise ParameterError(f"{path}: saved {name} config does not validate: {exc}") from None


def load_decode_config(path: str | os.PathLike) -> Optional[dict[str, Any]]:
    """The validated ``decode`` section of a saved controller file, or ``None`` if it has none."""
    from adaptive_decoding.framework.engine.config import MOVED, DecodeConfig

    doc = _read(path)
    section = doc.get("decode")
    if section is None:
        return None
    # a file saved before an option moved off the loop (``lookahead_budget``) still names it: not a loop option
    section = {k: v for k, v in section.items() if k not in MOVED}
    try:
        return DecodeConfig.build(**section).get_params()
    except ParameterError as exc:
        raise ParameterError(f"{path}: saved decode config does not validate: {exc}") from None


def build_controller(name: str, **params: Any) -> Controller:
    """Build a registered controller by name (or ``tuned:PATH`` for an exported YAML)."""
    if name.startswith("tuned:"):
        return load_controller(name[len("tuned:"):], **params)
    cls = CONTROLLERS.get(name)
    return cls.build(**params)  # type: ignore[return-value]


def split_settings(controller_name: str, settings: Mapping[str, Any], *, flag: str = "--set",
                   own_keys: Optional[set[str]] = None, defaults: Optional[dict[str, Any]] = None,
                   ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Split ``key=value`` settings into (the caller's own keys, DecodeConfig keys, controller keys).

    ``own_keys`` are checked first (the lm-eval adapter's options), then the decoding options, then
    the controller's parameters (any key for ``tuned:PATH``, whose YAML decides and
    :func:`build_controller` validates); ``defaults`` seed the decoding options. An unknown key
    raises :class:`ParameterError` naming ``flag``, the key and every allowed key.
    """
    from adaptive_decoding.framework.engine.config import MOVED, DecodeConfig

    cfg_keys = set(DecodeConfig.param_names())
    tuned = controller_name.startswith("tuned:")
    ctrl_keys = None if tuned else set(CONTROLLERS.get(controller_name).param_names())
    own_keys = own_keys or set()
    own: dict[str, Any] = {}
    cfg: dict[str, Any] = dict(defaults or {})
    ctrl: dict[str, Any] = {}
    for key, value in settings.items():
        if key in own_keys:
            own[key] = value
        elif key in cfg_keys or key in MOVED:  # a moved option reaches DecodeConfig.build, which says where it went
            cfg[key] = value
        elif ctrl_keys is None or key in ctrl_keys:
            ctrl[key] = value
        else:
            decoding = f"decoding options: {', '.join(sorted(cfg_keys))}"
            allowed = ([f"adec options: {', '.join(sorted(own_keys))}", decoding] if own_keys
                       else [decoding[0].upper() + decoding[1:]])
            allowed.append(f"{controller_name} parameters: {', '.join(sorted(ctrl_keys)) or '(none)'}")
            raise ParameterError(f"{flag} {key}={value!r}: unknown key. {'; '.join(allowed)}")
    return own, cfg, ctrl
