"""Sandboxes that outlive their coordinator: create, lose the provider, reattach from the record with a new one.

"Lose the provider" is what a coordinator's kill -9 does to it: its connections drop without a
destroy, and the provider object is never used again. The new provider is built from the same
config, as a restarted coordinator builds it, and gets only the record, through JSON.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from t1.config.sandbox import CommandProviderConfig, PoolConfig, SshHost, SshProviderConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.pool import SandboxPool
from t1.sandbox.ssh.remote import CommandProvider, SshProvider
from t1.sandbox.ssh.ssh_sandbox import SshSandbox
from t1.sandbox.types import Sandbox, SandboxGone, SandboxRecord, SandboxRequest

from .conftest import SHELL_CFG, Sshd, SshdProcess

SPAWN = "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!"
"""A process of the agent's that outlives its shell (a server it started), printed by pid."""


def through_json(record: SandboxRecord) -> SandboxRecord:
    return SandboxRecord.from_json(json.loads(json.dumps(record.to_json())))


async def leave_traces(sandbox: Sandbox, workdir: str) -> str:
    """A file and a running process in the sandbox; returns the process's pid."""
    shell = await sandbox.open_shell()
    await shell.write_file(f"{workdir}/kept.txt", b"before the crash\n")
    started = await shell.run(SPAWN)
    assert started.exit_code == 0, started.output
    return started.output.strip()


async def find_traces(sandbox: Sandbox, workdir: str, pid: str) -> None:
    shell = await sandbox.open_shell()
    assert await shell.read_file(f"{workdir}/kept.txt") == b"before the crash\n"
    alive = await shell.run(f"kill -0 {pid} && tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert alive.exit_code == 0 and alive.output.strip() == "sleep 300", alive.output
    await shell.run(f"kill {pid}")


def crash(sandbox: Sandbox) -> None:
    """What the coordinator's death does to a sandbox's connection: gone, without a destroy."""
    assert isinstance(sandbox, SshSandbox)
    sandbox.conn.abort()


def test_record_json_round_trip_and_errors() -> None:
    record = SandboxRecord("docker", "sb-1", {"container": "abc"})
    assert through_json(record) == record
    with pytest.raises(ValueError, match="'provider'"):
        SandboxRecord.from_json({"sandbox_id": "x"})
    with pytest.raises(ValueError, match="'data' must map strings to strings"):
        SandboxRecord.from_json({"provider": "ssh", "sandbox_id": "x", "data": {"port": 22}})
    with pytest.raises(ValueError, match="JSON object"):
        SandboxRecord.from_json(["ssh"])


def _inventory(sshd: Sshd, tmp_path: Path) -> SshProviderConfig:
    host = SshHost(host="127.0.0.1", port=sshd.port, user=sshd.user)
    return SshProviderConfig(hosts=[host], key_file=sshd.key_file, known_hosts=sshd.known_hosts,
                             reset_command=f"rm -rf {tmp_path}/work")


@pytest.mark.slow  # six OpenSSH logins (0.4 s each here); the command provider's test covers the same path
async def test_ssh_inventory_host_reattaches_with_its_files_and_processes(tmp_path: Path, sshd: Sshd) -> None:
    work = tmp_path / "work"
    work.mkdir()
    cfg = _inventory(sshd, tmp_path)
    first = SshProvider(cfg, SHELL_CFG)
    assert first.survives_coordinator
    sandbox = await first.create(SandboxRequest())
    pid = await leave_traces(sandbox, str(work))
    record = through_json(sandbox.record())
    assert record.provider == "ssh" and record.data["host"] == sandbox.id
    crash(sandbox)

    second = SshProvider(cfg, SHELL_CFG)
    again = await second.reattach(record)
    await find_traces(again, str(work), pid)
    with pytest.raises(SandboxGone, match="already serves"):
        await second.reattach(record)
    await second.destroy(again)  # the reset runs and the lease is dropped
    assert not work.exists()
    other = SshProvider(cfg, SHELL_CFG)
    newer = await other.create(SandboxRequest())  # the same host, a new sandbox: the old record is not it
    with pytest.raises(SandboxGone, match="was reset or serves another sandbox"):
        await SshProvider(cfg, SHELL_CFG).reattach(record)
    await other.destroy(newer)
    with pytest.raises(SandboxGone, match="was reset or serves another sandbox"):  # no lease at all
        await SshProvider(cfg, SHELL_CFG).reattach(record)


async def test_ssh_reattach_refuses_what_is_not_its_own(sshd: Sshd, tmp_path: Path) -> None:
    provider = SshProvider(_inventory(sshd, tmp_path), SHELL_CFG)
    with pytest.raises(SandboxGone, match="not in this run's inventory"):
        await provider.reattach(SandboxRecord("ssh", "h", {"host": "root@10.0.0.9:22", "lease": "x"}))
    with pytest.raises(SandboxGone, match="made by the docker provider"):
        await provider.reattach(SandboxRecord("docker", "sb-1", {"container": "abc"}))
    with pytest.raises(SandboxGone, match="lacks lease"):
        await provider.reattach(SandboxRecord("ssh", "h", {"host": "h"}))


async def test_command_sandbox_reattaches_and_is_gone_once_destroyed(tmp_path: Path) -> None:
    machine = SshdProcess()  # the "cloud machine": its own sshd, which the destroy command stops
    info = machine.start()
    try:
        out = json.dumps({"id": f"vm-{info.pid}", "host": "127.0.0.1", "port": info.port, "user": info.user,
                          "key_file": str(info.key_file), "known_hosts": str(info.known_hosts)})
        cfg = CommandProviderConfig(create=["sh", "-c", f"echo {shlex.quote(out)}"],
                                    destroy=["sh", "-c", f"kill {info.pid}; echo {{id}} > {tmp_path}/destroyed"])
        first = CommandProvider(cfg, SHELL_CFG)
        sandbox = await first.create(SandboxRequest())
        pid = await leave_traces(sandbox, str(tmp_path))
        record = through_json(sandbox.record())
        assert record.provider == "command" and record.data["port"] == str(info.port)
        crash(sandbox)

        second = CommandProvider(cfg, SHELL_CFG)
        pool = SandboxPool(second, PoolConfig())
        async with pool.reattach(record) as again:  # health-checked; destroyed (the destroy command) at the end
            await find_traces(again, str(tmp_path), pid)
        assert (tmp_path / "destroyed").read_text().strip() == f"vm-{info.pid}"
        await pool.close()
        with pytest.raises(SandboxGone, match="cannot connect"):
            await CommandProvider(cfg, SHELL_CFG).reattach(record)
    finally:
        machine.stop()


async def test_local_sandboxes_do_not_outlive_the_coordinator(local_provider: LocalProvider) -> None:
    assert not local_provider.survives_coordinator
    with pytest.raises(SandboxGone, match="end with the coordinator"):
        await local_provider.reattach(SandboxRecord("local", "sb-0123456789ab", {}))
