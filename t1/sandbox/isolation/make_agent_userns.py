"""Make a local sandbox's inner user namespace for the agent: `python -I -S make_agent_userns.py PID`.

Started by T1 as host root, it joins the user namespace of sandbox init PID (the outer one, which
maps the agent's ids and the verifier's) and its network namespace (where it opens low ports and
ping to every uid, `open_ports`), becomes its root, forks a child that makes a new user namespace under it,
writes that namespace's uid and gid maps from the outer one (only the agent's ids: every sandbox
id but `VERIFIER_UID`, each to itself), prints the child's host pid and waits. The child holds the
namespace until its stdin closes, so T1 opens /proc/PID/ns/user first (`t1.sandbox.isolation.agent_userns`).
Standard library only: it runs with -I -S.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_DUMPABLE = 4
VERIFIER_UID = 64999
ID_COUNT = 65536
INNER_MAP = f"0 0 {VERIFIER_UID}\n{VERIFIER_UID + 1} {VERIFIER_UID + 1} {ID_COUNT - VERIFIER_UID - 1}\n"
"""Every id of the outer namespace's agent range to itself, the verifier's left out."""
SYSCTLS = {"ip_unprivileged_port_start": "0", "ping_group_range": f"0 {ID_COUNT - 1}"}
"""Per network namespace; the group range must be mapped in the outer user namespace."""

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def open_ports(init_pid: int) -> None:
    """Low ports and ping for every uid of the sandbox's network namespace: it belongs to the outer
    user namespace, where the agent's net_bind_service and net_raw do not hold."""
    fd = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY)
    _check(libc.setns(fd, CLONE_NEWNET), "setns into the sandbox's network namespace")
    os.close(fd)
    for name, value in SYSCTLS.items():
        with open(f"/proc/sys/net/ipv4/{name}", "w") as f:
            f.write(value)


def main(argv: list[str]) -> int:
    init_pid = int(argv[0])
    fd = os.open(f"/proc/{init_pid}/ns/user", os.O_RDONLY)
    _check(libc.setns(fd, CLONE_NEWUSER), "setns into the sandbox's user namespace")
    os.close(fd)
    open_ports(init_pid)
    os.setgroups([])  # a new user namespace needs its maker's ids mapped in the parent: the outer root's
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    # The uid change made it undumpable, which gives its /proc files to host root, out of reach in
    # here; dumpable again, they are the outer root's (the agent cannot reach it: another PID namespace).
    _check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    made_r, made_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(made_r)
        os.close(mapped_w)
        try:
            _check(libc.unshare(CLONE_NEWUSER), "unshare a user namespace")
        except OSError as exc:
            print(f"t1 make_agent_userns: {exc}", file=sys.stderr)
            os._exit(1)
        os.write(made_w, b"1")
        os.read(mapped_r, 1)
        sys.stdin.buffer.read()  # hold the namespace until T1 has opened it
        os._exit(0)
    os.close(made_w)
    os.close(mapped_r)
    try:
        if os.read(made_r, 1) != b"1":
            raise OSError("the child made no user namespace")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as f:
                f.write(INNER_MAP)
    except OSError as exc:
        print(f"t1 make_agent_userns: {exc}", file=sys.stderr)
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(child, 9)
            os.waitpid(child, 0)
        return 1
    os.write(mapped_w, b"1")
    print(child, flush=True)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
