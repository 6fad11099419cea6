"""The shared gRPC layer on a real loopback server: health, reflection, auth, TLS, deadlines, errors."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from t1.config.shared import AuthConfig, ServerConfig, TlsConfig
from t1.rpc.client import call_options, make_channel
from t1.rpc.errors import RequestError, rpc_errors
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.v1 import coordinator_pb2, coordinator_pb2_grpc


class EchoCoordinator(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """A minimal servicer: GetJob validates its field like the real ones do."""

    @rpc_errors
    async def GetJob(self, request, context):
        if not request.job_id:
            raise RequestError("job_id: required")
        return coordinator_pb2.EvalJob(job_id=request.job_id)


def _binding() -> ServiceBinding:
    return ServiceBinding("t1.v1.CoordinatorService", coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                          EchoCoordinator())


async def _start(auth: AuthConfig | None = None) -> GrpcServer:
    server = GrpcServer([_binding()], ServerConfig(host="127.0.0.1", port=0, grace_s=0.5), auth or AuthConfig())
    await server.start()
    return server


async def test_health_and_reflection_list_services():
    server = await _start()
    try:
        async with make_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "t1.v1.CoordinatorService"):
                resp = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = refl.ServerReflectionInfo(timeout=5)
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            resp = await call.read()
            await call.done_writing()
            names = {s.name for s in resp.list_services_response.service}
            assert {"t1.v1.CoordinatorService", "grpc.health.v1.Health"} <= names
    finally:
        await server.stop()


async def test_bad_request_is_invalid_argument_naming_field():
    server = await _start()
    try:
        async with make_channel(server.address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetJob(coordinator_pb2.GetJobRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "job_id" in err.value.details()
            ok = await stub.GetJob(coordinator_pb2.GetJobRequest(job_id="j1"), timeout=5)
            assert ok.job_id == "j1"
    finally:
        await server.stop()


async def test_bearer_token_required_when_set(monkeypatch):
    monkeypatch.setenv("T1_TEST_TOKEN", "s3cret")
    auth = AuthConfig(token_env="T1_TEST_TOKEN")
    server = await _start(auth)
    try:
        async with make_channel(server.address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
            req = coordinator_pb2.GetJobRequest(job_id="j1")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetJob(req, timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetJob(req, timeout=5, metadata=(("authorization", "Bearer wrong"),))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            resp = await stub.GetJob(req, **call_options(auth).kw())
            assert resp.job_id == "j1"
            # Probes stay open without the token.
            health = health_pb2_grpc.HealthStub(channel)
            assert (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == 1
    finally:
        await server.stop()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    return key, cert


async def test_tls_round_trip(tmp_path):
    key, cert = _self_signed(tmp_path)
    auth = AuthConfig(tls=TlsConfig(enabled=True, cert_file=cert, key_file=key, ca_file=cert))
    server = await _start(auth)
    try:
        async with make_channel(server.address, auth) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
            assert (await stub.GetJob(coordinator_pb2.GetJobRequest(job_id="x"), timeout=5)).job_id == "x"
        async with make_channel(server.address) as plain:  # plaintext client cannot talk to a TLS server
            with pytest.raises(grpc.aio.AioRpcError):
                await coordinator_pb2_grpc.CoordinatorServiceStub(plain).GetJob(
                    coordinator_pb2.GetJobRequest(job_id="x"), timeout=2)
    finally:
        await server.stop()


async def test_graceful_stop_reports_not_serving_then_closes():
    server = await _start()
    address = server.address
    await server.stop(grace_s=0.1)
    async with make_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
