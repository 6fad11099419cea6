"""The verifier's side of a local sandbox: its uid, the directories only it may use, and how it enters.

A local sandbox's user namespace maps two host uids: the sandbox's own U as root (uid 0, the
agent's sessions) and a second host uid V as `VERIFIER_UID` (the verifier's sessions). T1, as
host root, writes that map itself while bubblewrap waits (`--userns-block-fd`). A verifier
session enters every namespace of the sandbox (same files, processes and loopback network:
tests reach a server the agent started) as `VERIFIER_UID`, keeping only the file capabilities
(`VERIFIER_CAPS`) in the sandbox's user namespace, so it reads and writes the agent's files as a
root verifier in a container would, and nothing outside the sandbox. Whatever the agent runs:
- it cannot signal or ptrace the verifier: another uid, and the agent has no capabilities;
- it can neither read nor write /tests, /logs/verifier and /tmp/.t1-verifier (the toolchain):
  host directories owned by V, mode 0700, bind-mounted at init, so they cannot be replaced or
  renamed (a mount point is busy; their parents are mount points too);
- it cannot ptrace or kill the sandbox's PID 1, which keeps its capabilities (the agent has none).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

VERIFIER_UID = 64999
"""The verifier's uid inside the sandbox (far from the 1000s that task Dockerfiles give their users)."""
VERIFIER_HOME = "/tmp/.t1-verifier"
"""The verifier's toolchain folder (`t1.tasks.toolchain.TOOLCHAIN_DIR`), also its home."""
VERIFIER_DIRS = {"tests": "/tests", "verifier-logs": "/logs/verifier", "verifier": VERIFIER_HOME}
"""Tree directory -> sandbox path, owned by the verifier uid (`tests` is a tree directory already)."""
VERIFIER_CAPS = ("dac_override", "dac_read_search", "fowner", "chown")
"""Capabilities a verifier session keeps, in the sandbox's user namespace only (files mapped in it)."""
PRISTINE_DIR = "/run/t1-pristine"
"""Where an overlay sandbox's pristine system is attached (`t1.sandbox.isolation.pristine`), on a mount point of
bubblewrap's."""
ETC_DIR = "/run/t1-etc"
"""Where a verifier session mounts its private tmpfs for the passwd and group files that name its uid
(`t1.sandbox.verifier.enter_verifier` keeps its own copies of these constants: it runs with the standard library
only)."""


def userns_map(sandbox_uid: int, verifier_uid: int) -> str:
    """The uid_map (and gid_map) of a sandbox's user namespace (pure)."""
    return f"0 {sandbox_uid} 1\n{VERIFIER_UID} {verifier_uid} 1\n"


def write_id_map(pid: int, mapping: str) -> None:
    """Write `mapping` as the uid_map and gid_map of process `pid`'s new user namespace (host root only)."""
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(mapping)


def write_userns_map(pid: int, sandbox_uid: int, verifier_uid: int) -> None:
    """Map the agent and verifier uids in the user namespace of process `pid` (host root only)."""
    write_id_map(pid, userns_map(sandbox_uid, verifier_uid))


def make_verifier_dirs(root: Path, verifier_uid: int | None) -> None:
    """Create the verifier's directories in a tree at `root`, closed to everyone but `verifier_uid`."""
    for name in VERIFIER_DIRS:
        path = root / name
        path.mkdir(exist_ok=True)
        if verifier_uid is not None:
            os.chown(path, verifier_uid, verifier_uid)
            os.chmod(path, 0o700)


def verifier_binds(root: Path, overlay: bool = False) -> list[str]:
    """bubblewrap arguments mounting the verifier's directories (after the tree's own binds; pure).

    With an `overlay` root, also the mount point of its pristine system (`PRISTINE_DIR`).
    """
    argv: list[str] = ["--tmpfs", ETC_DIR]  # a mount point: the agent cannot swap it for a symlink
    if overlay:
        argv += ["--tmpfs", PRISTINE_DIR]
    for name, target in VERIFIER_DIRS.items():
        if name != "tests":  # /tests is bound with the tree's directories
            argv += ["--bind", str(root / name), target]
    return argv


HELPER = str(Path(__file__).with_name("enter_verifier.py"))


def verifier_enter_argv(pid: int, namespaces: tuple[str, ...], inner: list[str], pristine: bool = False) -> list[str]:
    """Run `inner` as the verifier in the namespaces of sandbox init `pid` (pure; see
    `t1.sandbox.verifier.enter_verifier`).

    The helper runs from the host's python as host root and becomes `VERIFIER_UID` right after
    joining the user namespace, so no process of the session is ever the agent's uid. With
    `pristine` (an overlay root) the session's root is built over the pristine system (`t1.sandbox.isolation.pristine`).
    """
    flags = ["--pristine"] if pristine else []
    return [sys.executable, "-I", "-S", HELPER, *flags, str(pid), ",".join(namespaces), ",".join(VERIFIER_CAPS),
            "--", *inner]
