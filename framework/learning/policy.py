"""A learned commit policy: the network, the threshold, and its one-file format.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

import torch

from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.learning.features import FEATURE_NAMES
from adaptive_decoding.framework.learning.nets import KINDS, PolicyNet, WindowPolicyNet, build_net

__all__ = ["Policy", "PolicyFileError", "PolicyNet", "WindowPolicyNet", "load_policy", "save_policy",
           "tiny_policy_file"]

DEFAULT_OUT = Path("runs") / "controllers"
POLICY_FORMAT = "adaptive-decoding.policy"
POLICY_VERSION = 1


# ---------------------------------------------------------------------- the policy and its file
@dataclass
class Policy:
    """A loaded policy file: the network (float64, eval mode) and its header."""

    net: "PolicyNet | WindowPolicyNet"
    kind: str
    threshold: float
    path: str
    meta: dict = field(default_factory=dict)
    #: the columns of :data:`FEATURE_NAMES` this policy reads, in its order (``None``: all of them), so a
    #: policy trained before a feature was added keeps working
    columns: Optional[tuple[int, ...]] = None

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The :data:`FEATURE_NAMES` columns the network reads, in its order."""
        return FEATURE_NAMES if self.columns is None else tuple(FEATURE_NAMES[i] for i in self.columns)

    @property
    def structure(self) -> Optional[dict]:
        """The generation's declared structure the policy was trained with (its peer features read
        it; :func:`adaptive_decoding.framework.models.structure.generation_peers`), ``None`` for none."""
        return self.meta.get("structure") or None

    @torch.no_grad()
    def prob(self, x: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
        """p(safe) for a window of features ``[B, W, F]`` (all of :data:`FEATURE_NAMES`) with its
        eligible mask ``valid`` ``[B, W]`` (per-position kinds ignore it), computed in float64 so
        batching does not change it."""
        net = self.net if self.net.mean.device == x.device else self.net.to(x.device)
        if self.columns is not None:
            x = x[..., list(self.columns)]
        return torch.sigmoid(net(x.double(), valid))


class PolicyFileError(ParameterError):
    """A policy file that exists but is not one this framework wrote (the message names it)."""


def save_policy(net: "PolicyNet | WindowPolicyNet", path: "str | os.PathLike", *, kind: str,
                threshold: float = 0.9,
                meta: Optional[dict] = None) -> Path:
    """Write ``net`` with its header; returns the path. The network reads the columns ``meta["features"]``
    (all of :data:`FEATURE_NAMES` by default) and, for the peer columns, the structure
    ``meta["structure"]``; both travel in the file."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; allowed: {', '.join(KINDS)}")
    if (kind == "transformer") != isinstance(net, WindowPolicyNet):
        raise ValueError(f"kind={kind!r} does not match the network {type(net).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": POLICY_FORMAT, "version": POLICY_VERSION, "kind": kind,
        "feature_names": list((meta or {}).get("features") or FEATURE_NAMES), "arch": net.arch(),
        "state_dict": {k: v.detach().cpu().float() for k, v in net.state_dict().items()},
        "threshold": float(threshold), "meta": json.loads(json.dumps(meta or {}, default=str)),
    }
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(blob, tmp)
    os.replace(tmp, path)
    _load_cached.cache_clear()
    return path


#: policies that ship with the package, loaded by their name (``--set policy=sudoku9-set``)
PACKAGED_POLICIES = Path(__file__).resolve().parent / "policies"


def packaged_policies() -> list[str]:
    """Names of the policies that ship with the package."""
    return sorted(p.stem for p in PACKAGED_POLICIES.glob("*.pt"))


def resolve_policy(path: "str | os.PathLike") -> Path:
    """A policy file: ``path`` itself when it is a file, else the packaged policy of that name;
    FileNotFoundError naming both otherwise."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    packaged = PACKAGED_POLICIES / f"{path}.pt"
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(
        f"policy file {str(path)!r} not found; train one with 'adec train-controller --task TASK' "
        f"(it writes mlp.pt, logreg.pt or transformer.pt under {DEFAULT_OUT}/TASK-MODEL[-dagger|-rl]/), "
        f"or name a packaged policy: {', '.join(packaged_policies()) or '(none)'}")


def load_policy(path: "str | os.PathLike") -> Policy:
    """Read a policy file (or a packaged policy by name); a missing file raises FileNotFoundError, a
    bad one PolicyFileError."""
    p = resolve_policy(path)
    st = p.stat()
    return _load_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=32)
def _load_cached(path: str, mtime_ns: int, size: int) -> Policy:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise PolicyFileError(f"policy file {path!r} cannot be read ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else 'no detail'})") from None
    if not isinstance(blob, dict) or blob.get("format") != POLICY_FORMAT:
        raise PolicyFileError(f"policy file {path!r} is not an {POLICY_FORMAT} file "
                              f"(written by 'adec train-controller')")
    if blob.get("version") != POLICY_VERSION:
        raise PolicyFileError(f"policy file {path!r} has version {blob.get('version')!r}; this framework "
                              f"reads version {POLICY_VERSION}; retrain it with 'adec train-controller'")
    columns = feature_columns(path, blob.get("feature_names", ()))
    try:
        arch = blob["arch"] if "arch" in blob else {"hidden": blob["hidden"]}
        net = build_net(str(blob["kind"]), arch, n_features=len(columns) if columns else len(FEATURE_NAMES))
        net.load_state_dict(blob["state_dict"])
        threshold = float(blob["threshold"])
    except (KeyError, RuntimeError, TypeError, ValueError) as exc:  # build_net names a bad kind
        raise PolicyFileError(f"policy file {path!r} is corrupt ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]})") from None
    return Policy(net=net.double().eval(), kind=str(blob["kind"]), threshold=threshold, path=path,
                  meta=dict(blob.get("meta") or {}), columns=columns)


def feature_columns(path: str, names: "list[str] | tuple[str, ...]") -> Optional[tuple[int, ...]]:
    """Where a policy file's features sit in :data:`FEATURE_NAMES` (``None`` when they are all of them,
    in order); a feature this framework no longer computes is a :class:`PolicyFileError`."""
    names = tuple(names)
    if names == FEATURE_NAMES:
        return None
    unknown = [n for n in names if n not in FEATURE_NAMES]
    if unknown or not names or names[0] != "confidence":
        raise PolicyFileError(f"policy file {path!r} was trained on features {list(names)}; "
                              f"{'unknown: ' + ', '.join(unknown) if unknown else 'confidence must come first'} "
                              f"(this framework computes {list(FEATURE_NAMES)}); retrain it with "
                              f"'adec train-controller'")
    return tuple(FEATURE_NAMES.index(n) for n in names)


_TINY_DIR: list[Path] = []


def tiny_policy_file(kind: str = "mlp", seed: int = 0) -> Path:
    """A small random policy (seeded) in a per-process temporary folder, for conformance checks."""
    import atexit
    import shutil
    import tempfile

    if not _TINY_DIR:
        _TINY_DIR.append(Path(tempfile.mkdtemp(prefix="adec-policy-")))
        atexit.register(shutil.rmtree, str(_TINY_DIR[0]), True)
    path = _TINY_DIR[0] / f"tiny-{kind}-{seed}.pt"
    if not path.is_file():
        gen = torch.Generator().manual_seed(seed)
        net = build_net(kind, {"d_model": 8, "layers": 1, "heads": 2} if kind == "transformer" else
                        {"hidden": (8,)})
        with torch.no_grad():
            for prm in net.parameters():
                prm.copy_(torch.randn(prm.shape, generator=gen))
        save_policy(net, path, kind=kind, threshold=0.5, meta={"note": "random, for conformance tests"})
    return path
