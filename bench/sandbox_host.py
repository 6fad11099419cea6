"""The embedded sandbox SSH server in a process of its own, and the provider that reaches it over SSH.

In production the sandboxes' sshd runs on other machines, so the load benchmark keeps the
embedded server (t1.sandbox.local.local_server, every session in bubblewrap) out of the coordinator's
process: `python -m bench.sandbox_host --root DIR` serves trees it creates on request, and
`HostedProvider` (a SandboxProvider) asks it for a tree, then connects with the real SshSandbox,
exactly as the ssh provider reaches a cloud VM. Control lines on the child's stdin/stdout:

    -> {"port": P, "client_key": PEM, "host_key": PUB}    once, at start
    <- create [overlay]       -> {"id": "sb-..."}
    <- destroy sb-...         -> {"ok": true}

`create overlay` gives the sandbox a copy-on-write root (`t1.sandbox.isolation.rootfs`), plain `create`
the read-only system. Running as root over a root directory other users can search, both get a
uid range of their own, as the local provider gives them; otherwise every sandbox runs as this
process's uid and `create overlay` is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import asyncssh

from t1.config.sandbox import LimitsConfig, ShellConfig
from t1.sandbox.isolation.bwrap import SandboxTree, make_tree, remove_tree
from t1.sandbox.local.local_host import blocking_dir, new_sandbox_uid
from t1.sandbox.local.local_server import LocalSshServer
from t1.sandbox.ssh.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.types import LOCAL_TRAITS, Sandbox, SandboxRequest

# -- the child process --------------------------------------------------------------------------


async def _serve(root: Path, bubblewrap: bool) -> None:
    server = LocalSshServer("127.0.0.1", 0)
    await server.start()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)
    own_uids = os.geteuid() == 0 and blocking_dir(root) is None  # else every sandbox runs as this uid
    uids: set[int] = set()
    out = sys.stdout
    hello = {"port": server.port, "client_key": server.client_key.export_private_key().decode(),
             "host_key": server.host_key.export_public_key().decode()}
    out.write(json.dumps(hello) + "\n")
    out.flush()
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := (await reader.readline()).decode().strip():
            verb, _, arg = line.partition(" ")
            if verb == "create" and arg == "overlay" and not (own_uids and bubblewrap):
                reply = {"error": f"an overlay root needs root, bubblewrap and a root other users can search: {root}"}
            elif verb == "create":
                sid = "sb-" + secrets.token_hex(6)
                uid = new_sandbox_uid(uids) if own_uids else None
                tree = SandboxTree(sandbox_id=sid, root=root / sid, uid=uid, allow_network=False,
                                   limits=LimitsConfig(max_memory_mb=None), bubblewrap=bubblewrap,
                                   overlay=arg == "overlay" and bubblewrap, storage_mb=1024)
                make_tree(tree)
                server.trees[sid] = tree
                reply: dict[str, object] = {"id": sid}
            elif verb == "destroy":
                await server.end_sandbox(arg)  # its namespace holder and every session process
                gone = server.trees.pop(arg, None)
                if gone is not None:
                    remove_tree(gone)
                    uids.discard(gone.uid or 0)
                reply = {"ok": gone is not None}
            else:
                reply = {"error": f"unknown control line {line!r}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
    finally:
        for tree in list(server.trees.values()):
            remove_tree(tree)
        await server.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Embedded sandbox SSH server for load tests (control on stdin).")
    p.add_argument("--root", type=Path, required=True, help="where sandbox trees are created")
    p.add_argument("--no-bubblewrap", action="store_true", help="run sessions without bubblewrap")
    args = p.parse_args(argv)
    from t1.rpc.loop import run

    run(_serve(args.root, not args.no_bubblewrap))


# -- the parent side ----------------------------------------------------------------------------



def peer_command(argv: list[str], nice: int = 0) -> list[str]:
    """`argv` as a child of the benchmark: at `nice`, and killed when its parent dies (a killed
    benchmark leaves no simulated server or sandbox host running)."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *(["nice", "-n", str(nice)] if nice else []), *argv]

class HostedProvider:
    """SandboxProvider over a `bench.sandbox_host` child: trees there, real SSH connections here."""

    traits = LOCAL_TRAITS

    def __init__(self, root: Path, shell_cfg: ShellConfig, bubblewrap: bool = True,
                 log_file: Path | None = None, nice: int = 0, overlay: bool = False) -> None:
        self.root = root
        self.overlay = overlay
        self.nice = nice  # the host and every sandbox process it starts run at this nice value
        self.log_file = log_file
        self.shell_cfg = shell_cfg
        self.bubblewrap = bubblewrap
        self.proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._endpoint: SshEndpoint | None = None
        self._sandboxes: dict[str, SshSandbox] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        argv = [sys.executable, "-m", "bench.sandbox_host", "--root", str(self.root)]
        if not self.bubblewrap:
            argv.append("--no-bubblewrap")
        argv = peer_command(argv, self.nice)
        stderr = self.log_file.open("ab") if self.log_file is not None else None
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr, limit=1 << 20,
            cwd=str(Path(__file__).resolve().parents[1]))
        if stderr is not None:
            stderr.close()
        hello = await self._read()
        self._endpoint = SshEndpoint(
            host="127.0.0.1", port=int(hello["port"]), user="",
            client_keys=(asyncssh.import_private_key(hello["client_key"]),),
            host_keys=(asyncssh.import_public_key(hello["host_key"]),),
        )

    async def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"sandbox host exited (code {await self.proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"sandbox host: {reply['error']}")
        return reply

    async def _ask(self, line: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        async with self._lock:
            self.proc.stdin.write(line.encode() + b"\n")
            await self.proc.stdin.drain()
            return await self._read()

    async def create(self, request: SandboxRequest, overlay: bool | None = None) -> Sandbox:
        """A new sandbox; with a copy-on-write root when `overlay` (default: the provider's `overlay`)."""
        if self._endpoint is None:
            await self.start()
        assert self._endpoint is not None
        on = self.overlay if overlay is None else overlay
        sid = str((await self._ask("create overlay" if on else "create"))["id"])
        endpoint = SshEndpoint(host=self._endpoint.host, port=self._endpoint.port, user=sid,
                               client_keys=self._endpoint.client_keys, host_keys=self._endpoint.host_keys)
        sandbox = await SshSandbox.connect(sid, endpoint, self.shell_cfg)
        self._sandboxes[sid] = sandbox
        return sandbox

    async def destroy(self, sandbox: Sandbox) -> None:
        ssh = self._sandboxes.pop(sandbox.id, None)
        if ssh is not None:
            await ssh.close()
        await self._ask(f"destroy {sandbox.id}")

    async def close(self) -> None:
        for sandbox in list(self._sandboxes.values()):
            with contextlib.suppress(Exception):
                await sandbox.close()
        self._sandboxes.clear()
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class HostGroup:
    """SandboxProvider over `hosts` sandbox host children, each with a root of its own: a process holds about
    four descriptors per sandbox (its SSH socket, the session's pipes), so past the open-files limit of one
    process the sandboxes are spread over several. Creations go round-robin; a destroy goes to the owner. Each
    host draws its sandboxes' uid ranges on its own: two hosts may give out the same one (a load test does not
    test isolation between sandboxes)."""

    traits = LOCAL_TRAITS

    def __init__(self, root: Path, shell_cfg: ShellConfig, hosts: int, **kwargs: Any) -> None:
        if hosts < 1:
            raise ValueError(f"hosts: {hosts} is not a count of sandbox hosts (at least 1)")
        self.hosts = [HostedProvider(root if hosts == 1 else root / f"host-{i}", shell_cfg, **kwargs)
                      for i in range(hosts)]
        self._next = 0
        self._owner: dict[str, HostedProvider] = {}

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.hosts]

    async def start(self) -> None:
        await asyncio.gather(*(h.start() for h in self.hosts))

    async def create(self, request: SandboxRequest) -> Sandbox:
        host = self.hosts[self._next % len(self.hosts)]
        self._next += 1
        sandbox = await host.create(request)
        self._owner[sandbox.id] = host
        return sandbox

    async def destroy(self, sandbox: Sandbox) -> None:
        await self._owner.pop(sandbox.id).destroy(sandbox)

    async def close(self) -> None:
        await asyncio.gather(*(h.close() for h in self.hosts))


if __name__ == "__main__":
    main()
