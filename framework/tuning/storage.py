"""Optuna storages from one string: in-memory, SQLite path, journal file, or a database URL.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

from adaptive_decoding.framework.core.params import ParameterError


# ---------------------------------------------------------------------- storage
def open_storage(spec: Any, default_path: "str | os.PathLike | None" = None) -> Any:
    """An Optuna storage from a spec string (see the module docstring) or a storage object."""
    import optuna

    if isinstance(spec, optuna.storages.BaseStorage):
        return spec
    if spec is None or spec == "":
        if default_path is None:
            raise ParameterError("--storage is empty and there is no default SQLite path")
        Path(default_path).parent.mkdir(parents=True, exist_ok=True)
        spec = f"sqlite:///{Path(default_path)}"
    if not isinstance(spec, str):
        raise ParameterError(f"--storage={spec!r} is not a storage; allowed: {storage_forms()}")
    if spec in ("memory", "inmemory", ":memory:"):
        return optuna.storages.InMemoryStorage()
    if spec.startswith("journal:"):
        path = Path(spec[len("journal:"):]).expanduser()
        if not str(path) or str(path) == ".":
            raise ParameterError(f"--storage={spec!r} names no file; allowed: journal:PATH")
        path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if spec.startswith(("redis://", "rediss://")):
        from optuna.storages.journal import JournalRedisBackend

        return optuna.storages.JournalStorage(JournalRedisBackend(spec))
    if "://" in spec:
        kwargs: dict[str, Any] = {}
        if spec.startswith("sqlite"):
            kwargs["engine_kwargs"] = {"connect_args": {"timeout": 300}}
            db = spec.split(":///", 1)[-1]
            if db and db != ":memory:":
                Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        import sqlalchemy.exc

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    spec, heartbeat_interval=30, grace_period=120,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
                    **kwargs,
                )
        except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ImportError) as exc:
            raise ParameterError(f"--storage={redact_url(spec)!r} cannot be opened ({exc}); allowed: "
                                 f"{storage_forms()}") from None
    raise ParameterError(f"--storage={spec!r} is not a storage; allowed: {storage_forms()}")


def storage_forms() -> str:
    return ("memory, journal:PATH, sqlite:///PATH.db, postgresql://USER:PW@HOST/DB, mysql://..., "
            "redis://HOST (journal), or nothing for <out>/<study>.db")


def redact_url(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)
