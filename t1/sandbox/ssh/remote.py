"""Providers for machines T1 does not run itself: a fixed SSH inventory, and create/destroy commands.

`SshProvider` hands out hosts of a fixed inventory one sandbox at a time, verifies host keys
against known_hosts unless the config explicitly turns that off, and runs the reset command when a
sandbox is destroyed. `CommandProvider` runs a configured create command (a cloud CLI wrapper)
that prints JSON `{"id", "host", "port", "user", "key_file"}` and a destroy command with `{id}`
replaced by the sandbox id.

Both survive their coordinator: the machines are not T1's processes. A restarted coordinator
reattaches an inventory host by its name and the lease token its create wrote to the host's
`LEASE_FILE` (a host reset since, or handed to another sandbox, has another token or none), and a command-made
sandbox by the endpoint its create command printed (kept in the record); a machine that no
longer answers, or a host that left the inventory, raises `SandboxGone`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

from t1.config.sandbox import CommandProviderConfig, ShellConfig, SshHost, SshProviderConfig
from t1.errors import InfraError
from t1.sandbox.ssh.ssh_sandbox import SshEndpoint, SshSandbox
from t1.sandbox.types import IMAGE_TRAITS, Sandbox, SandboxGone, SandboxLost, SandboxRecord, SandboxRequest

log = logging.getLogger(__name__)


class NoFreeHost(InfraError):
    """Every host of the inventory is busy or quarantined."""


class SandboxCreateError(InfraError):
    """A create failed; `host` names the machine when the provider knows it (for quarantine)."""

    def __init__(self, message: str, host: str | None = None) -> None:
        super().__init__(message)
        self.host = host


LEASE_FILE = "~/.t1-sandbox-lease"
"""On an inventory host: the token of the sandbox it serves (written at create, removed at destroy)."""


def host_name(host: SshHost) -> str:
    return f"{host.user}@{host.host}:{host.port}"


def check_record(record: SandboxRecord, provider: str, keys: tuple[str, ...]) -> None:
    """`record` is `provider`'s and has `keys` in its data, else SandboxGone naming what is wrong."""
    if record.provider != provider:
        raise SandboxGone(f"sandbox {record.sandbox_id} was made by the {record.provider} provider, "
                          f"not this {provider} one")
    missing = [k for k in keys if not record.data.get(k)]
    if missing:
        raise SandboxGone(f"sandbox record of {record.sandbox_id} lacks {', '.join(missing)}")


class SshProvider:
    """A fixed inventory of hosts; a host serves one sandbox at a time and is reset between tasks."""

    survives_coordinator = True
    traits = IMAGE_TRAITS

    def __init__(self, cfg: SshProviderConfig, shell_cfg: ShellConfig) -> None:
        if not cfg.hosts:
            raise ValueError("sandbox.ssh.hosts: the inventory is empty")
        self.cfg = cfg
        self.shell_cfg = shell_cfg
        self._busy: set[str] = set()
        self._hosts = {host_name(h): h for h in cfg.hosts}
        self.capacity = len(self._hosts)
        """Most sandboxes this provider can have out at once (the pool bounds itself by it)."""
        self.is_quarantined: Callable[[str], bool] = lambda name: False

    def _endpoint(self, host: SshHost) -> SshEndpoint:
        return SshEndpoint(
            host=host.host, port=host.port, user=host.user,
            client_keys=(str(self.cfg.key_file.expanduser()),) if self.cfg.key_file else (),
            known_hosts=str(self.cfg.known_hosts.expanduser()) if self.cfg.known_hosts else None,
            insecure=self.cfg.insecure_skip_host_verification,
        )

    async def create(self, request: SandboxRequest) -> Sandbox:
        free = [n for n in self._hosts if n not in self._busy and not self.is_quarantined(n)]
        if not free:
            raise NoFreeHost(f"all {len(self._hosts)} inventory hosts are busy or quarantined")
        name = free[0]
        self._busy.add(name)
        lease = secrets.token_hex(8)
        try:
            sandbox = await SshSandbox.connect(name, self._endpoint(self._hosts[name]), self.shell_cfg,
                                               record=("ssh", {"host": name, "lease": lease}))
            result = await sandbox.exec(f"umask 077 && printf %s {lease} > {LEASE_FILE}", timeout_s=60)
        except SandboxLost as exc:
            self._busy.discard(name)
            raise SandboxCreateError(str(exc), host=name) from exc
        if result.exit_status != 0:
            await sandbox.close()
            self._busy.discard(name)
            raise SandboxCreateError(f"cannot write the lease file {LEASE_FILE} on {name} (exit {result.exit_status}): "
                                     f"{result.stderr!r}", host=name)
        return sandbox

    async def reattach(self, record: SandboxRecord) -> Sandbox:
        """The inventory host `record` names, reconnected and marked busy (not reset)."""
        check_record(record, "ssh", ("host", "lease"))
        name = record.data["host"]
        if name not in self._hosts:
            raise SandboxGone(f"sandbox {record.sandbox_id}: host {name} is not in this run's inventory "
                              "(sandbox.ssh.hosts)")
        if name in self._busy:
            raise SandboxGone(f"sandbox {record.sandbox_id}: host {name} already serves a sandbox of this coordinator")
        self._busy.add(name)
        try:
            sandbox = await SshSandbox.connect(name, self._endpoint(self._hosts[name]), self.shell_cfg,
                                               record=("ssh", dict(record.data)))
            found = await sandbox.exec(f"cat {LEASE_FILE}", timeout_s=60)
        except SandboxLost as exc:
            self._busy.discard(name)
            raise SandboxGone(f"sandbox {record.sandbox_id}: {exc}") from exc
        if found.exit_status != 0 or str(found.stdout).strip() != record.data["lease"]:
            await sandbox.close()
            self._busy.discard(name)
            raise SandboxGone(f"sandbox {record.sandbox_id}: host {name} was reset or serves another sandbox since "
                              f"(its {LEASE_FILE} is not this sandbox's)")
        return sandbox

    async def destroy(self, sandbox: Sandbox) -> None:
        """Reset the host (the configured command) and free it; a failed reset is reported to the pool."""
        try:
            if isinstance(sandbox, SshSandbox) and sandbox.alive:
                result = await sandbox.exec(f"rm -f {LEASE_FILE}; {self.cfg.reset_command}", timeout_s=120)
                if result.exit_status != 0:
                    raise SandboxCreateError(
                        f"reset command failed on {sandbox.id} (exit {result.exit_status}): {result.stderr!r}",
                        host=sandbox.id,
                    )
        finally:
            if isinstance(sandbox, SshSandbox):
                await sandbox.close()
            self._busy.discard(sandbox.id)

    async def close(self) -> None:
        self._busy.clear()


async def _run_argv(argv: list[str], timeout_s: float, env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ, **env}
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SandboxCreateError(f"{argv[0]} did not finish within {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        raise SandboxCreateError(f"{argv[0]} exited with {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return out.decode(errors="replace")


def parse_create_output(text: str) -> dict[str, Any]:
    """The create command's JSON (the last non-empty line of stdout), checked field by field."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SandboxCreateError("create command printed nothing; expected a JSON object")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise SandboxCreateError(f"create command output is not JSON ({exc}): {lines[-1][:200]!r}") from None
    if not isinstance(data, dict):
        raise SandboxCreateError(f"create command output must be a JSON object, got {type(data).__name__}")
    for key, kind in (("id", str), ("host", str)):
        if not isinstance(data.get(key), kind):
            raise SandboxCreateError(f"create command output: '{key}' missing or not a {kind.__name__}")
    if not isinstance(data.get("port", 22), int):
        raise SandboxCreateError("create command output: 'port' must be an integer")
    return data


ENDPOINT_KEYS = ("host", "port", "user", "key_file", "known_hosts")
"""What a command-made sandbox's record keeps of the create command's output (`SandboxRecord.data`)."""


class CommandProvider:
    """Sandboxes made and removed by external commands (cloud CLIs); see deploy/sandbox/."""

    survives_coordinator = True
    traits = IMAGE_TRAITS

    def __init__(self, cfg: CommandProviderConfig, shell_cfg: ShellConfig) -> None:
        if not cfg.create:
            raise ValueError("sandbox.command.create: no create command configured")
        self.cfg = cfg
        self.shell_cfg = shell_cfg
        self._live: dict[str, SshSandbox] = {}

    async def create(self, request: SandboxRequest) -> Sandbox:
        env = {
            "T1_ALLOW_NETWORK": "1" if request.allow_network else "0",
            "T1_IMAGE": request.docker_image or "",
            "T1_CPUS": "" if request.cpus is None else str(request.cpus),
            "T1_MEMORY_MB": "" if request.memory_mb is None else str(request.memory_mb),
        }
        data = parse_create_output(await _run_argv(self.cfg.create, self.cfg.timeout_s, env))
        try:
            sandbox = await self._connect(data["id"], data)
        except SandboxLost:
            await self._run_destroy(data["id"])
            raise
        self._live[sandbox.id] = sandbox
        return sandbox

    async def _connect(self, sandbox_id: str, data: dict[str, Any]) -> SshSandbox:
        endpoint = SshEndpoint(
            host=data["host"], port=int(data.get("port", 22)), user=str(data.get("user", "root")),
            client_keys=(os.path.expanduser(str(data["key_file"])),) if data.get("key_file") else (),
            known_hosts=os.path.expanduser(str(data.get("known_hosts") or self.cfg.known_hosts or "")) or None,
            insecure=self.cfg.insecure_skip_host_verification,
        )
        kept = {k: str(data[k]) for k in ENDPOINT_KEYS if data.get(k) is not None}
        return await SshSandbox.connect(sandbox_id, endpoint, self.shell_cfg, record=("command", kept))

    async def reattach(self, record: SandboxRecord) -> Sandbox:
        """The sandbox at the endpoint `record` keeps, reconnected; the create and destroy commands are not run."""
        check_record(record, "command", ("host",))
        if record.sandbox_id in self._live:
            raise SandboxGone(f"sandbox {record.sandbox_id} is already attached by this coordinator")
        data: dict[str, Any] = dict(record.data)
        port = data.get("port", "22")
        if not port.isdigit():
            raise SandboxGone(f"sandbox record of {record.sandbox_id}: port {port!r} is not a number")
        data["port"] = int(port)
        try:
            sandbox = await self._connect(record.sandbox_id, data)
        except SandboxLost as exc:
            raise SandboxGone(f"sandbox {record.sandbox_id}: {exc}") from exc
        self._live[sandbox.id] = sandbox
        return sandbox

    async def _run_destroy(self, sandbox_id: str) -> None:
        if self.cfg.destroy:
            argv = [arg.replace("{id}", sandbox_id) for arg in self.cfg.destroy]
            await _run_argv(argv, self.cfg.timeout_s, {})

    async def destroy(self, sandbox: Sandbox) -> None:
        live = self._live.pop(sandbox.id, None)
        if live is not None:
            await live.close()
        await self._run_destroy(sandbox.id)

    async def close(self) -> None:
        for sandbox in list(self._live.values()):
            await self.destroy(sandbox)
