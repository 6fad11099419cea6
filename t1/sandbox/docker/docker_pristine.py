"""The pristine system of a docker sandbox: what its verifier runs, the image as the task's setup left it.

A container's root is an overlay2 mount: the image's layers (and the engine's init layer) below,
the container's writable layer (`UpperDir`) on top. The agent's sessions are the container's
root, so they may replace `/usr/bin/python3`, write `/etc/ld.so.preload` or a `.pth` file, and a
verifier running that system would run the agent's code. So, as on a local overlay sandbox
(`t1.sandbox.isolation.pristine`), the verifier's programs and libraries come from the system as it stood
when the task's setup ended (`Sandbox.end_setup`):

- At end_setup T1 copies the system dirs (`PRISTINE_TOP`) of the container's writable layer, as
  setup left them, to `SETUP_COPY` next to that layer on the host (`cp -a`: owners, modes,
  whiteouts and the overlay's xattrs, so the copy is a valid lower layer). The engine deletes the
  layer's folder, the copy with it, when it removes the container: nothing more to reap.
- A read-only overlay of that copy over the image's own lower layers is made detached on the
  host (`lowerdir+`, one layer per option, so a deep image fits the option size limit) and
  attached at `PRISTINE_DIR` in the container's mount namespace, over a tmpfs mount point the
  container was created with (the agent can neither replace nor unmount it: no capabilities).
  Before setup has ended the overlay is the image's layers alone.
- Verifier sessions build their root from it exactly as on a local sandbox
  (`t1.sandbox.verifier.enter_verifier --pristine`).

Why a copy of the layer and not `docker commit`: both need the overlay2 layer paths to mount the
result for the verifier (the engine mounts an image only as a container's root), and commit tars,
hashes and unpacks the whole writable layer (the task's /app data too), pauses the container and
leaves an image per sandbox to reap; the copy takes only the setup's system-dir writes.
Other storage drivers have no such layers: there the verifier shares the agent's login
(`DockerProvider` says so at start).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t1.sandbox.isolation.mountns import (
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    attach,
    detached_mount,
    mount_thread,
    umount,
)
from t1.sandbox.isolation.pristine import PristineState
from t1.sandbox.verifier.verifier_role import PRISTINE_DIR

OVERLAY2 = "overlay2"
SETUP_COPY = "t1-setup"
PRISTINE_TOP = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt")
"""The system dirs the verifier takes from the pristine system (`t1.sandbox.verifier.enter_verifier.PRISTINE_TOP`)."""


@dataclass(frozen=True, slots=True)
class ContainerLayers:
    """A container's overlay2 layers on the host."""

    upper: Path
    """The container's writable layer (the agent's writes land here)."""
    lowers: tuple[str, ...]
    """The engine's init layer and the image's layers, top first."""

    @property
    def setup_copy(self) -> Path:
        return self.upper.parent / SETUP_COPY


def container_layers(attrs: dict[str, Any]) -> ContainerLayers | None:
    """The overlay2 layers of a container (its inspect attributes), or None on another storage driver (pure)."""
    driver = attrs.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != OVERLAY2 or not data.get("UpperDir") or not data.get("LowerDir"):
        return None
    return ContainerLayers(Path(data["UpperDir"]), tuple(data["LowerDir"].split(":")))


def snapshot_argv(layers: ContainerLayers) -> list[str] | None:
    """`cp -a` of the writable layer's system dirs into the setup copy (pure); None when setup wrote none."""
    present = [str(layers.upper / name) for name in PRISTINE_TOP if os.path.lexists(layers.upper / name)]
    return ["cp", "-a", "--", *present, str(layers.setup_copy)] if present else None


def pristine_overlay(layers: ContainerLayers, sealed: bool) -> int:
    """A read-only overlay of the pristine system, attached nowhere yet; its descriptor (host mount namespace)."""
    top = [str(layers.setup_copy)] if sealed else []
    options = [("lowerdir+", layer) for layer in (*top, *layers.lowers)]
    return detached_mount("overlay", options, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)


class ContainerPristine:
    """The pristine system of one container: attached for the first verifier session, fixed at end_setup."""

    def __init__(self, sandbox_id: str, pid: int, layers: ContainerLayers) -> None:
        self.sandbox_id = sandbox_id
        self.pid = pid
        self.layers = layers
        self.state = PristineState.NONE

    def ensure(self) -> None:
        """Attach the image's system if nothing is attached yet (blocking; before a verifier session)."""
        if self.state is PristineState.NONE:
            self._attach(sealed=False)
            self.state = PristineState.HOST

    def end_setup(self) -> None:
        """Copy the system dirs as setup left them and attach them for the verifier (blocking; once)."""
        if self.state is PristineState.SETUP:
            raise RuntimeError(f"sandbox {self.sandbox_id}: its setup has already ended; the system its verifier "
                               "runs is fixed then, never later (the agent may have written it since)")
        self.layers.setup_copy.mkdir(mode=0o755, exist_ok=True)
        argv = snapshot_argv(self.layers)
        if argv is not None:
            done = subprocess.run(argv, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
            if done.returncode != 0:
                raise RuntimeError(f"sandbox {self.sandbox_id}: cannot copy the system as setup left it "
                                   f"(cp exited {done.returncode}: {done.stderr.strip()[-300:] or 'no output'})")
        self._attach(sealed=True)
        self.state = PristineState.SETUP

    def _attach(self, sealed: bool) -> None:
        fd = pristine_overlay(self.layers, sealed)
        ns = os.open(f"/proc/{self.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        replace = self.state is not PristineState.NONE
        try:
            def place() -> None:
                if replace:
                    umount(PRISTINE_DIR)
                attach(fd, PRISTINE_DIR)
            mount_thread().inside(ns, place)
        finally:
            os.close(ns)
            os.close(fd)
