"""LocalProvider: sandboxes as fresh directory trees served by the embedded SSH server.

`create` makes a tree (with its own host uid when T1 runs as root), registers it with the
embedded server (which starts the sandbox's namespace init), and connects to it over loopback
SSH with the key T1 generated; `destroy` closes the connection, kills every session and the
init (so every process of the sandbox) and deletes the tree.

Every provider on a sandbox root holds the root's lock shared; the first one to start while no
other live provider holds it kills the processes and removes the `sb-*` trees that dead runs
(kill -9) left behind. A sandbox's processes die with T1's process anyway (`t1.sandbox.holders`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
from dataclasses import replace
from pathlib import Path

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.bwrap import SandboxTree, make_tree, remove_tree, sweep_tree
from t1.sandbox.cgroups import CgroupLimits, SandboxCgroups
from t1.sandbox.holders import kill_leftovers
from t1.sandbox.local_server import LocalSshServer, verifier_user
from t1.sandbox.loopback_port import LoopbackPortError, listen_in_namespace
from t1.sandbox.rootfs import ID_COUNT, check_overlay_path, host_masks
from t1.sandbox.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.supervisor_bin import install_private_bash
from t1.sandbox.types import Sandbox, SandboxGone, SandboxRecord, SandboxRequest
from t1.workdir import SharedDirLock

log = logging.getLogger(__name__)

_UID_SLOTS = (1_000_000 // ID_COUNT + 1, 2_000_000_000 // ID_COUNT)
"""A sandbox's uids are slot * ID_COUNT and the ID_COUNT - 1 after it (its user namespace maps them all)."""


def new_sandbox_uid(taken: set[int]) -> int:
    """A base uid for a new sandbox, not in `taken` (which gets it): its ID_COUNT ids are its alone."""
    while (uid := random.randrange(*_UID_SLOTS) * ID_COUNT) in taken:
        pass
    taken.add(uid)
    return uid


def blocking_dir(path: Path) -> Path | None:
    """The directory on the way to `path` that other users cannot search, if any."""
    return next((p for p in [path, *path.parents] if p.exists() and not os.stat(p).st_mode & 0o001), None)


def _check_traversable(path: Path) -> None:
    """Sandbox uids must be able to reach their tree; name the directory that blocks them."""
    if (parent := blocking_dir(path)) is not None:
        raise PermissionError(
            f"sandbox root {path}: directory {parent} is not searchable by other users (needs o+x), "
            "so per-sandbox uids cannot reach their trees; choose another sandbox.local.root or chmod o+x"
        )


def sweep_trees(root: Path) -> int:
    """Kill the processes of, then remove, every sandbox tree under root (call only while no live provider
    uses it); returns how many trees."""
    kill_leftovers(root)  # first: a live holder keeps its tree's mounts busy
    left = [d for d in root.iterdir() if d.name.startswith("sb-") and d.is_dir() and not d.is_symlink()]
    for d in left:
        sweep_tree(d)  # unmounts what a dead overlay run left in this namespace, then deletes
    if left:
        log.warning("removed %d sandbox trees left in %s by a run that did not stop cleanly", len(left), root)
    return len(left)


class LocalProvider:
    """The default provider: bubblewrap trees behind an SSH server on 127.0.0.1."""

    survives_coordinator = False
    """The server and the namespace holders live in this process: its death ends every sandbox."""

    def __init__(self, cfg: LocalProviderConfig, shell_cfg: ShellConfig) -> None:
        self.cfg = cfg
        self.shell_cfg = shell_cfg
        self.root = cfg.root.resolve()
        self.server = LocalSshServer(cfg.host, cfg.port)
        self._per_sandbox_uid = os.geteuid() == 0
        self._overlay = cfg.overlay and cfg.bubblewrap and self._per_sandbox_uid
        self._uids: set[int] = set()
        self._sandboxes: dict[str, SshSandbox] = {}
        self._start_lock = asyncio.Lock()
        self._root_lock = SharedDirLock(self.root)
        self._started = False
        self.cgroups: SandboxCgroups | None = None

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            self.root.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(self._root_lock.acquire, lambda: sweep_trees(self.root))
            if self._per_sandbox_uid:
                _check_traversable(self.root)
                await asyncio.to_thread(install_private_bash, self.root)
                self.cgroups = await asyncio.to_thread(SandboxCgroups.create)
            if self._overlay:
                check_overlay_path(self.root)
                await asyncio.to_thread(host_masks, str(self.root))  # the one scan of the host (a few seconds)
            elif self.cfg.overlay and self.cfg.bubblewrap:
                log.warning("sandbox.local.overlay needs T1 running as root; sandboxes get the host's system read-only")
            await self.server.start()
            self._started = True

    def _new_uid(self) -> int | None:
        if not self._per_sandbox_uid:
            return None
        return new_sandbox_uid(self._uids)

    def _storage_mb(self, request: SandboxRequest) -> int:
        storage = self.cfg.storage_mb if request.storage_mb is None else request.storage_mb
        if not 16 <= storage <= self.cfg.max_storage_mb:
            raise ValueError(f"the task asks for storage_mb={storage}; this provider gives 16 to "
                             f"{self.cfg.max_storage_mb} (sandbox.local.max_storage_mb)")
        return storage

    async def create(self, request: SandboxRequest) -> Sandbox:
        await self.start()
        sandbox_id = "sb-" + secrets.token_hex(6)
        procs, verifier_procs = await asyncio.to_thread(self._add_cgroups, sandbox_id, request)
        tree = SandboxTree(
            sandbox_id=sandbox_id, root=self.root / sandbox_id, uid=self._new_uid(),
            allow_network=request.allow_network, limits=self.cfg.limits,
            bubblewrap=self.cfg.bubblewrap, env=request.env, verifier_uid=self._new_uid(),
            cgroup_procs=procs, verifier_cgroup_procs=verifier_procs,
            overlay=self._overlay, storage_mb=self._storage_mb(request), verifier_storage_mb=self.cfg.verifier_storage_mb,
        )
        await asyncio.to_thread(make_tree, tree)
        endpoint = SshEndpoint(
            host=self.server.host, port=self.server.port, user=sandbox_id,
            client_keys=(self.server.client_key,), host_keys=(self.server.host_key.convert_to_public(),),
        )
        try:
            await self.server.start_sandbox(tree)
            sandbox = await SshSandbox.connect(sandbox_id, endpoint, self.shell_cfg,
                                               verifier=replace(endpoint, user=verifier_user(sandbox_id)),
                                               on_end_setup=lambda: self.server.end_setup(sandbox_id),
                                               record=("local", {"root": str(self.root)}))
        except BaseException:
            await self._forget(tree)
            raise
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    async def reattach(self, record: SandboxRecord) -> Sandbox:
        """Never possible here: a local sandbox died with the coordinator that made it (`survives_coordinator`)."""
        raise SandboxGone(f"sandbox {record.sandbox_id}: the local provider's sandboxes end with the coordinator "
                          "that created them")

    def _add_cgroups(self, sandbox_id: str, request: SandboxRequest) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The sandbox's and its verifier's cgroups, limited by the task's request or the config's defaults."""
        if self.cgroups is None:
            return (), ()
        limits = self.cfg.limits
        cg = CgroupLimits(memory_mb=request.memory_mb or limits.sandbox_memory_mb, pids=limits.max_processes,
                          cpus=request.cpus or limits.sandbox_cpus)
        return self.cgroups.add(sandbox_id, cg), self.cgroups.add(sandbox_id + "-verifier", cg)

    def tree(self, sandbox_id: str) -> SandboxTree:
        """The tree of a live sandbox."""
        return self.server.trees[sandbox_id]

    def host_path(self, sandbox_id: str, name: str) -> Path:
        """Where T1 reaches tree dir `name` (`app`, `logs`, ...) of a live sandbox (tests and provisioning may read it)."""
        return self.server.host_path(sandbox_id, name)

    async def listen_inside(self, sandbox_id: str, port: int) -> socket.socket:
        """A socket listening on 127.0.0.1:`port` in the sandbox's own network namespace, held by T1
        (`t1.sandbox.loopback_port`): a harness's gateway that only this sandbox reaches."""
        tree = self.server.trees.get(sandbox_id)
        if tree is None:
            raise LoopbackPortError(f"sandbox {sandbox_id} is not live")
        target = await self.server.ns_target(tree)
        if target is None or "net" not in target.namespaces:
            raise LoopbackPortError(f"sandbox {sandbox_id} shares T1's network (sandbox.local.bubblewrap is off): "
                                     "a gateway there would be reachable from outside it")
        return await asyncio.to_thread(listen_in_namespace, target.pid, port)

    async def _forget(self, tree: SandboxTree) -> None:
        await self.server.end_sandbox(tree.sandbox_id)
        self.server.trees.pop(tree.sandbox_id, None)
        await asyncio.to_thread(remove_tree, tree)
        self._uids.difference_update({tree.uid, tree.verifier_uid})
        if self.cgroups is not None:  # rmdir of a v1 cgroup can take tens of ms: off the event loop
            for name in (tree.sandbox_id, tree.sandbox_id + "-verifier"):
                await asyncio.to_thread(self.cgroups.remove, name)

    async def destroy(self, sandbox: Sandbox) -> None:
        ssh_sandbox = self._sandboxes.pop(sandbox.id, None)
        if ssh_sandbox is not None:
            await ssh_sandbox.close()
        tree = self.server.trees.get(sandbox.id)
        if tree is not None:
            await self._forget(tree)

    async def close(self) -> None:
        for sandbox in list(self._sandboxes.values()):
            await self.destroy(sandbox)
        await self.server.close()
        self._root_lock.release()
        if self.cgroups is not None:
            self.cgroups.close()
            self.cgroups = None
        self._started = False
