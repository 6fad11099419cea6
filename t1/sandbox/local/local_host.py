"""LocalSandboxHost: what runs local sandboxes: the embedded SSH server, the trees, their namespace holders,
cgroups and uids.

`create` makes a tree (with its own host uid when T1 runs as root), registers it with the
embedded server (which starts the sandbox's namespace init); `destroy` kills every session and
the init (so every process of the sandbox) and deletes the tree. It lives either in the
coordinator's process (`LocalProvider` without a run dir: tests, the CLI) or in the sandbox
service (`t1.sandbox.local.service`), which outlives the coordinator; `LocalProvider` connects to its
SSH server the same way in both.

Every host on a sandbox root holds the root's lock shared; the first one to start while no other
live host holds it kills the processes and removes the `sb-*` trees that dead runs (kill -9) left
behind. A sandbox's processes die with the host's process anyway (`t1.sandbox.isolation.holders`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from t1.config.sandbox import LocalProviderConfig
from t1.sandbox.isolation.bwrap import NamespaceTarget, SandboxTree, make_tree, remove_tree, sweep_tree
from t1.sandbox.isolation.cgroups import CgroupLimits, SandboxCgroups
from t1.sandbox.isolation.holders import kill_leftovers
from t1.sandbox.isolation.rootfs import ID_COUNT, check_overlay_path, host_masks
from t1.sandbox.isolation.supervisor_bin import install_private_bash
from t1.sandbox.local.local_server import LocalSshServer
from t1.sandbox.types import SandboxGone, SandboxRequest
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
    """Kill the processes of, then remove, every sandbox tree under root (call only while no live host
    uses it); returns how many trees."""
    kill_leftovers(root)  # first: a live holder keeps its tree's mounts busy
    left = [d for d in root.iterdir() if d.name.startswith("sb-") and d.is_dir() and not d.is_symlink()]
    for d in left:
        sweep_tree(d)  # unmounts what a dead overlay run left in this namespace, then deletes
    if left:
        log.warning("removed %d sandbox trees left in %s by a run that did not stop cleanly", len(left), root)
    return len(left)


@dataclass(frozen=True, slots=True)
class SshAccess:
    """How a client reaches the host's SSH server: address, the key it logs in with, the key the server proves."""

    host: str
    port: int
    client_key: asyncssh.SSHKey
    host_key: asyncssh.SSHKey
    """The server's public key."""


class LocalSandboxHost:
    """Bubblewrap trees behind an SSH server on 127.0.0.1 (the local provider's machinery)."""

    def __init__(self, cfg: LocalProviderConfig) -> None:
        self.cfg = cfg
        self.root = cfg.root.resolve()
        self.server = LocalSshServer(cfg.host, cfg.port)
        self._per_sandbox_uid = os.geteuid() == 0
        self._overlay = cfg.overlay and cfg.bubblewrap and self._per_sandbox_uid
        self._uids: set[int] = set()
        self._start_lock = asyncio.Lock()
        self._root_lock = SharedDirLock(self.root)
        self._started = False
        self.cgroups: SandboxCgroups | None = None

    async def start(self) -> SshAccess:
        """Sweep what dead runs left (when alone on the root), then serve; idempotent."""
        async with self._start_lock:
            if not self._started:
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
                    log.warning("sandbox.local.overlay needs T1 running as root; sandboxes get the host's system "
                                "read-only")
                await self.server.start()
                self._started = True
        return SshAccess(self.server.host, self.server.port, self.server.client_key,
                         self.server.host_key.convert_to_public())

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

    async def create(self, request: SandboxRequest) -> str:
        """A new sandbox with its init running, ready for SSH logins; its id."""
        await self.start()
        sandbox_id = "sb-" + secrets.token_hex(6)
        procs, verifier_procs = await asyncio.to_thread(self._add_cgroups, sandbox_id, request)
        tree = SandboxTree(
            sandbox_id=sandbox_id,
            root=self.root / sandbox_id,
            uid=self._new_uid(),
            allow_network=request.allow_network,
            limits=self.cfg.limits,
            bubblewrap=self.cfg.bubblewrap,
            env=request.env,
            verifier_uid=self._new_uid(),
            cgroup_procs=procs,
            verifier_cgroup_procs=verifier_procs,
            overlay=self._overlay,
            storage_mb=self._storage_mb(request),
            verifier_storage_mb=self.cfg.verifier_storage_mb,
        )
        await asyncio.to_thread(make_tree, tree)
        try:
            await self.server.start_sandbox(tree)
        except BaseException:
            await self._forget(tree)
            raise
        return sandbox_id

    def _add_cgroups(self, sandbox_id: str, request: SandboxRequest) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The sandbox's and its verifier's cgroups, limited by the task's request or the config's defaults."""
        if self.cgroups is None:
            return (), ()
        limits = self.cfg.limits
        cg = CgroupLimits(memory_mb=request.memory_mb or limits.sandbox_memory_mb, pids=limits.max_processes,
                          cpus=request.cpus or limits.sandbox_cpus)
        return self.cgroups.add(sandbox_id, cg), self.cgroups.add(sandbox_id + "-verifier", cg)

    def sandbox_ids(self) -> list[str]:
        """The live sandboxes."""
        return list(self.server.trees)

    def tree(self, sandbox_id: str) -> SandboxTree:
        """The tree of a live sandbox (SandboxGone when there is none)."""
        tree = self.server.trees.get(sandbox_id)
        if tree is None:
            raise SandboxGone(f"sandbox {sandbox_id} is not live on this sandbox host (destroyed or swept)")
        return tree

    async def end_setup(self, sandbox_id: str) -> None:
        """The task's setup is done: fix the system the sandbox's verifier runs (`LocalSshServer.end_setup`)."""
        await self.server.end_setup(sandbox_id)

    async def target(self, sandbox_id: str) -> NamespaceTarget | None:
        """The namespaces of a live sandbox's init; None without bubblewrap."""
        return await self.server.ns_target(self.tree(sandbox_id))

    def host_path(self, sandbox_id: str, name: str) -> Path:
        """Where this process reaches tree dir `name` (`app`, `logs`, ...) of a live sandbox."""
        return self.server.host_path(sandbox_id, name)

    async def _forget(self, tree: SandboxTree) -> None:
        await self.server.end_sandbox(tree.sandbox_id)
        self.server.trees.pop(tree.sandbox_id, None)
        await asyncio.to_thread(remove_tree, tree)
        self._uids.difference_update({tree.uid, tree.verifier_uid})
        if self.cgroups is not None:  # rmdir of a v1 cgroup can take tens of ms: off the event loop
            for name in (tree.sandbox_id, tree.sandbox_id + "-verifier"):
                await asyncio.to_thread(self.cgroups.remove, name)

    async def destroy(self, sandbox_id: str) -> None:
        """Kill every process of the sandbox and delete its tree (nothing when it is not live)."""
        tree = self.server.trees.get(sandbox_id)
        if tree is not None:
            await self._forget(tree)

    async def close(self) -> None:
        """Destroy every sandbox, stop serving, release the root and the cgroups."""
        for sandbox_id in self.sandbox_ids():
            await self.destroy(sandbox_id)
        await self.server.close()
        self._root_lock.release()
        if self.cgroups is not None:
            self.cgroups.close()
            self.cgroups = None
        self._started = False
