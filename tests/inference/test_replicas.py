"""The replica set (t1.inference.client.replicas) through both of its real transports, one contract each: two torch
servers over gRPC on loopback (InferencePool), and two OpenAI-compatible stand-ins over HTTP (OpenAIPool).

Each test runs once per transport against a `Fleet`: two replicas, one of which can be made to fail every
request and then come back (gRPC: its server stopped, then a new server on the base model at the same port;
HTTP: the stand-in answers 500 until it is told otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from inference_helpers import prompt
from openai_standin import StandIn, serve

from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.grpc_transport import GrpcTransport
from t1.inference.client.pool import InferencePool, InferenceUnavailable
from t1.inference.client.replicas import Failure, ReplicaSet
from t1.inference.multiplex import rpc_error
from t1.inference.openai.openai_pool import EndpointUnavailable, OpenAIPool
from t1.inference.openai.openai_transport import HttpTransport
from t1.inference.openai.openai_wire import EndpointRefused, MalformedReply
from t1.inference.types import GenerateRequest, SamplingParams
from t1.rpc.server import GrpcServer

UNHEALTHY_S = 1.0
SETTINGS: dict[str, Any] = {"retries": 2, "backoff_s": 0.01, "unhealthy_s": UNHEALTHY_S, "probe_timeout_s": 10.0}


def turn(session: str, seed: int = 0) -> GenerateRequest:
    return GenerateRequest(session, prompt(12, seed), SamplingParams(seed=seed, max_tokens=4))


def metric(pool: ReplicaSet[Any], name: str) -> float:
    return pool.metrics.registry.get_sample_value(name) or 0.0


@dataclass
class Fleet:
    """Two replicas behind one pool; `fail(i)` makes replica i fail every request until `recover(i)`."""

    kind: str
    pool: InferencePool | OpenAIPool
    weights: str  # what update_weights is given
    servers: list[Any] = field(default_factory=list)
    model_dir: Path | None = None

    @property
    def addresses(self) -> list[str]:
        return self.pool.endpoints

    async def fail(self, i: int) -> None:
        if self.kind == "http":
            self.servers[i].faults[:] = ["500"] * 1000
            return
        server, backend = self.servers[i]
        await server.stop()
        await backend.close()

    async def recover(self, i: int) -> None:
        if self.kind == "http":
            self.servers[i].faults.clear()
            return
        self.servers[i] = await _grpc_server(self.model_dir, int(self.addresses[i].rsplit(":", 1)[1]))

    async def close(self) -> None:
        await self.pool.close()
        if self.kind == "grpc":
            for server, backend in self.servers:
                await server.stop()
                await backend.close()


async def _grpc_server(model_dir: Path | None, port: int = 0) -> tuple[GrpcServer, Any]:
    from t1.inference.server.servicer import inference_binding
    from t1.inference.server.torch_backend import TorchBackend

    assert model_dir is not None
    backend = TorchBackend(model_dir)  # a new server starts on the base model (v0)
    server = GrpcServer([inference_binding(backend)], ServerConfig(port=port, grace_s=0.2), AuthConfig())
    await server.start()
    return server, backend


@pytest.fixture(params=["grpc", "http"])
async def fleet(request: pytest.FixtureRequest, tiny_model_dir: Path) -> AsyncIterator[Fleet]:
    if request.param == "grpc":
        servers = [await _grpc_server(tiny_model_dir) for _ in range(2)]
        pool = InferencePool(InferencePoolConfig(**SETTINGS), [s.address for s, _ in servers])
        f = Fleet("grpc", pool, str(tiny_model_dir), servers, tiny_model_dir)
        try:
            yield f
        finally:
            await f.close()
        return
    standins = [StandIn(sampler=lambda p: [p[-1] % 90 + 1, 0]) for _ in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serve(s)) for s in standins]
        cfg = InferencePoolConfig.model_validate(
            {**SETTINGS, "openai": [{"base_url": u, "model": "tiny", "weight_updates": "vllm_dev"} for u in urls]})
        f = Fleet("http", OpenAIPool(cfg, vocab_size=1024), "/weights/v1", standins)
        try:
            yield f
        finally:
            await f.close()


async def test_a_failed_replica_is_avoided_and_its_session_fails_over(fleet: Fleet) -> None:
    pool = fleet.pool
    await pool(turn("s"))
    home = pool.replica_of("s")
    assert home == fleet.addresses[0], "a new session goes to the least loaded replica, the first on a tie"
    await pool(turn("s", 1))
    assert pool.replica_of("s") == home and metric(pool, "t1_inference_failovers_total") == 0
    await fleet.fail(0)
    res = await pool(turn("s", 2))
    assert len(res.token_ids) > 0 and pool.replica_of("s") == fleet.addresses[1]
    assert metric(pool, "t1_inference_failovers_total") == 1 and metric(pool, "t1_inference_pool_retries_total") == 1
    assert pool.healthy_endpoints == [fleet.addresses[1]]
    assert pool.metrics.registry.get_sample_value("t1_inference_replica_healthy", {"replica": home}) == 0
    await pool(turn("new", 3))
    assert pool.replica_of("new") == fleet.addresses[1], "the avoided replica gets no new session"


async def test_a_replica_that_missed_an_update_is_caught_up_before_it_serves(fleet: Fleet) -> None:
    pool = fleet.pool
    await fleet.fail(0)
    await pool(turn("a"))  # fails on the first replica, served by the second
    update = await pool.update_weights(fleet.weights, 1)
    assert (update.updated, update.skipped) == ((fleet.addresses[1],), (fleet.addresses[0],))
    await fleet.recover(0)
    await asyncio.sleep(UNHEALTHY_S + 0.1)  # the avoidance ends: the first replica is first in line again
    res = await pool(turn("b", 1))
    assert pool.replica_of("b") == fleet.addresses[0]
    assert res.policy_version == 1 and set(res.token_versions.tolist()) == {1}, "caught up before it served"
    assert metric(pool, "t1_inference_weight_catch_ups_total") == 1
    assert metric(pool, "t1_inference_weight_skips_total") == 1
    assert pool.latest_weights == (fleet.weights, 1)


async def test_past_the_retries_the_sets_error_names_the_last_cause(fleet: Fleet) -> None:
    pool = fleet.pool
    await fleet.fail(0)
    await fleet.fail(1)
    error = EndpointUnavailable if fleet.kind == "http" else InferenceUnavailable
    with pytest.raises(error, match=r"failed on every attempt \(3\); last: ") as raised:
        await pool(turn("x"))
    assert any(address in str(raised.value) for address in fleet.addresses)
    assert metric(pool, "t1_inference_pool_retries_total") == 2
    assert pool.healthy_endpoints == []


async def test_each_transport_says_which_errors_a_retry_may_fix() -> None:
    grpc_transport = GrpcTransport("127.0.0.1:9", InferencePoolConfig(), AuthConfig())
    http_transport = HttpTransport(InferencePoolConfig.model_validate(
        {"openai": [{"base_url": "http://127.0.0.1:9/v1", "model": "m"}]}).openai[0])
    try:
        assert grpc_transport.failure(rpc_error(grpc.StatusCode.UNAVAILABLE, "gone")) == Failure("UNAVAILABLE: gone")
        assert grpc_transport.failure(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "slow")) is not None
        assert grpc_transport.failure(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "bad")) is None
        assert grpc_transport.failure(ValueError("x")) is None
        assert http_transport.failure(MalformedReply("choices: missing")) == Failure("choices: missing")
        assert http_transport.failure(EndpointRefused("401")) is None
        with pytest.raises(Exception) as refused:  # nothing listens on port 9: a connection error, retryable
            await http_transport.post("/completions", {}, 1024)
        failure = http_transport.failure(refused.value)
        assert failure is not None and failure.wait_s == 0.0
        assert await http_transport.served_version() == 0
        assert await http_transport.capacity() == (0, 0)
    finally:
        await grpc_transport.close()
        await http_transport.close()

