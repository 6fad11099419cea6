"""The pristine system of an overlay sandbox: what its verifier runs, out of the agent's reach.

With a copy-on-write root (`t1.sandbox.isolation.rootfs`) the agent may write anything anywhere, so the
verifier must not run the sandbox's system as the agent left it (a planted `/usr/bin/python3`,
`/etc/ld.so.preload`, a `.pth` file in site-packages ...). The system it runs is the sandbox's as
it stood when the task's setup ended (`Sandbox.end_setup`): the setup's own writes (`apt-get
install`, `COPY skills/ /skills/`, `useradd`) are in it, nothing the agent wrote after is.

- When setup ends, T1 copies the sandbox's upper layer to a snapshot (`rootfs.SETUP`) on the
  sandbox's tmpfs, which the agent cannot reach (`snapshot_setup`).
- A read-only overlay of snapshot + the idmapped host root (`rootfs.pristine_mount`) is attached
  at `PRISTINE_DIR` in the sandbox's mount namespace, over a mount point that bubblewrap made (the
  agent can neither replace it nor mount or unmount anything there). Before setup has ended (a
  sandbox whose caller never said so) the overlay has the host masks alone: the host's system.
- Each verifier session builds its root from it (`t1.sandbox.verifier.enter_verifier`): the system dirs
  from the pristine overlay, every other top-level directory (the work areas, `/data`, `/var`, ...)
  from the agent's root, as the agent left them.
"""

from __future__ import annotations

import os
import subprocess
from enum import StrEnum
from pathlib import Path

from t1.sandbox.isolation.forker import popen
from t1.sandbox.isolation.mountns import attach, mount_thread, umount
from t1.sandbox.isolation.rootfs import pristine_mount, snapshot_argv
from t1.sandbox.verifier.verifier_role import PRISTINE_DIR


class PristineState(StrEnum):
    """What the sandbox's pristine overlay holds."""

    NONE = "none"  # not mounted yet
    HOST = "host"  # the host's system with its masks (setup has not ended)
    SETUP = "setup"  # the system as the task's setup left it


def _ns(pid: int, name: str) -> int:
    return os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)


def snapshot_setup(sandbox_id: str, root: Path, outer_pid: int) -> None:
    """Copy the upper layer as setup left it, in the sandbox's outer mount namespace (that of `outer_pid`; blocking)."""
    outer = _ns(outer_pid, "mnt")
    try:
        proc = popen(snapshot_argv(root), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"}, mount_ns=outer)
    finally:
        os.close(outer)
    assert proc.stderr is not None
    try:
        err = proc.stderr.read().decode(errors="replace").strip()
        code = proc.wait()
    finally:
        proc.stderr.close()
    if code != 0:
        raise RuntimeError(f"sandbox {sandbox_id}: cannot snapshot the system as setup left it "
                           f"(cp exited {code}: {err[-300:] or 'no output'}); a full sandbox needs a larger storage_mb")


def mount_pristine(root: Path, outer_pid: int, init_pid: int, state: PristineState, replace: bool) -> None:
    """Attach the pristine overlay for `state` at PRISTINE_DIR in the namespaces of sandbox init `init_pid` (blocking).

    `replace` unmounts the one attached before (the host's, once setup has ended).
    """
    outer, inner, userns = _ns(outer_pid, "mnt"), _ns(init_pid, "mnt"), _ns(init_pid, "user")
    try:
        sealed = state is PristineState.SETUP
        fd = mount_thread().inside(outer, lambda: pristine_mount(root, userns, sealed))
        try:
            def place() -> None:
                if replace:
                    umount(PRISTINE_DIR)
                attach(fd, PRISTINE_DIR)
            mount_thread().inside(inner, place)
        finally:
            os.close(fd)
    finally:
        for fd_ in (outer, inner, userns):
            os.close(fd_)
