"""SandboxPool over real providers: limits, retries, quarantine, recovery, metrics; ssh and command providers."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from t1.config.sandbox import (
    CommandProviderConfig,
    PoolConfig,
    SandboxConfig,
    SshHost,
    SshProviderConfig,
)
from t1.sandbox import SandboxLost, SandboxPool, SandboxRequest, build_provider
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.pool import PoolMetrics
from t1.sandbox.ssh.remote import CommandProvider, SandboxCreateError, SshProvider, parse_create_output

from .conftest import SHELL_CFG, Sshd, free_port


def _pool(provider: object, **overrides: object) -> tuple[SandboxPool, CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = PoolConfig(**{"backoff_s": 0.05, "acquire_timeout_s": 5.0, **overrides})  # type: ignore[arg-type]
    return SandboxPool(provider, cfg, metrics=PoolMetrics(registry)), registry  # type: ignore[arg-type]


async def test_acquisition_is_bounded_and_release_always_destroys(local_provider: LocalProvider) -> None:
    pool, registry = _pool(local_provider, max_sandboxes=1)
    roots = []
    with pytest.raises(ValueError, match="body failed"):
        async with pool.acquire() as box:
            roots.append(local_provider.tree(box.id).root)
            assert registry.get_sample_value("t1_sandbox_active") == 1
            with pytest.raises(TimeoutError, match="max_sandboxes=1"):
                async with pool.acquire(timeout_s=0.3):
                    pass
            raise ValueError("body failed")
    assert not roots[0].exists() and local_provider.server.trees == {}
    async with pool.acquire() as box:
        shell = await box.open_shell()
        assert (await shell.run("echo ok")).output == "ok\n"
    assert registry.get_sample_value("t1_sandbox_active") == 0
    assert registry.get_sample_value("t1_sandbox_created_total") == 2
    await pool.close()


async def test_pool_recovers_after_a_killed_connection(local_provider: LocalProvider) -> None:
    pool, registry = _pool(local_provider)
    with pytest.raises(SandboxLost):
        async with pool.acquire() as box:
            shell = await box.open_shell()
            running = asyncio.ensure_future(shell.run("sleep 30"))
            await asyncio.sleep(0.3)
            local_provider.server.drop_connections(box.id)
            await asyncio.wait_for(running, 10)
    assert pool.stats.lost == 1 and registry.get_sample_value("t1_sandbox_failed_total", {"stage": "lost"}) == 1
    async with pool.acquire() as box:
        assert (await (await box.open_shell()).run("echo healthy")).output == "healthy\n"
    await pool.close()


def _create_script(tmp_path: Path, sshd: Sshd, failures: int) -> list[str]:
    """A real create command that fails `failures` times, then prints the sshd endpoint as JSON."""
    counter = tmp_path / "count"
    payload = json.dumps({"id": "vm-1", "host": "127.0.0.1", "port": sshd.port, "user": sshd.user,
                          "key_file": str(sshd.key_file)})
    script = tmp_path / "create.py"
    script.write_text(
        "import pathlib, sys\n"
        f"c = pathlib.Path({str(counter)!r})\n"
        "n = int(c.read_text()) if c.exists() else 0\n"
        "c.write_text(str(n + 1))\n"
        f"if n < {failures}:\n    sys.exit('cloud API said no')\n"
        f"print('provisioning...')\nprint({payload!r})\n"
    )
    return [sys.executable, str(script)]


async def test_command_provider_retries_with_backoff(tmp_path: Path, sshd: Sshd) -> None:
    destroyed = tmp_path / "destroyed"
    cfg = CommandProviderConfig(
        create=_create_script(tmp_path, sshd, failures=2),
        destroy=["sh", "-c", f"echo {{id}} >> {destroyed}"],
        known_hosts=sshd.known_hosts,
    )
    pool, registry = _pool(CommandProvider(cfg, SHELL_CFG), create_retries=3)
    start = time.monotonic()
    async with pool.acquire() as box:
        assert (await (await box.open_shell()).run("echo via-command")).output == "via-command\n"
    assert time.monotonic() - start >= 0.05 + 0.1  # two backoffs: 0.05 s, then 0.1 s
    assert pool.stats.create_failures == 2 and destroyed.read_text() == "vm-1\n"
    assert registry.get_sample_value("t1_sandbox_failed_total", {"stage": "create"}) == 2
    await pool.close()


async def test_create_gives_up_after_the_retries(tmp_path: Path, sshd: Sshd) -> None:
    cfg = CommandProviderConfig(create=_create_script(tmp_path, sshd, failures=10))
    pool, _ = _pool(CommandProvider(cfg, SHELL_CFG), create_retries=1)
    with pytest.raises(SandboxLost, match=r"after 2 attempts.*cloud API said no"):
        async with pool.acquire():
            pass
    await pool.close()


def test_create_output_errors_name_the_field() -> None:
    with pytest.raises(SandboxCreateError, match="not JSON"):
        parse_create_output("creating\nnope\n")
    with pytest.raises(SandboxCreateError, match="'host' missing"):
        parse_create_output('{"id": "x"}')
    with pytest.raises(SandboxCreateError, match="'port' must be an integer"):
        parse_create_output('{"id": "x", "host": "h", "port": "22"}')
    assert parse_create_output('log line\n{"id": "x", "host": "h"}\n')["host"] == "h"


async def test_ssh_inventory_quarantines_a_failing_host_and_resets(tmp_path: Path, sshd: Sshd) -> None:
    marker = tmp_path / "reset-ran"
    dead = SshHost(host="127.0.0.1", port=free_port(), user=sshd.user)
    live = SshHost(host="127.0.0.1", port=sshd.port, user=sshd.user)
    cfg = SshProviderConfig(hosts=[dead, live], key_file=sshd.key_file, known_hosts=sshd.known_hosts,
                            reset_command=f"touch {marker}")
    pool, registry = _pool(SshProvider(cfg, SHELL_CFG), quarantine_after=1, create_retries=2)
    async with pool.acquire() as box:
        assert box.id == f"{sshd.user}@127.0.0.1:{sshd.port}"
    assert marker.exists() and pool.stats.create_failures == 1
    assert pool.health.is_quarantined(f"{sshd.user}@127.0.0.1:{dead.port}")
    assert registry.get_sample_value("t1_sandbox_quarantined") == 1
    async with pool.acquire() as box:  # straight to the healthy host
        assert box.id.endswith(f":{sshd.port}")
        with pytest.raises(TimeoutError):  # the pool is bounded by the inventory (2 hosts, 1 quarantined+1 busy)
            async with pool.acquire(timeout_s=0.2), pool.acquire(timeout_s=0.2):
                pass
    assert pool.stats.create_failures == 1 and pool.max_sandboxes == 2
    await pool.close()


async def test_host_keys_are_verified_unless_explicitly_insecure(tmp_path: Path, sshd: Sshd) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = SshHost(host="127.0.0.1", port=sshd.port, user=sshd.user)
    strict = SshProvider(SshProviderConfig(hosts=[host], key_file=sshd.key_file, known_hosts=empty), SHELL_CFG)
    with pytest.raises(SandboxCreateError, match=r"127\.0\.0\.1"):
        await strict.create(SandboxRequest())
    insecure = SshProvider(SshProviderConfig(hosts=[host], key_file=sshd.key_file, known_hosts=empty,
                                             insecure_skip_host_verification=True), SHELL_CFG)
    box = await insecure.create(SandboxRequest())
    await insecure.destroy(box)


async def test_creation_rate_is_capped(local_provider: LocalProvider) -> None:
    pool, _ = _pool(local_provider, max_creates_per_s=10.0, health_check=False)
    start = time.monotonic()

    async def one() -> None:
        async with pool.acquire():
            pass

    await asyncio.gather(*(one() for _ in range(4)))
    assert time.monotonic() - start >= 0.3  # creates spaced 0.1 s apart
    assert pool.stats.created == 4
    await pool.close()


def test_config_errors_name_the_problem() -> None:
    with pytest.raises(ValidationError, match=r"ssh\.hosts"):
        SandboxConfig(provider="ssh")
    with pytest.raises(ValidationError, match=r"command\.create"):
        SandboxConfig(provider="command")
    assert isinstance(build_provider(SandboxConfig()), LocalProvider)
