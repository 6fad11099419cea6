"""A local run's child services require the run's generated token: nothing else on the machine can call them.

A real child process serves T1's gRPC layer with the environment `LocalStack` gives its
children; a client without the token (any other process on the host) is refused, the
coordinator's own clients get through, and the coordinator's own server is not given the token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from t1.config.schema import T1Config
from t1.config.shared import AuthConfig
from t1.coordinator.local.children import Child
from t1.coordinator.local.local_stack import LocalStack
from t1.rpc import auth as auth_module
from t1.rpc.auth import SERVICE_TOKEN_ENV, server_token
from t1.rpc.client import call_options, make_channel
from t1.v1 import coordinator_pb2, coordinator_pb2_grpc

SERVE = f'''
import asyncio, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.rpc.test_server import _binding
from t1.config.shared import AuthConfig, ServerConfig
from t1.rpc.server import GrpcServer

async def main():
    server = GrpcServer([_binding()], ServerConfig(host="127.0.0.1", port=0), AuthConfig())
    await server.start()
    print(f"child listening on {{server.address}}", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
'''


async def test_local_children_require_the_run_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_module, "_service_token", None)
    monkeypatch.delenv(SERVICE_TOKEN_ENV, raising=False)
    stack = LocalStack(T1Config(), None, [], tmp_path)
    token = stack.child_env[SERVICE_TOKEN_ENV]
    assert len(token) >= 32
    assert server_token(AuthConfig()) is None  # the coordinator's own server is not given it
    child = Child("echo", [sys.executable, "-c", SERVE], tmp_path / "echo.log")
    address = await child.start(60, env=stack.child_env)
    try:
        async with make_channel(address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
            req = coordinator_pb2.GetJobRequest(job_id="j1")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetJob(req, timeout=10)  # another process on the machine, no token
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            resp = await stub.GetJob(req, **call_options(AuthConfig()).kw())  # the coordinator's clients
            assert resp.job_id == "j1"
    finally:
        await child.stop(2)


def test_a_configured_token_is_used_as_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_module, "_service_token", None)
    cfg = T1Config(auth=AuthConfig(token="configured"))
    stack = LocalStack(cfg, None, [], tmp_path)
    assert stack.child_env == {} and auth_module._service_token is None
    assert call_options(cfg.auth).metadata == (("authorization", "Bearer configured"),)
    assert server_token(cfg.auth) == "configured"
