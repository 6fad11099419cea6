"""InferencePool against real servers: affinity, least-outstanding placement, retries, deadlines, failover."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import numpy as np
import pytest
from inference_helpers import ServerProcess, prompt

from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.pool import InferencePool, InferenceUnavailable
from t1.inference.server.servicer import inference_binding
from t1.inference.types import GenerateRequest, SamplingParams
from t1.routing.concat import concat_blocks
from t1.routing.validation import validate_routing
from t1.rpc.server import GrpcServer


def req(ids: np.ndarray, session: str, seed: int, max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(seed=seed, max_tokens=max_tokens))


def metric(pool: InferencePool, name: str) -> float:
    return pool.metrics.registry.get_sample_value(name) or 0.0


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
async def two_servers(tiny_model_dir: Path):
    from t1.inference.server.torch_backend import TorchBackend

    backends = [TorchBackend(tiny_model_dir) for _ in range(2)]
    servers = [GrpcServer([inference_binding(b)], ServerConfig(port=0, grace_s=0.2), AuthConfig()) for b in backends]
    for s in servers:
        await s.start()
    yield [s.address for s in servers], backends
    for s, b in zip(servers, backends, strict=True):
        await s.stop()
        await b.close()


async def test_sessions_stick_to_a_replica_and_new_ones_go_to_the_least_loaded(two_servers) -> None:
    addresses, _ = two_servers
    pool = InferencePool(InferencePoolConfig(backoff_s=0.01), addresses)
    # Two sessions started together land on different replicas (one request outstanding on the first).
    await asyncio.gather(pool(req(prompt(30), "s1", 1, 30)), pool(req(prompt(30, 1), "s2", 2, 30)))
    assert {pool.replica_of("s1"), pool.replica_of("s2")} == set(addresses)
    context = prompt(30)
    home = pool.replica_of("s1")
    for turn in range(4):
        res = await pool(req(context, "s1", 10 + turn))
        assert pool.replica_of("s1") == home
        if turn > 0:
            assert res.cached_tokens > 0, "affinity keeps the prefix cache warm"
        context = np.concatenate([context, res.token_ids, prompt(4, turn)])
    assert metric(pool, "t1_inference_cached_tokens_total") > 0
    assert metric(pool, "t1_inference_failovers_total") == 0
    await pool.close()


async def test_bad_request_is_not_retried(two_servers) -> None:
    addresses, _ = two_servers
    pool = InferencePool(InferencePoolConfig(backoff_s=0.01), addresses)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pool(req(np.zeros(0, np.int32), "bad", 1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert metric(pool, "t1_inference_pool_retries_total") == 0
    await pool.close()


async def test_dead_endpoint_is_retried_on_a_live_one(two_servers) -> None:
    addresses, _ = two_servers
    pool = InferencePool(InferencePoolConfig(backoff_s=0.01, retries=2), [closed_port(), addresses[0]])
    res = await pool(req(prompt(10), "fresh", 3))
    assert len(res.token_ids) == 8 and pool.replica_of("fresh") == addresses[0]
    assert metric(pool, "t1_inference_pool_retries_total") >= 1
    await pool.close()


async def test_all_dead_raises_inference_unavailable_after_retries() -> None:
    pool = InferencePool(InferencePoolConfig(backoff_s=0.01, retries=2), [closed_port(), closed_port()])
    with pytest.raises(InferenceUnavailable, match="UNAVAILABLE"):
        await pool(req(prompt(10), "x", 1))
    assert metric(pool, "t1_inference_pool_retries_total") == 2
    await pool.close()


async def test_deadline_exceeded_is_retried_then_reported(two_servers) -> None:
    addresses, _ = two_servers
    pool = InferencePool(InferencePoolConfig(request_timeout_s=0.001, backoff_s=0.01, retries=1), addresses[:1])
    with pytest.raises(InferenceUnavailable, match="DEADLINE_EXCEEDED"):
        await pool(req(prompt(200), "slow", 1, max_tokens=500))
    await pool.close()


async def test_failover_when_a_server_dies_mid_session_keeps_exact_tokens(backend, tiny_model_dir, server_processes):
    """Two t1-inference processes; the session's replica is killed during a turn; tokens match a one-server run,
    and the session's routing covers every position as the uninterrupted run's does (routes kept across it)."""
    server_processes += [ServerProcess(tiny_model_dir), ServerProcess(tiny_model_dir)]
    by_address = {s.address: s for s in server_processes}
    pool = InferencePool(InferencePoolConfig(backoff_s=0.05, retries=3, unhealthy_s=60), list(by_address))
    context = reference = prompt(40, seed=31)
    blocks = []
    for turn in range(6):
        seed, extra = 500 + turn, prompt(5, seed=turn)
        task = asyncio.create_task(pool(req(context, "long", seed, max_tokens=40)))
        if turn == 3:
            await asyncio.sleep(0.05)
            by_address[pool.replica_of("long")].kill()
        res = await task
        expected = await backend(req(reference, "", seed, max_tokens=40))
        assert res.token_ids.tolist() == expected.token_ids.tolist(), f"turn {turn}"
        np.testing.assert_allclose(res.logprobs, expected.logprobs, atol=1e-4)
        assert res.routing is not None and expected.routing is not None
        blocks.append(res.routing)
        whole, full_routes = len(context) + len(res.token_ids), expected.routing  # the reference prefills all
        context = np.concatenate([context, res.token_ids, extra])
        reference = np.concatenate([reference, expected.token_ids, extra])
    assert metric(pool, "t1_inference_failovers_total") == 1
    assert metric(pool, "t1_inference_pool_retries_total") >= 1
    assert blocks[3].start == 0, "the retried turn was prefilled whole on the survivor"
    routing, _ = concat_blocks(blocks, whole)
    assert routing is not None and validate_routing(routing[:-1]).coverage == 1.0
    np.testing.assert_array_equal(routing[:-1], full_routes.experts)  # positions 0 .. whole - 2
    survivor = pool.replica_of("long")
    assert by_address[survivor].proc.poll() is None
    await pool.close()


async def model_version(address: str) -> int:
    """GetModelInfo over a channel of its own (not sharing the pool's connection state)."""
    from t1.v1 import inference_pb2, inference_pb2_grpc

    async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        reply = await stub.GetModelInfo(inference_pb2.GetModelInfoRequest(), timeout=30, wait_for_ready=True)
        return int(reply.policy_version)


async def test_weights_skip_a_dead_server_and_a_restarted_one_catches_up_before_serving(tiny_model_dir,
                                                                                       server_processes):
    """One of two t1-inference processes dies: updates land on the survivor; its restart is caught up first."""
    server_processes += [ServerProcess(tiny_model_dir), ServerProcess(tiny_model_dir)]
    victim, survivor = server_processes
    pool = InferencePool(
        InferencePoolConfig(backoff_s=0.05, retries=2, unhealthy_s=1.0), [victim.address, survivor.address]
    )
    assert pool.healthy_endpoints == [victim.address, survivor.address]
    victim.kill()
    weights = str(tiny_model_dir)  # a published folder (config.json + safetensors); the version is the label
    first = await pool.update_weights(weights, 1)
    assert (first.updated, first.skipped) == ((survivor.address,), (victim.address,))
    assert pool.healthy_endpoints == [survivor.address], "the dead one no longer counts as healthy"
    second = await pool.update_weights(weights, 2)  # skipped without a call while it is avoided
    assert (second.updated, second.skipped) == ((survivor.address,), (victim.address,))
    assert pool.latest_weights == (weights, 2) and await model_version(survivor.address) == 2
    res = await pool(req(prompt(10), "during", 1))
    assert res.policy_version == 2 and pool.replica_of("during") == survivor.address

    port = victim.address.rsplit(":", 1)[1]
    restarted = ServerProcess(tiny_model_dir, "--port", port)  # same address, back on the base model
    server_processes.append(restarted)
    assert restarted.address == victim.address and await model_version(restarted.address) == 0
    await asyncio.sleep(1.0)  # the avoidance ends; the restarted replica is first in line for a new session
    assert pool.healthy_endpoints == [victim.address, survivor.address]
    res = await pool(req(prompt(10, 3), "after", 2))
    assert pool.replica_of("after") == restarted.address
    assert res.policy_version == 2 and set(res.token_versions.tolist()) == {2}, "caught up before it served"
    assert await model_version(restarted.address) == 2
    assert metric(pool, "t1_inference_weight_catch_ups_total") == 1
    assert metric(pool, "t1_inference_weight_skips_total") == 2
    await pool.close()


async def test_weights_fail_when_no_server_loaded_them() -> None:
    pool = InferencePool(InferencePoolConfig(backoff_s=0.01), [closed_port()])
    with pytest.raises(InferenceUnavailable, match="no replica loaded weights v1"):
        await pool.update_weights("/nonexistent", 1)
    assert pool.healthy_endpoints == [] and pool.latest_weights == ("/nonexistent", 1)
    await pool.close()


async def test_requests_waiting_on_a_dead_replicas_check_move_on_without_probing_it_again(two_servers,
                                                                                         tiny_model_dir) -> None:
    addresses, _ = two_servers
    dead = closed_port()
    pool = InferencePool(
        InferencePoolConfig(backoff_s=0.01, retries=2, unhealthy_s=0.2, probe_timeout_s=1.0), [dead, addresses[0]]
    )
    update = await pool.update_weights(str(tiny_model_dir), 1)
    assert update.skipped == (dead,)
    await asyncio.sleep(0.3)  # the avoidance ends: new sessions pick the dead replica first, and must check it
    results = await asyncio.gather(*(pool(req(prompt(10, i), f"w{i}", i, 4)) for i in range(4)))
    assert all(r.policy_version == 1 for r in results)
    assert {pool.replica_of(f"w{i}") for i in range(4)} == {addresses[0]}
    assert metric(pool, "t1_inference_pool_retries_total") == 1, "one check failed; the waiters did not repeat it"
    await pool.close()
