"""Processes of local sandboxes: the per-sandbox namespace init, spawning off the event loop, pidfd waits.

Every session of one local sandbox shares one set of namespaces, as the shells of one VM do.
`SandboxInit` starts a long-lived bubblewrap over the sandbox's tree whose only job is to hold
its user, mount, PID, network, IPC, UTS and cgroup namespaces (its PID 1 there, a bash blocked
on a pipe, also reaps orphans; see `t1.sandbox.bwrap.HOLDER_SCRIPT`); sessions enter them with
`nsenter` (`t1.sandbox.bwrap.enter_argv`). Killing the init kills its PID namespace and with it every process of the sandbox.

`spawn` starts a process off the loop (a start that waits for the exec must not stall it) and
`wait_exit` waits for a process through a pidfd on the loop, without a waiter thread per process.
Every start happens in the `t1.sandbox.forker` thread, whose file table is nearly empty, so a
start does not cost time in proportion to the number of live sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from t1.sandbox.bwrap import (
    NAMESPACE_FLAGS,
    TREE_DIRS,
    NamespaceTarget,
    SandboxTree,
    host_prefix,
    init_argv,
)
from t1.sandbox.forker import Child, popen
from t1.sandbox.mountns import mount_thread
from t1.sandbox.rootfs import host_masks, mount_overlay, mount_storage, write_id_maps

INIT_READY = b"t1-sandbox-ready\n"
STOP_TIMEOUT_S = 10.0
HANGUP_GRACE_S = 2.0
async def spawn(argv: list[str], **popen_kwargs: Any) -> Child:
    """Start `argv` (`t1.sandbox.forker.popen` arguments) from a worker thread; the loop keeps running meanwhile."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: popen(argv, **popen_kwargs))


async def wait_pidfd(pid: int, timeout: float | None = None) -> bool:
    """Wait until process `pid` has exited (it need not be our child); False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(done, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def wait_exit(proc: Child) -> int:
    """The exit status of a child started by `spawn`, awaited without blocking the loop."""
    if proc.poll() is None:
        await wait_pidfd(proc.pid)
    return proc.wait()


def kill_group(proc: Child) -> None:
    """SIGKILL the process group `proc` leads (it was started with `start_new_session=True`).

    A group id stays reserved while the group has members, so this is safe after `proc` is reaped.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def _first_child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            first = children.read().split()
    except OSError:
        return None
    return int(first[0]) if first else None


async def hang_up(proc: Child, grace_s: float = HANGUP_GRACE_S) -> None:
    """End a session that `nsenter` (`proc`) started: hang up its shell, then kill what is left.

    The shell gets SIGHUP first (an interactive bash passes it on to its jobs, as when an SSH
    client disconnects from a VM), SIGKILL after `grace_s`; `nsenter` reaps it and exits. Only
    then is the rest of the process group killed: killing `nsenter` before its child would leave
    that child to the host's init, which may never reap it.
    """
    child = _first_child(proc.pid)
    if child is None:  # not entered yet, or no /proc children list: nothing can be orphaned
        kill_group(proc)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGHUP)
    if not await wait_pidfd(proc.pid, grace_s):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        await wait_pidfd(proc.pid, STOP_TIMEOUT_S)
    kill_group(proc)


def _child_pid(tree: SandboxTree, info: bytes) -> int:
    """PID 1 of the sandbox (a host pid), from bubblewrap's --info-fd output."""
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"sandbox {tree.sandbox_id}: unreadable bubblewrap --info-fd output {info!r}") from exc


def _own_namespaces(pid: int) -> tuple[str, ...]:
    """The namespaces of `pid` that differ from ours (entering one we already share needs host privileges)."""
    return tuple(name for name in NAMESPACE_FLAGS
                 if os.stat(f"/proc/{pid}/ns/{name}").st_ino != os.stat(f"/proc/self/ns/{name}").st_ino)


class SandboxInit:
    """The long-lived bubblewrap that owns one sandbox's namespaces."""

    def __init__(self, tree: SandboxTree, proc: Child, target: NamespaceTarget) -> None:
        self.tree = tree
        self.proc = proc
        self.target = target
        """PID 1 of the sandbox's namespaces (a host pid) and which of them sessions enter."""

    def host_path(self, name: str) -> Path:
        """Where T1 reaches the tree dir `name`: with an overlay root, through the namespace holding its tmpfs."""
        if not self.tree.overlay:
            return self.tree.host_path(name)
        return Path(f"/proc/{self.proc.pid}/root{self.tree.host_path(name)}")

    @classmethod
    async def start(cls, tree: SandboxTree) -> SandboxInit:
        """Start the init and return once its namespaces are fully set up (mounts included)."""
        return await asyncio.to_thread(cls._start_blocking, tree)

    @classmethod
    def _start_blocking(cls, tree: SandboxTree) -> SandboxInit:
        if tree.overlay:
            return cls._start_with_overlay(tree)
        info_r, info_w = os.pipe()
        try:
            proc = popen(
                host_prefix(tree, pty=False) + init_argv(tree, info_w, INIT_READY.decode().strip()),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(info_w,),
                env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
            )
        finally:
            os.close(info_w)
        with os.fdopen(info_r, "rb") as info_file:
            info = info_file.read()  # bwrap closes the info fd once the namespaces exist
        return cls._await_ready(tree, proc, info)

    @classmethod
    def _start_with_overlay(cls, tree: SandboxTree) -> SandboxInit:
        """Start the init over a copy-on-write root (`t1.sandbox.rootfs`).

        Its tmpfs is mounted in a new mount namespace that bubblewrap starts in; bubblewrap makes
        the sandbox's user namespace and waits; T1 maps its ids (0..65535 to the tree's range) and
        mounts the overlay, whose lower layer is idmapped through that user namespace; then
        bubblewrap goes on and makes the overlay the sandbox's root.
        """
        masks = host_masks(str(tree.root.parent))
        ns_fd = mount_thread().new_namespace(
            lambda: mount_storage(tree.root, tree.uid or 0, tree.storage_mb, masks, tuple(TREE_DIRS)))
        try:
            proc, info = cls._overlay_handshake(tree, ns_fd)
        finally:
            os.close(ns_fd)  # bubblewrap's outer process now holds the namespace
        return cls._await_ready(tree, proc, info)

    @staticmethod
    def _overlay_handshake(tree: SandboxTree, ns_fd: int) -> tuple[Child, bytes]:
        """Start bubblewrap in `ns_fd`, map its user namespace, mount the overlay, let it go on."""
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        try:
            proc = popen(
                host_prefix(tree, pty=False) + init_argv(tree, info_w, INIT_READY.decode().strip(), block_r),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(info_w, block_r),
                env={"PATH": "/usr/bin:/bin"}, start_new_session=True, mount_ns=ns_fd,
            )
        except BaseException:
            for fd in (info_r, block_w):
                os.close(fd)
            raise
        finally:
            for fd in (info_w, block_r):
                os.close(fd)
        child: int | None = None
        try:
            with os.fdopen(info_r, "rb") as info_file:
                info = info_file.read()  # written before bubblewrap blocks
            child = _child_pid(tree, info)
            write_id_maps(child, tree.uid or 0)
            userns = os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            try:
                mount_thread().inside(ns_fd, lambda: mount_overlay(tree.root, userns))
            finally:
                os.close(userns)
            os.write(block_w, b"1")
        except Exception as exc:
            assert proc.stdout is not None and proc.stderr is not None
            if child is not None:  # still waiting for its parent's go: it would outlive a killed parent
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            proc.kill()
            err = proc.stderr.read().decode(errors="replace").strip()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            raise RuntimeError(f"sandbox {tree.sandbox_id}: its copy-on-write root failed: {exc!r}"
                               f" (bubblewrap: {err or 'no output'}); where the host's kernel or root filesystem"
                               " cannot do this, set sandbox.local.overlay: false") from exc
        finally:
            os.close(block_w)
        return proc, info

    @classmethod
    def _await_ready(cls, tree: SandboxTree, proc: Child, info: bytes) -> SandboxInit:
        assert proc.stdout is not None and proc.stderr is not None
        ready = proc.stdout.readline()  # the inner command runs only after every mount is in place
        proc.stdout.close()
        if ready != INIT_READY:
            proc.kill()
            err = proc.stderr.read().decode(errors="replace").strip()
            proc.wait()
            proc.stderr.close()
            raise RuntimeError(f"sandbox {tree.sandbox_id}: bubblewrap init failed to start: {err or 'no output'}")
        proc.stderr.close()
        try:
            ns_pid = _child_pid(tree, info)
        except RuntimeError:
            proc.kill()
            proc.wait()
            raise
        return cls(tree, proc, NamespaceTarget(ns_pid, _own_namespaces(ns_pid)))

    async def stop(self, on_timeout: Callable[[str], None] | None = None) -> None:
        """Kill the init (and so every process in the sandbox's PID namespace) and wait until it is gone.

        PID 1 of the namespace dies first so that the outer bubblewrap, its parent, reaps it; killed
        the other way round it would be left to the host's init, which may never reap it.
        """
        pid = self.target.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not await wait_pidfd(pid, STOP_TIMEOUT_S) and on_timeout is not None:
            on_timeout(f"sandbox {self.tree.sandbox_id}: namespace init {pid} still alive after SIGKILL")
        try:
            await asyncio.wait_for(wait_exit(self.proc), STOP_TIMEOUT_S)
        except TimeoutError:
            kill_group(self.proc)
            await asyncio.wait_for(wait_exit(self.proc), STOP_TIMEOUT_S)
