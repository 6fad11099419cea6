"""Local sandbox trees and the bubblewrap command line that confines each session to one tree.

A tree is a fresh directory with `app/`, `logs/`, `tests/`, `tmp/` and `home/`, owned by a host
uid of its own (when T1 runs as root) so sandboxes cannot touch each other's files or processes
and the process limit counts per sandbox. Inside bubblewrap the session sees the host's system
read-only, its tree at `/app`, `/logs`, `/tests`, `/tmp` and `/root`, a private PID namespace,
no network unless allowed, and appears as root in a user namespace.
"""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
import termios
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from t1.config.sandbox import LimitsConfig

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

    def host_path(self, name: str) -> Path:
        return self.root / name


def make_tree(tree: SandboxTree) -> None:
    """Create the sandbox's directories, owned by its uid, closed to everyone else."""
    tree.root.mkdir(parents=True, exist_ok=False)
    os.chmod(tree.root, 0o700)
    for name in TREE_DIRS:
        path = tree.host_path(name)
        path.mkdir()
        if tree.uid is not None:
            os.chown(path, tree.uid, tree.uid)
    os.chmod(tree.host_path("tmp"), 0o1777)
    if tree.uid is not None:
        os.chown(tree.root, tree.uid, tree.uid)


def remove_tree(tree: SandboxTree) -> None:
    shutil.rmtree(tree.root, ignore_errors=True)


def find_sftp_server() -> str:
    for path in SFTP_SERVER_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"no sftp-server binary found (looked in {', '.join(SFTP_SERVER_PATHS)}); install openssh-sftp-server")


def bwrap_argv(tree: SandboxTree, inner: list[str]) -> list[str]:
    """The bubblewrap command line confining `inner` to `tree` (pure)."""
    argv = ["bwrap", "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent"]
    if not tree.allow_network:
        argv.append("--unshare-net")
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
    for name, target in TREE_DIRS.items():
        argv += ["--bind", str(tree.host_path(name)), target]
    argv += ["--chdir", "/app", "--remount-ro", "/", "--"]
    return argv + inner


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


def _preexec_factory(tree: SandboxTree) -> Callable[[bool], Callable[[], None]]:
    limits = tree.limits

    def factory(pty: bool) -> Callable[[], None]:
        def preexec() -> None:
            fsize = limits.max_file_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            if limits.max_memory_mb is not None:
                mem = limits.max_memory_mb * 1024 * 1024
                resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            if tree.uid is not None:  # counted per host uid, so only meaningful with a uid per sandbox
                resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
            if pty:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        return preexec

    return factory


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one SSH session's process for a tree."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    uid: int | None
    preexec: Callable[[bool], Callable[[], None]]


def session_launch(tree: SandboxTree, command: str | None, subsystem: str | None, pty: tuple[str, int, int] | None) -> Launch:
    """argv, environment, cwd, host uid and pre-exec hook for one SSH session of `tree`."""
    inner = _inner_command(command, subsystem, pty is not None)
    env = session_env(tree, pty[0] if pty else None)
    if tree.bubblewrap:
        return Launch(bwrap_argv(tree, inner), env, None, tree.uid, _preexec_factory(tree))
    return Launch(inner, env, str(tree.host_path("app")), tree.uid, _preexec_factory(tree))
