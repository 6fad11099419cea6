"""Processes of local sandboxes: the per-sandbox namespace init, spawning off the event loop, pidfd waits.

Every session of one local sandbox shares one set of namespaces, as the shells of one VM do.
`SandboxInit` starts a long-lived bubblewrap over the sandbox's tree whose only job is to hold
its user, mount, PID, network, IPC, UTS and cgroup namespaces (its PID 1 there, a bash blocked
on T1's lifeline pipe, also reaps orphans; see `t1.sandbox.isolation.bwrap.HOLDER_SCRIPT` and
`t1.sandbox.isolation.holders`); sessions enter them with `nsenter`
(`t1.sandbox.isolation.bwrap.enter_argv`). Killing the init kills its PID namespace and with it
every process of the sandbox.

`spawn` starts a process off the loop (a start that waits for the exec must not stall it) and
`wait_exit` waits for a process through a pidfd on the loop, without a waiter thread per process.
Every start happens in the `t1.sandbox.isolation.forker` thread, whose file table is nearly empty, so a
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

from t1.sandbox.isolation.agent_userns import open_agent_userns, write_outer_map
from t1.sandbox.isolation.bwrap import (
    NAMESPACE_FLAGS,
    TREE_DIRS,
    NamespaceTarget,
    SandboxTree,
    host_prefix,
    init_argv,
)
from t1.sandbox.isolation.forker import Child, popen
from t1.sandbox.isolation.holders import lifeline_fd
from t1.sandbox.isolation.mountns import mount_thread
from t1.sandbox.isolation.netns import start_slirp, stop_slirp, write_resolv_conf
from t1.sandbox.isolation.pristine import PristineState, mount_pristine, snapshot_setup
from t1.sandbox.isolation.rootfs import Mask, host_masks, mount_overlay, mount_storage, mount_verifier_storage
from t1.sandbox.verifier.verifier_role import VERIFIER_DIRS, make_verifier_dirs, write_userns_map

INIT_READY = b"t1-sandbox-ready\n"
STOP_TIMEOUT_S = 10.0
HANGUP_GRACE_S = 2.0
async def spawn(argv: list[str], **popen_kwargs: Any) -> Child:
    """Start `argv` (`t1.sandbox.isolation.forker.popen` arguments) from a worker thread; the loop keeps running
    meanwhile."""
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


def _map_verifier(tree: SandboxTree, proc: Child, info_r: int, block_w: int) -> bytes:
    """Write the sandbox's two-uid user namespace map while bubblewrap waits for it, then let it go on.

    Returns the info-fd bytes read on the way (bwrap's JSON with its child's pid).
    """
    info = b""
    try:
        while b"}" not in info:  # bwrap writes its child's pid, then blocks until the maps exist
            chunk = os.read(info_r, 4096)
            if not chunk:
                break
            info += chunk
        try:
            pid = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            return info  # bwrap failed before its namespaces existed; its error is read below
        assert tree.uid is not None and tree.verifier_uid is not None
        write_userns_map(pid, tree.uid, tree.verifier_uid)
        os.write(block_w, b"1")
        return info
    except OSError as exc:
        proc.kill()
        raise RuntimeError(f"sandbox {tree.sandbox_id}: cannot map the verifier's uid: {exc}") from exc
    finally:
        os.close(block_w)


def _child_pid(tree: SandboxTree, info: bytes) -> int:
    """PID 1 of the sandbox (a host pid), from bubblewrap's --info-fd output."""
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"sandbox {tree.sandbox_id}: unreadable bubblewrap --info-fd output {info!r}") from exc


def _fill_storage(tree: SandboxTree, masks: tuple[Mask, ...]) -> None:
    """In an overlay sandbox's new mount namespace: its tmpfs with the tree and the verifier's dirs."""
    assert tree.uid is not None
    mount_storage(tree.root, tree.uid, tree.storage_mb, masks, tuple(TREE_DIRS))
    make_verifier_dirs(tree.root, tree.verifier_uid)
    if tree.verifier_uid is not None:
        mount_verifier_storage(tree.root, tree.verifier_uid, tree.verifier_storage_mb, tuple(VERIFIER_DIRS))
    if tree.allow_network:
        write_resolv_conf(tree.root)


def _own_namespaces(pid: int) -> tuple[str, ...]:
    """The namespaces of `pid` that differ from ours (entering one we already share needs host privileges)."""
    return tuple(name for name in NAMESPACE_FLAGS
                 if os.stat(f"/proc/{pid}/ns/{name}").st_ino != os.stat(f"/proc/self/ns/{name}").st_ino)


class SandboxInit:
    """The long-lived bubblewrap that owns one sandbox's namespaces."""

    def __init__(self, tree: SandboxTree, proc: Child, target: NamespaceTarget, network: Child | None = None,
                 agent_userns: int | None = None) -> None:
        self.tree = tree
        self.proc = proc
        self.target = target
        """PID 1 of the sandbox's namespaces (a host pid) and which of them sessions enter."""
        self.network = network
        """The sandbox's slirp4netns when it allows internet."""
        self.agent_userns = agent_userns
        """With an overlay root, a descriptor of the agent's inner user namespace
        (`t1.sandbox.isolation.agent_userns`)."""
        self.pristine = PristineState.NONE
        """With an overlay root, what its verifier's system is (`t1.sandbox.isolation.pristine`)."""

    def ensure_pristine(self) -> None:
        """With an overlay root, attach its pristine system if nothing is attached yet (blocking; before a verifier
        session)."""
        if self.tree.overlay and self.pristine is PristineState.NONE:
            mount_pristine(self.tree.root, self.proc.pid, self.target.pid, PristineState.HOST, replace=False)
            self.pristine = PristineState.HOST

    def end_setup(self) -> None:
        """The task's setup is done: from now on the verifier runs the system as it is now (blocking; once).

        Without an overlay root the system is the host's, read-only: nothing to do.
        """
        if not self.tree.overlay:
            return
        if self.pristine is PristineState.SETUP:
            raise RuntimeError(f"sandbox {self.tree.sandbox_id}: its setup has already ended; the system its verifier "
                               "runs is fixed then, never later (the agent may have written it since)")
        snapshot_setup(self.tree.sandbox_id, self.tree.root, self.proc.pid)
        mount_pristine(self.tree.root, self.proc.pid, self.target.pid, PristineState.SETUP,
                       replace=self.pristine is PristineState.HOST)
        self.pristine = PristineState.SETUP

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
        block_r, block_w = os.pipe() if tree.verifier_uid is not None else (None, None)
        lifeline = lifeline_fd()
        try:
            proc = popen(
                host_prefix(tree, pty=False, count_processes=tree.verifier_uid is None)
                + init_argv(tree, info_w, INIT_READY.decode().strip(), lifeline, block_r),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(info_w, lifeline) if block_r is None else (info_w, lifeline, block_r),
                env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
            )
        finally:
            os.close(info_w)
            if block_r is not None:
                os.close(block_r)
        early = _map_verifier(tree, proc, info_r, block_w) if block_w is not None else b""
        with os.fdopen(info_r, "rb") as info_file:
            info = early + info_file.read()  # bwrap closes it once the namespaces exist
        return cls._await_ready(tree, proc, info)

    @classmethod
    def _start_with_overlay(cls, tree: SandboxTree) -> SandboxInit:
        """Start the init over a copy-on-write root (`t1.sandbox.isolation.rootfs`).

        Its tmpfs is mounted in a new mount namespace that bubblewrap starts in; bubblewrap makes
        the sandbox's user namespace and waits; T1 maps its ids (`t1.sandbox.isolation.agent_userns.outer_map`) and
        mounts the overlay, whose lower layer is idmapped through that user namespace; then
        bubblewrap goes on and makes the overlay the sandbox's root.
        """
        masks = host_masks(str(tree.root.parent))
        ns_fd = mount_thread().new_namespace(lambda: _fill_storage(tree, masks))
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
        lifeline = lifeline_fd()
        try:
            proc = popen(
                host_prefix(tree, pty=False, count_processes=False)
                + init_argv(tree, info_w, INIT_READY.decode().strip(), lifeline, block_r),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(info_w, lifeline, block_r),
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
            assert tree.uid is not None and tree.verifier_uid is not None
            write_outer_map(child, tree.uid, tree.verifier_uid)
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
        network = None
        agent_userns = None
        try:
            if tree.allow_network:
                network = start_slirp(tree.sandbox_id, ns_pid)
            if tree.overlay:
                agent_userns = open_agent_userns(tree.sandbox_id, ns_pid)
        except BaseException:
            os.kill(ns_pid, signal.SIGKILL)
            proc.wait()
            if network is not None:
                stop_slirp(network)
            raise
        userns_path = None if agent_userns is None else f"/proc/{os.getpid()}/fd/{agent_userns}"
        target = NamespaceTarget(ns_pid, _own_namespaces(ns_pid), userns_path)
        return cls(tree, proc, target, network, agent_userns)

    async def stop(self, on_timeout: Callable[[str], None] | None = None) -> None:
        """Kill the init (and so every process in the sandbox's PID namespace) and wait until it is gone.

        PID 1 of the namespace dies first so that the outer bubblewrap, its parent, reaps it; killed
        the other way round it would be left to the host's init, which may never reap it.
        """
        pid = self.target.pid
        if self.network is not None:
            await asyncio.to_thread(stop_slirp, self.network)
        if self.agent_userns is not None:
            os.close(self.agent_userns)
            self.agent_userns = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not await wait_pidfd(pid, STOP_TIMEOUT_S) and on_timeout is not None:
            on_timeout(f"sandbox {self.tree.sandbox_id}: namespace init {pid} still alive after SIGKILL")
        try:
            await asyncio.wait_for(wait_exit(self.proc), STOP_TIMEOUT_S)
        except TimeoutError:
            kill_group(self.proc)
            await asyncio.wait_for(wait_exit(self.proc), STOP_TIMEOUT_S)
