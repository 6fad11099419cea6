"""Local sandbox trees, the bubblewrap init that confines a sandbox, and how sessions enter it.

A tree is a fresh directory with `app/`, `logs/`, `tests/`, `tmp/` and `home/`, owned by a host
uid of its own (when T1 runs as root) so sandboxes cannot touch each other's files or processes
and the process limit counts per sandbox. One long-lived bubblewrap per sandbox (`init_argv`,
run by `t1.sandbox.isolation.nsinit.SandboxInit`) creates its namespaces: its root, its tree at `/app`,
`/logs`, `/tests`, `/tmp` and `/root`, a private PID namespace, a network namespace of its own
(internet through user-mode networking when allowed, `t1.sandbox.isolation.netns`), root in a user
namespace. The root is the host's through a copy-on-write overlay of the sandbox's own when the
tree has `overlay` (`t1.sandbox.isolation.rootfs`: T1 runs as root; writable anywhere, bounded by
`storage_mb`, the tree dirs on the same per-sandbox tmpfs), else the host's system dirs
read-only. Every session enters those namespaces (`enter_argv`) with `no_new_privs`, so all
shells of a sandbox see the same processes and the same loopback network, as the shells of one
VM do. Without an overlay the agent's sessions have no capabilities; with one they keep a
container's root set (`ROOT_CAPS`) in an inner user namespace that does not map the verifier's
uid (`t1.sandbox.isolation.agent_userns`), so those capabilities never reach the verifier's files or processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from t1.config.sandbox import LimitsConfig
from t1.sandbox.isolation.cgroups import join_argv
from t1.sandbox.isolation.holders import HOLDER_NAME
from t1.sandbox.isolation.mountns import umount
from t1.sandbox.isolation.netns import NETWORK_NAMESPACE, network_binds, write_resolv_conf
from t1.sandbox.isolation.rootfs import ROOTFS, separate_system_mounts
from t1.sandbox.isolation.supervisor_bin import supervisor_binds
from t1.sandbox.types import ShellRole
from t1.sandbox.verifier.verifier_env import verifier_env
from t1.sandbox.verifier.verifier_role import (
    make_verifier_dirs,
    verifier_binds,
    verifier_enter_argv,
)

TREE_DIRS = {"app": "/app", "logs": "/logs", "tests": "/tests", "tmp": "/tmp", "home": "/root"}
SYSTEM_DIRS = ("/usr", "/etc", "/opt", "/var", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SFTP_SERVER_PATHS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class SandboxTree:
    """One local sandbox: its id, directory, host uid and what it may do."""

    sandbox_id: str
    root: Path
    uid: int | None
    allow_network: bool
    limits: LimitsConfig
    bubblewrap: bool = True
    env: tuple[tuple[str, str], ...] = ()
    verifier_uid: int | None = None
    """The host uid of the sandbox's verifier sessions (`t1.sandbox.verifier.verifier_role`); None: the agent's."""
    cgroup_procs: tuple[str, ...] = ()
    """`cgroup.procs` files of the sandbox's cgroups (`t1.sandbox.isolation.cgroups`); every process joins them."""
    verifier_cgroup_procs: tuple[str, ...] = ()
    """The same for its verifier sessions (a sibling cgroup with the same limits)."""
    overlay: bool = False
    """A copy-on-write root over the host's on a tmpfs of `storage_mb` (`t1.sandbox.isolation.rootfs`; needs root and
    a uid)."""
    storage_mb: int = 10240
    verifier_storage_mb: int = 1024
    """With `overlay`: each verifier dir is a tmpfs of this size of its own (`rootfs.mount_verifier_storage`)."""

    def host_path(self, name: str) -> Path:
        """Where `name` lives in the mount namespace that holds it (with `overlay`, the sandbox's own)."""
        return self.root / name


def make_tree(tree: SandboxTree) -> None:
    """Create the sandbox's directories, owned by its uid, closed to everyone else.

    With `overlay` only the root is made here, as the mount point of the sandbox's tmpfs, which
    gets the tree dirs (`t1.sandbox.isolation.rootfs.mount_storage`).
    """
    tree.root.mkdir(parents=True, exist_ok=False)
    os.chmod(tree.root, 0o700)
    if tree.overlay:
        if tree.uid is None:
            raise ValueError(f"sandbox {tree.sandbox_id}: an overlay root needs a uid of its own (T1 running as root)")
        os.chown(tree.root, tree.uid, tree.uid)
        return
    for name in TREE_DIRS:
        path = tree.host_path(name)
        path.mkdir()
        if tree.uid is not None:
            os.chown(path, tree.uid, tree.uid)
    os.chmod(tree.host_path("tmp"), 0o1777)
    make_verifier_dirs(tree.root, tree.verifier_uid)
    if tree.allow_network:
        write_resolv_conf(tree.root)
    if tree.uid is not None:
        os.chown(tree.root, tree.uid, tree.uid)


def remove_tree(tree: SandboxTree) -> None:
    sweep_tree(tree.root)


def sweep_tree(root: Path) -> None:
    """Remove a sandbox tree, live run's or dead run's: unmount whatever this namespace has mounted
    under it (an overlay sandbox's mounts live in its own namespace and die with it; this catches
    any left in ours), deepest first, then delete the files."""
    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    for point in sorted((p for p in points if p == prefix[:-1] or p.startswith(prefix)), key=len, reverse=True):
        with contextlib.suppress(OSError):
            umount(point)
    shutil.rmtree(root, ignore_errors=True)


def find_sftp_server() -> str:
    for path in SFTP_SERVER_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"no sftp-server binary found (looked in {', '.join(SFTP_SERVER_PATHS)}); install "
                            "openssh-sftp-server")


def _readonly_root_args() -> list[str]:
    """The host's system dirs, read-only, on bubblewrap's own empty root (remounted read-only at the end)."""
    argv: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def _overlay_root_args(tree: SandboxTree) -> list[str]:
    """The sandbox's overlay as its root (`t1.sandbox.isolation.rootfs`), writable; bubblewrap waits on its
    userns block fd while T1 maps the user namespace's ids and mounts the overlay."""
    argv = ["--bind", str(tree.host_path(ROOTFS)), "/"]
    for path in separate_system_mounts():  # not in the overlay's lower layer
        argv += ["--ro-bind", path, path]
    return argv


def bwrap_argv(tree: SandboxTree, inner: list[str], info_fd: int | None = None, as_pid_1: bool = False,
               userns_block_fd: int | None = None) -> list[str]:
    """The bubblewrap command line confining `inner` to `tree` (pure); `info_fd` gets its namespace info.

    With `as_pid_1`, `inner` is PID 1 of the new PID namespace itself (it must reap orphans). With
    `userns_block_fd`, bubblewrap waits on it for the caller to write the user namespace's uid and
    gid maps (`t1.sandbox.verifier.verifier_role.write_userns_map`) instead of writing its own.
    """
    argv = ["bwrap", "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent"]
    argv += NETWORK_NAMESPACE
    argv += _overlay_root_args(tree) if tree.overlay else _readonly_root_args()
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
    for name, target in TREE_DIRS.items():
        argv += ["--bind", str(tree.host_path(name)), target]
    argv += (
        verifier_binds(tree.root, tree.overlay)
        + network_binds(tree.root, tree.allow_network)
        + supervisor_binds(tree.root)
    )
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if userns_block_fd is not None:
        argv += ["--userns-block-fd", str(userns_block_fd)]
    if as_pid_1:
        # PID 1 keeps its capabilities in the user namespace; sessions drop theirs (or, with an
        # overlay, live in an inner user namespace), so the kernel refuses them ptrace and signals to it.
        argv += ["--as-pid-1", "--cap-add", "ALL"]
    argv += ["--chdir", "/app"] + ([] if tree.overlay else ["--remount-ro", "/"]) + ["--"]
    return argv + inner


HOLDER_SCRIPT = 'echo {ready}; while read -r -u {lifeline} _; do :; done'
"""PID 1 of a sandbox: bash blocked reading T1's lifeline pipe (`t1.sandbox.isolation.holders`), which ends
when T1's process does, kill -9 included: bash then exits and the kernel kills the whole PID
namespace. Bash reaps every child in its SIGCHLD handler, orphans included, so it serves as the
namespace's init by itself; bubblewrap's own init plus a `sleep` would be one host task more per
sandbox, and every pivot_root on the host (two per sandbox start) walks all host tasks."""


def init_argv(tree: SandboxTree, info_fd: int, ready: str, lifeline_fd: int,
              userns_block_fd: int | None = None) -> list[str]:
    """The sandbox's init: prints `ready` once every mount is in place, then holds the namespaces and reaps
    orphans until `lifeline_fd` (inherited at that number) reads end-of-file. Its last argument names
    its tree, so a sweep finds it (`t1.sandbox.isolation.holders.kill_leftovers`)."""
    script = HOLDER_SCRIPT.format(ready=ready, lifeline=lifeline_fd)
    return bwrap_argv(tree, ["/bin/bash", "--norc", "--noprofile", "-c", script, HOLDER_NAME, str(tree.root)],
                      info_fd, as_pid_1=True, userns_block_fd=userns_block_fd)


NAMESPACE_FLAGS = {"user": "--user", "mnt": "--mount", "pid": "--pid", "net": "--net", "ipc": "--ipc",
                   "uts": "--uts", "cgroup": "--cgroup"}


@dataclass(frozen=True, slots=True)
class NamespaceTarget:
    """Where sessions of a sandbox go: the host pid of its init and the namespaces it does not share with T1."""

    pid: int
    namespaces: tuple[str, ...]
    """Names under /proc/PID/ns (`user`, `mnt`, ...); a shared one (the host network) is not entered."""
    agent_userns: str | None = None
    """With an overlay root: the path of the agent's inner user namespace (`t1.sandbox.isolation.agent_userns`),
    which agent sessions enter instead of the init's, as its root."""


ROOT_CAPS = ("chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap", "setfcap",
             "net_bind_service", "net_raw", "sys_chroot", "audit_write")
"""What the sandbox's root keeps with an overlay root: a container engine's default set (useradd, chown,
su/runuser, apt's privilege drop need them). They act only in the agent's inner user namespace
(`t1.sandbox.isolation.agent_userns`): on the uids it maps (not the verifier's) and the namespaces it owns
(none of the sandbox's: those belong to the init's); no CAP_SYS_ADMIN, no ptrace."""


def root_caps(target: NamespaceTarget) -> str:
    """setpriv's bounding set for agent sessions: the container set in an inner user namespace, else none."""
    return "-all" + "".join(f",+{cap}" for cap in ROOT_CAPS) if target.agent_userns is not None else "-all"


def enter_argv(target: NamespaceTarget, inner: list[str]) -> list[str]:
    """Run `inner` as an agent session in the namespaces of `target` (pure).

    Without an inner user namespace the credentials are kept (the sandbox uid is root inside its
    user namespace). With one, nsenter runs as host root: it joins the init's mount, PID and other
    namespaces first (they belong to the init's user namespace, where the agent has no
    capabilities), then the inner user namespace, and becomes its uid 0 there. Either way the
    capabilities are cut down to `root_caps` (a setpriv bounding set) and `no_new_privs` is set,
    as bubblewrap does for the processes it starts. The cwd is the init's, `/app`.
    """
    if target.agent_userns is None:
        flags = [NAMESPACE_FLAGS[name] for name in target.namespaces] + ["--preserve-credentials"]
    else:
        flags = [f"--user={target.agent_userns}" if name == "user" else NAMESPACE_FLAGS[name]
                 for name in target.namespaces]
    return ["nsenter", "-t", str(target.pid), *flags, "--root", "--wd", "--",
            "setpriv", "--no-new-privs", "--inh-caps=-all", f"--bounding-set={root_caps(target)}", "--", *inner]


def _inner_command(command: str | None, subsystem: str | None, pty: bool) -> list[str]:
    if subsystem == "sftp":
        return [find_sftp_server()]
    if subsystem is not None:
        raise ValueError(f"unsupported SSH subsystem {subsystem!r}")
    if command is not None:
        return ["/bin/bash", "-c", command]
    return ["/bin/bash", "--login", "-i"] if pty else ["/bin/bash", "--login"]


def session_env(tree: SandboxTree, term: str | None) -> dict[str, str]:
    env = {"PATH": SANDBOX_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
           "LANG": "C.UTF-8", "TERM": term or "dumb"}
    if not tree.bubblewrap:
        env["HOME"] = str(tree.host_path("home"))
    env.update(dict(tree.env))
    return env


def host_prefix(tree: SandboxTree, pty: bool, verifier: bool = False, as_uid: bool = True,
                count_processes: bool = True) -> list[str]:
    """Host-side wrappers that start every sandbox process (pure).

    The sandbox's cgroups (or, for `verifier`, its verifier's), resource limits (`prlimit`), the
    sandbox's own uid with no supplementary groups (`setpriv`; not with `as_uid=False`: the
    verifier's helper and an inner user namespace's nsenter start as host root and switch uid
    themselves), and for a PTY session a new session with the terminal as its controlling tty
    (`setsid --ctty`). Doing this with small programs instead of a Python pre-exec hook lets the
    spawn use vfork: forking a large coordinator process would copy its page tables while
    holding the GIL. `count_processes=False` leaves the process limit off (the sandbox's init).
    """
    limits = tree.limits
    argv = join_argv(tree.verifier_cgroup_procs if verifier else tree.cgroup_procs)
    argv += ["setsid", "--ctty"] if pty else []
    argv.append("prlimit")
    if limits.max_file_mb is not None:
        fsize = limits.max_file_mb * 1024 * 1024
        argv.append(f"--fsize={fsize}:{fsize}")
    if limits.max_memory_mb is not None:
        mem = limits.max_memory_mb * 1024 * 1024
        argv.append(f"--as={mem}:{mem}")
    # Counted per uid and user namespace, so only meaningful with a uid per sandbox. Not on the init:
    # its limit would bound every process of its user namespace, the verifier's too (its pids cgroup does).
    if tree.uid is not None and count_processes:
        argv.append(f"--nproc={limits.max_processes}:{limits.max_processes}")
    if tree.uid is not None and as_uid:
        argv += ["--", "setpriv", f"--reuid={tree.uid}", f"--regid={tree.uid}", "--clear-groups"]
    return [*argv, "--"]


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one SSH session's process for a tree."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    new_session: bool
    """Start the process in a new session (a PTY session gets one from `setsid --ctty` instead)."""


def session_launch(
    tree: SandboxTree, command: str | None, subsystem: str | None, pty: tuple[str, int, int] | None,
    target: NamespaceTarget | None = None, role: ShellRole = ShellRole.AGENT,
) -> Launch:
    """argv, environment and cwd for one SSH session of `tree`.

    With bubblewrap the session enters the namespaces of the sandbox's init, `target`; a verifier
    session with a verifier uid enters them as that uid, outside the sandbox's user namespace.
    """
    inner = _inner_command(command, subsystem, pty is not None)
    env = session_env(tree, pty[0] if pty else None)
    separate = role is ShellRole.VERIFIER and tree.verifier_uid is not None and tree.bubblewrap
    if tree.bubblewrap:
        if target is None:
            raise ValueError(f"sandbox {tree.sandbox_id}: a bubblewrap session needs the sandbox's init to enter")
        if separate:
            inner = verifier_enter_argv(target.pid, target.namespaces, inner, pristine=tree.overlay)
            env = verifier_env(env)
        else:
            inner = enter_argv(target, inner)
    nested = target is not None and target.agent_userns is not None
    prefix = host_prefix(tree, pty is not None, verifier=separate, as_uid=not (separate or nested))
    return Launch(prefix + inner, env, None if tree.bubblewrap else str(tree.host_path("app")), pty is None)
