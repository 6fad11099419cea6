"""Enter a local sandbox as its verifier, never passing through the agent's uid: `python -I -S enter_verifier.py
[--pristine] PID NS,... CAPS -- ARGV`.

Started by T1 as host root (from the host's python, before anything of the sandbox runs), it
joins the namespaces of sandbox init PID (the user namespace first), becomes the verifier uid
at once (keeping its capabilities across the change), gives itself a private copy of the mount
namespace with a passwd entry for the verifier (with `--pristine`, an overlay sandbox: a root of
its own over the pristine system, `pristine_root`), drops every capability but
`t1.sandbox.verifier.verifier_role.VERIFIER_CAPS`, sets no_new_privs, and runs ARGV in the sandbox's
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
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, AUDIT_ARCH_X86_64 = 22, 2, 0xC000003E
OWN_USERNS_IDS = 65536
"""Ids a container verifier's own user namespace maps to themselves (the sandbox ids, `VERIFIER_UID` among them)."""
DENIED_SYSCALLS = (163, 248, 321, 305, 227, 174, 176, 313, 177, 175, 173, 172, 312, 320, 246, 250, 212, 165, 429, 430,
                   432, 431, 433, 428, 303, 180, 304, 298, 155, 310, 311, 178, 179, 169, 249, 308, 164, 167, 168, 139,
                   156, 166, 272, 134, 323, 136, 442)
"""x86-64 numbers of what the engine's default seccomp profile denies a container without extra capabilities:
acct add_key bpf clock_adjtime clock_settime create_module delete_module finit_module get_kernel_syms
init_module ioperm iopl kcmp kexec_file_load kexec_load keyctl lookup_dcookie mount move_mount fsopen fsmount
fsconfig fspick open_tree name_to_handle_at nfsservctl open_by_handle_at perf_event_open pivot_root
process_vm_readv process_vm_writev query_module quotactl reboot request_key setns settimeofday swapon swapoff
sysfs _sysctl umount2 unshare uselib userfaultfd ustat mount_setattr."""
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
CAP_NUMBERS = {"chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3}
VERIFIER_UID = 64999
VERIFIER_HOME = "/tmp/.t1-verifier"
ETC_DIR = "/run/t1-etc"
PRISTINE_DIR = "/run/t1-pristine"
PRISTINE_TOP = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt")
"""Where programs, libraries, interpreters' modules and the shells' and loader's configuration live:
from the pristine system. Every other top-level directory is the agent's."""
AGENT_HOSTS = "/etc/hosts"
"""Data in /etc that tests of the agent's work read: names it added, and (`_name_the_verifier`) users it made."""
FIRST = ("run", "proc", "dev")
"""Bound before the rest: /run holds the session's own tmpfs (ETC_DIR), which the new root lives in."""

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


def _permitted() -> int:
    """This process's permitted capabilities (all of them in a user namespace just joined; host root's own
    otherwise)."""
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(libc.capget(ctypes.byref(header), data), "capget")
    return data[0].permitted | data[1].permitted << 32


def _read_plain(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def _bind(source: str, target: str, recursive: bool = True) -> None:
    _check(libc.mount(source.encode(), target.encode(), None, MS_BIND | (MS_REC if recursive else 0), None),
           f"bind {source} on {target}")


def _without_verifier(text: bytes) -> bytes:
    """passwd or group lines, less any that name the verifier or its id (the agent may have written them)."""
    keep = [line for line in text.split(b"\n") if line
            and line.split(b":")[0] != b"t1-verifier" and line.split(b":")[2:3] != [str(VERIFIER_UID).encode()]]
    return b"".join(line + b"\n" for line in keep)


def _name_the_verifier(etc: str) -> None:
    """The sandbox's passwd and group with the verifier's own entries, bound over those under `etc` (this session
    only)."""
    entries = {"passwd": f"t1-verifier:x:{VERIFIER_UID}:{VERIFIER_UID}::{VERIFIER_HOME}:/bin/bash\n",
               "group": f"t1-verifier:x:{VERIFIER_UID}:\n"}
    for name, entry in entries.items():
        with open(f"{ETC_DIR}/{name}", "wb") as f:
            f.write(_without_verifier(_read_plain(f"/etc/{name}")) + entry.encode())
        _bind(f"{ETC_DIR}/{name}", f"{etc}/{name}", recursive=False)


def _mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of the sandbox's mount namespace (the one this session copied), in mount order.

    This process joined the sandbox's PID namespace for its children only, so the sandbox's /proc
    has no `self` for it: it reads the init's table (PID 1 there), the same root, the same mounts.
    """
    with open("/proc/1/mountinfo") as mountinfo:
        return [(line.split()[4].replace("\\040", " "), line.split(" - ", 1)[1].split()[0]) for line in mountinfo]


def _system_mounts() -> list[str]:
    """Mount points under the system dirs of the sandbox's root: T1's own (resolv.conf, a system dir on a
    filesystem of its own), since only host root mounts there; shallowest first."""
    points = {point for point, _ in _mounts() if point.split("/")[1] in PRISTINE_TOP}
    return sorted(points, key=lambda p: p.count("/"))


def _setup_made_link(name: str, target: str) -> bool:
    """Whether the system as setup left it has top-level link `name` to `target` (not one the agent made)."""
    try:
        return os.readlink(f"{PRISTINE_DIR}/{name}") == target
    except OSError:
        return False


def _bind_agents_dir(name: str, root: str) -> None:
    """A top-level link the agent made (`/results -> /data/out`): the directory it leads to now, bound at
    `name` in `root`, never a link (one to a file, `/conftest.py -> /app/x.py`, is left out)."""
    real = os.path.realpath(f"/{name}")
    if real == "/" or any(real == d or real.startswith(d + "/") for d in (ETC_DIR, PRISTINE_DIR)):
        return
    try:
        if not stat.S_ISDIR(os.lstat(real).st_mode):
            return
    except OSError:
        return
    os.mkdir(f"{root}/{name}", 0o755)
    _bind(real, f"{root}/{name}")


def pristine_root() -> str:
    """A root for this session: the system dirs from the pristine system, everything else from the agent's root.

    Top-level entries of the agent's root: directories are bound (the work areas, /data, /var,
    with what is mounted in them: /logs/verifier, the toolchain); symbolic links only where the
    system as setup left it has the same link (they resolve in this root); a link the agent made
    to a directory becomes that directory, bound; plain files and the agent's other links are
    left out (a /conftest.py, /setup.py or /pytest.ini at the top, or a link there to a file in
    /app, would steer pytest). /etc's passwd, group and hosts are the agent's (copied; the
    verifier's own entries replaced).
    """
    root = f"{ETC_DIR}/root"
    os.mkdir(root, 0o755)
    names = sorted(set(os.listdir("/")) | set(os.listdir(PRISTINE_DIR)), key=lambda n: (n not in FIRST, n))
    for name in names:
        source = f"{PRISTINE_DIR if name in PRISTINE_TOP else ''}/{name}"
        try:
            st = os.lstat(source)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            if _setup_made_link(name, os.readlink(source)):
                os.symlink(os.readlink(source), f"{root}/{name}")
            else:
                _bind_agents_dir(name, root)
        elif stat.S_ISDIR(st.st_mode):
            os.mkdir(f"{root}/{name}", 0o755)
            _bind(source, f"{root}/{name}")
    for point in _system_mounts():
        if os.path.lexists(root + point):
            _bind(point, root + point)
    try:
        hosts = _read_plain(AGENT_HOSTS)
    except OSError:
        hosts = None
    if hosts is not None and os.path.isfile(root + AGENT_HOSTS):
        with open(f"{ETC_DIR}/hosts", "wb") as f:
            f.write(hosts)
        _bind(f"{ETC_DIR}/hosts", root + AGENT_HOSTS, recursive=False)
    _name_the_verifier(f"{root}/etc")
    return root


def _private_mounts(pristine: bool) -> None:
    """A private tmpfs for the session's files; with `pristine`, a root of its own (`pristine_root`) entered."""
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    _check(libc.mount(b"t1-etc", ETC_DIR.encode(), b"tmpfs", 0, b"size=1m,mode=755"), f"mount {ETC_DIR}")
    if not pristine:
        _name_the_verifier("/etc")
        return
    on_top = [fstype for point, fstype in _mounts() if point == PRISTINE_DIR][-1:]
    if on_top != ["overlay"]:
        raise OSError(f"the sandbox's pristine system is not attached at {PRISTINE_DIR} (found {on_top or 'nothing'})")
    os.chroot(pristine_root())


def _map_writer() -> tuple[int, int]:
    """A child of host root that, told a pid on its pipe, maps uids and gids 0..65535 to themselves in that pid's new
    user namespace (only a writer with CAP_SETUID in the parent namespace may map more than its own id). Forked
    before joining the container's namespaces: its /proc is the host's. Returns (its pid, the pipe to tell it)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(w)
        target = os.read(r, 32).decode().strip()
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{target}/{name}", "w") as f:
                    f.write(f"0 0 {OWN_USERNS_IDS}\n")
        except OSError as exc:
            print(f"t1 enter_verifier: cannot map the verifier's user namespace: {exc}", file=sys.stderr)
            os._exit(1)
        os._exit(0)
    os.close(r)
    return child, w


def _own_userns(writer: tuple[int, int]) -> None:
    """A user namespace of the session's own, made as the verifier uid (so the container's root, uid 0 outside,
    does not own it and has no capability in it): its capabilities stop at the container's files and never
    count in the host's namespace (no `open_by_handle_at` through a file bound from the host)."""
    child, w = writer
    _check(libc.unshare(CLONE_NEWUSER), "unshare user namespace")
    os.write(w, f"{os.getpid()}\n".encode())
    os.close(w)
    _, status = os.waitpid(child, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise OSError("the verifier's user namespace could not be mapped")


def _deny_syscalls() -> None:
    """A seccomp filter denying (EPERM) what the engine's default profile denies a container (`DENIED_SYSCALLS`,
    x86-64; the x32 ABI entirely). Needs no_new_privs, set before."""
    if os.uname().machine != "x86_64":
        return
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH_X86_64), (ret, 0, 0, kill), (ld_abs, 0, 0, 0),
            (jge, len(DENIED_SYSCALLS) + 1, 0, 0x40000000)]
    prog += [(jeq, len(DENIED_SYSCALLS) - i, 0, nr) for i, nr in enumerate(DENIED_SYSCALLS)]
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]

    class _Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]

    filters = (_Filter * len(prog))(*[_Filter(*ins) for ins in prog])
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_Prog(len(prog), filters)), 0, 0), "seccomp")


def enter(pid: int, namespaces: list[str], keep_caps: list[str], pristine: bool = False) -> None:
    """Become the verifier inside sandbox init `pid`'s namespaces (see the module docstring).

    A sandbox with a user namespace (local) is entered through it; a container (docker) has none of its own, so
    the session makes one (`_own_userns`) and gets the engine's seccomp denials (`_deny_syscalls`).
    """
    cwd = os.readlink(f"/proc/{pid}/cwd")
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    container = "user" not in namespaces
    writer = _map_writer() if container else None
    # the user namespace first, where the sandbox has one (it owns the others)
    order = sorted(namespaces, key=lambda name: name != "user")
    fds = {ns: os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY) for ns in order}
    for ns in order:
        _check(libc.setns(fds[ns], NS_FLAGS[ns]), f"setns {ns}")
        os.close(fds[ns])
    _check(libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep caps")
    os.setgroups([])
    os.setresgid(VERIFIER_UID, VERIFIER_UID, VERIFIER_UID)
    os.setresuid(VERIFIER_UID, VERIFIER_UID, VERIFIER_UID)
    if writer is not None:
        _own_userns(writer)
    everything = _permitted() & ((1 << (last_cap + 1)) - 1)
    _capset(everything, everything, 0)
    _check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    _private_mounts(pristine)
    keep = sum(1 << CAP_NUMBERS[c] for c in keep_caps)
    for cap in range(last_cap + 1):
        if not keep >> cap & 1:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _capset(keep, keep, keep)
    for name in keep_caps:
        _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NUMBERS[name], 0, 0), f"ambient {name}")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    os.chdir(cwd if os.path.isdir(cwd) else "/")
    if container:
        _deny_syscalls()


def main(argv: list[str]) -> int:
    pristine = argv[:1] == ["--pristine"]
    argv = argv[1:] if pristine else argv
    sep = argv.index("--")
    pid, namespaces, keep_caps = int(argv[0]), argv[1].split(","), argv[2].split(",")
    command = argv[sep + 1:]
    try:
        enter(pid, namespaces, keep_caps, pristine)
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
