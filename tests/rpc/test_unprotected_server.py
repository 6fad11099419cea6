"""The default of every T1 gRPC server: without a token it serves loopback only, with a warning; asked to listen
beyond loopback without one, it refuses to start and says how to fix it."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t1.config.shared import AuthConfig, ServerConfig
from t1.rpc.introspect import health_status
from t1.rpc.server import GrpcServer, UnprotectedServer, is_loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "myhost.example"])
async def test_no_auth_beyond_loopback_refuses_to_start(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("T1_API_TOKEN", raising=False)
    monkeypatch.delenv("T1_SERVICE_TOKEN", raising=False)
    with pytest.raises(UnprotectedServer, match=r"without auth.*auth.token or \$T1_API_TOKEN"):
        await GrpcServer([], ServerConfig(host=host, port=0), AuthConfig()).start()


async def test_no_auth_on_loopback_serves_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("T1_API_TOKEN", raising=False)
    monkeypatch.delenv("T1_SERVICE_TOKEN", raising=False)
    server = GrpcServer([], ServerConfig(host="127.0.0.1", port=0), AuthConfig())
    with caplog.at_level(logging.WARNING, "t1.rpc.server"):
        await server.start()
    try:
        assert "has no auth: any user of this machine can call it" in caplog.text
    finally:
        await server.stop(0)


async def test_a_token_allows_every_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T1_API_TOKEN", "s3cret")
    server = GrpcServer([], ServerConfig(host="0.0.0.0", port=0), AuthConfig())
    await server.start()
    try:
        assert await asyncio.to_thread(health_status, f"127.0.0.1:{server.port}") == "SERVING"
    finally:
        await server.stop(0)


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.5.0.1", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "192.168.1.1", "example.com"))


def test_the_coordinator_cli_exits_2_naming_the_fix(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"inference: {{model: {{path: {tiny_model_dir}}}}}\nrollout: {{policy: oracle_script}}\n"
                   f"coordinator: {{run_dir: {tmp_path / 'run'}, train: false, server: {{host: 0.0.0.0}}}}\n"
                   "metrics: {port: null}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("T1_API_TOKEN", "T1_SERVICE_TOKEN")}
    proc = subprocess.run([sys.executable, "-m", "t1.cli.coordinator", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "refusing to serve gRPC on 0.0.0.0 without auth" in proc.stderr
