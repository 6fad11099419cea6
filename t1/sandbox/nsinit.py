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
from typing import Any

from t1.sandbox.bwrap import NAMESPACE_FLAGS, NamespaceTarget, SandboxTree, host_prefix, init_argv
from t1.sandbox.forker import Child, popen
from t1.sandbox.netns import start_slirp, stop_slirp
from t1.sandbox.verifier_role import write_userns_map

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


def _own_namespaces(pid: int) -> tuple[str, ...]:
    """The namespaces of `pid` that differ from ours (entering one we already share needs host privileges)."""
    return tuple(name for name in NAMESPACE_FLAGS
                 if os.stat(f"/proc/{pid}/ns/{name}").st_ino != os.stat(f"/proc/self/ns/{name}").st_ino)


class SandboxInit:
    """The long-lived bubblewrap that owns one sandbox's namespaces."""

    def __init__(self, tree: SandboxTree, proc: Child, target: NamespaceTarget, network: Child | None = None) -> None:
        self.tree = tree
        self.proc = proc
        self.target = target
        """PID 1 of the sandbox's namespaces (a host pid) and which of them sessions enter."""
        self.network = network
        """The sandbox's slirp4netns when it allows internet."""

    @classmethod
    async def start(cls, tree: SandboxTree) -> SandboxInit:
        """Start the init and return once its namespaces are fully set up (mounts included)."""
        return await asyncio.to_thread(cls._start_blocking, tree)

    @classmethod
    def _start_blocking(cls, tree: SandboxTree) -> SandboxInit:
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe() if tree.verifier_uid is not None else (None, None)
        try:
            proc = popen(
                host_prefix(tree, pty=False, count_processes=tree.verifier_uid is None) + init_argv(tree, info_w, INIT_READY.decode().strip(), block_r),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(info_w,) if block_r is None else (info_w, block_r),
                env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
            )
        finally:
            os.close(info_w)
            if block_r is not None:
                os.close(block_r)
        early = _map_verifier(tree, proc, info_r, block_w) if block_w is not None else b""
        assert proc.stdout is not None and proc.stderr is not None
        with os.fdopen(info_r, "rb") as info_file:
            info = early + info_file.read()  # bwrap closes it once the namespaces exist
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
            ns_pid = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError) as exc:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"sandbox {tree.sandbox_id}: unreadable bubblewrap --info-fd output {info!r}") from exc
        network = None
        if tree.allow_network:
            try:
                network = start_slirp(tree.sandbox_id, ns_pid)
            except BaseException:
                os.kill(ns_pid, signal.SIGKILL)
                proc.wait()
                raise
        return cls(tree, proc, NamespaceTarget(ns_pid, _own_namespaces(ns_pid)), network)

    async def stop(self, on_timeout: Callable[[str], None] | None = None) -> None:
        """Kill the init (and so every process in the sandbox's PID namespace) and wait until it is gone.

        PID 1 of the namespace dies first so that the outer bubblewrap, its parent, reaps it; killed
        the other way round it would be left to the host's init, which may never reap it.
        """
        pid = self.target.pid
        if self.network is not None:
            await asyncio.to_thread(stop_slirp, self.network)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not await wait_pidfd(pid, STOP_TIMEOUT_S) and on_timeout is not None:
            on_timeout(f"sandbox {self.tree.sandbox_id}: namespace init {pid} still alive after SIGKILL")
        try:
            await asyncio.wait_for(wait_exit(self.proc), STOP_TIMEOUT_S)
        except TimeoutError:
            kill_group(self.proc)
            await asyncio.wait_for(wait_exit(self.proc), STOP_TIMEOUT_S)
