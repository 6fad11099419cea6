"""The verifier's side of a local sandbox: its uid, the directories only it may use, and how it enters.

A local sandbox's agent sessions run as the sandbox's host uid U, root inside the sandbox's user
namespace. Its verifier sessions run as a second host uid V of their own, entered into the same
mount, PID, network, IPC, UTS and cgroup namespaces (same files, same processes, same loopback:
tests reach a server the agent started) but not into the user namespace. So, whatever the agent
runs:
- it cannot signal or ptrace the verifier: V is another uid, and the agent has no capability in
  the user namespace V belongs to (the host's);
- it can neither read nor write /tests, /logs/verifier and /run/t1-verifier (the toolchain): they
  are host directories owned by V, mode 0700, bind-mounted at init, so they cannot be replaced
  or renamed (a mount point is busy; their parents are mount points too);
- it cannot ptrace or kill the sandbox's PID 1, which keeps its capabilities in the user
  namespace (the agent has none, so the kernel refuses both).
V reads what the agent left (files are world-readable unless the agent made them private) and
writes /tmp and its own directories; it cannot write files the agent owns (see docs/security.md).
"""

from __future__ import annotations

import os
from pathlib import Path

VERIFIER_DIRS = {"tests": "/tests", "verifier-logs": "/logs/verifier", "verifier": "/run/t1-verifier"}
"""Tree directory -> sandbox path, owned by the verifier uid (`tests` is a tree directory already)."""
VERIFIER_HOME = "/run/t1-verifier"
USERNS_FREE = ("mnt", "pid", "net", "ipc", "uts", "cgroup")
"""The namespaces a verifier session enters (everything but the user namespace)."""


def make_verifier_dirs(root: Path, verifier_uid: int | None) -> None:
    """Create the verifier's directories in a tree at `root`, closed to everyone but `verifier_uid`."""
    for name in VERIFIER_DIRS:
        path = root / name
        path.mkdir(exist_ok=True)
        if verifier_uid is not None:
            os.chown(path, verifier_uid, verifier_uid)
            os.chmod(path, 0o700)


def verifier_binds(root: Path) -> list[str]:
    """bubblewrap arguments mounting the verifier's directories (after the tree's own binds; pure)."""
    argv: list[str] = []
    for name, target in VERIFIER_DIRS.items():
        if name != "tests":  # /tests is bound with the tree's directories
            argv += ["--bind", str(root / name), target]
    return argv


def verifier_enter_argv(pid: int, namespaces: tuple[str, ...], verifier_uid: int, inner: list[str]) -> list[str]:
    """Run `inner` as `verifier_uid` in every namespace of sandbox init `pid` but its user namespace (pure).

    `nsenter` runs as host root (entering a child user namespace's mount namespace needs no more);
    `setpriv` then becomes the verifier uid with no groups, no capabilities and `no_new_privs`.
    """
    flags = {"mnt": "--mount", "pid": "--pid", "net": "--net", "ipc": "--ipc", "uts": "--uts", "cgroup": "--cgroup"}
    entered = [flags[name] for name in USERNS_FREE if name in namespaces or name == "mnt"]
    return ["nsenter", "-t", str(pid), *entered, "--root", "--wd", "--",
            "setpriv", f"--reuid={verifier_uid}", f"--regid={verifier_uid}", "--clear-groups",
            "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--", *inner]


def verifier_env(env: dict[str, str]) -> dict[str, str]:
    """A verifier session's environment: the agent's, with a home of its own (pure)."""
    return {**env, "HOME": VERIFIER_HOME, "USER": "t1-verifier", "LOGNAME": "t1-verifier"}
