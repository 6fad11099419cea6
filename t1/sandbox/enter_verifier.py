"""Enter a local sandbox as its verifier, never passing through the agent's uid: `python -I -S enter_verifier.py PID NS,... -- ARGV`.

Started by T1 as host root (from the host's python, before anything of the sandbox runs), it
joins the namespaces of sandbox init PID (the user namespace first), becomes the verifier uid
at once (keeping its capabilities across the change), gives itself a private copy of the mount
namespace with a passwd entry for the verifier, drops every capability but
`t1.sandbox.verifier_role.VERIFIER_CAPS`, sets no_new_privs, and runs ARGV in the sandbox's
PID namespace, waiting for it and exiting with its status (as nsenter does). At no point is a
process of the session the agent's uid, so the agent can neither signal it nor count against it.
Standard library only: it runs with -I -S.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
NS_FLAGS = {"user": CLONE_NEWUSER, "mnt": CLONE_NEWNS, "pid": 0x20000000, "net": 0x40000000, "ipc": 0x08000000,
            "uts": 0x04000000, "cgroup": 0x02000000}
PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 8, 24, 38, 47
PR_CAP_AMBIENT_RAISE = 2
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
CAP_NUMBERS = {"chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3}
VERIFIER_UID = 64999
VERIFIER_HOME = "/tmp/.t1-verifier"
ETC_DIR = "/run/t1-etc"

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _capset(effective: int, permitted: int, inheritable: int) -> None:
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = (effective >> (32 * i)) & 0xFFFFFFFF
        data[i].permitted = (permitted >> (32 * i)) & 0xFFFFFFFF
        data[i].inheritable = (inheritable >> (32 * i)) & 0xFFFFFFFF
    _check(libc.capset(ctypes.byref(header), data), "capset")


def _read_plain(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def _name_the_verifier() -> None:
    """A private tmpfs with the sandbox's passwd and group plus the verifier, bound over them (this session only)."""
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    _check(libc.mount(b"t1-etc", ETC_DIR.encode(), b"tmpfs", 0, b"size=1m,mode=755"), f"mount {ETC_DIR}")
    entries = {"passwd": f"t1-verifier:x:{VERIFIER_UID}:{VERIFIER_UID}::{VERIFIER_HOME}:/bin/bash\n",
               "group": f"t1-verifier:x:{VERIFIER_UID}:\n"}
    for name, entry in entries.items():
        current = _read_plain(f"/etc/{name}")
        with open(f"{ETC_DIR}/{name}", "wb") as f:
            f.write(current + (b"" if current.endswith(b"\n") or not current else b"\n") + entry.encode())
        _check(libc.mount(f"{ETC_DIR}/{name}".encode(), f"/etc/{name}".encode(), None, MS_BIND, None),
               f"bind /etc/{name}")


def enter(pid: int, namespaces: list[str], keep_caps: list[str]) -> None:
    """Become the verifier inside sandbox init `pid`'s namespaces (see the module docstring)."""
    cwd = os.readlink(f"/proc/{pid}/cwd")
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    order = ["user", *[n for n in namespaces if n != "user"]]  # the user namespace first: it owns the others
    fds = {ns: os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY) for ns in order}
    for ns in order:
        _check(libc.setns(fds[ns], NS_FLAGS[ns]), f"setns {ns}")
        os.close(fds[ns])
    _check(libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep caps")
    os.setgroups([])
    os.setresgid(VERIFIER_UID, VERIFIER_UID, VERIFIER_UID)
    os.setresuid(VERIFIER_UID, VERIFIER_UID, VERIFIER_UID)
    everything = (1 << (last_cap + 1)) - 1
    _capset(everything, everything, 0)
    _check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    _name_the_verifier()
    keep = sum(1 << CAP_NUMBERS[c] for c in keep_caps)
    for cap in range(last_cap + 1):
        if not keep >> cap & 1:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _capset(keep, keep, keep)
    for name in keep_caps:
        _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NUMBERS[name], 0, 0), f"ambient {name}")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.chdir(cwd if os.path.isdir(cwd) else "/")


def main(argv: list[str]) -> int:
    sep = argv.index("--")
    pid, namespaces, keep_caps = int(argv[0]), argv[1].split(","), argv[2].split(",")
    command = argv[sep + 1:]
    try:
        enter(pid, namespaces, keep_caps)
    except OSError as exc:
        print(f"t1 enter_verifier: {exc}", file=sys.stderr)
        return 125
    child = os.fork()  # the PID namespace applies to children
    if child == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"t1 enter_verifier: cannot run {command[0]}: {exc}", file=sys.stderr)
            os._exit(127)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):  # passed on to the session's process
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
