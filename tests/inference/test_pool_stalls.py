"""Stalled replicas, with real torch-backend gRPC servers on loopback: a server that answers GetModelInfo
but generates nothing (the servicer's hold_generation hook) is caught by the pool's stall watch, its
session moves to the other replica, and the interrupted turn is retried there with its routing whole."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
from inference_helpers import prompt

from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.pool import InferencePool
from t1.inference.client.stall import StallKind
from t1.inference.server.servicer import InferenceServicer, inference_binding
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams
from t1.routing.concat import concat_blocks
from t1.routing.validation import validate_routing
from t1.rpc.server import GrpcServer

STALL_S = 0.6


def req(ids: np.ndarray, session: str, seed: int, max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(seed=seed, max_tokens=max_tokens))


def metric(pool: InferencePool, name: str) -> float:
    return pool.metrics.registry.get_sample_value(name) or 0.0


@pytest.fixture
async def servers(tiny_model_dir: Path):
    """Two servers in this process: address -> servicer (its hold_generation hook)."""
    from t1.inference.server.torch_backend import TorchBackend

    backends = [TorchBackend(tiny_model_dir, chunk_tokens=2) for _ in range(2)]
    servicers = [InferenceServicer(b) for b in backends]
    grpc_servers = [GrpcServer([inference_binding(b, servicer=s)], ServerConfig(port=0, grace_s=0.2), AuthConfig())
                    for b, s in zip(backends, servicers, strict=True)]
    for g in grpc_servers:
        await g.start()
    yield {g.address: s for g, s in zip(grpc_servers, servicers, strict=True)}
    for s in servicers:
        s.hold_generation(False)
    for g, b in zip(grpc_servers, backends, strict=True):
        await g.stop()
        await b.close()


def stall_pool(addresses: list[str], **kw: float) -> InferencePool:
    settings = {"backoff_s": 0.01, "stall_s": STALL_S, "stall_check_s": 0.1, "unhealthy_s": 60,
                "request_timeout_s": 120, **kw}
    return InferencePool(InferencePoolConfig(**settings), addresses)


async def test_a_server_that_answers_but_generates_nothing_is_caught_and_its_session_moves(
        servers, backend, caplog) -> None:
    pool = stall_pool(list(servers))
    context = prompt(30, seed=5)
    first = await pool(req(context, "s", 1))
    home = pool.replica_of("s")
    assert home is not None
    context = np.concatenate([context, first.token_ids, prompt(4, seed=6)])
    servers[home].hold_generation(True)
    with caplog.at_level(logging.WARNING, logger="t1.inference.client.pool"):
        res = await pool(req(context, "s", 2, max_tokens=30))
    assert pool.replica_of("s") != home, "the session moved off the stalled replica"
    [stall] = pool.stalls
    assert stall.address == home and stall.kind == StallKind.NO_TOKENS
    assert stall.quiet_s >= STALL_S and stall.active_requests == 1  # what the server reported
    assert f"{home} stalled (no_tokens)" in caplog.text and "1 requests running" in caplog.text
    assert metric(pool, "t1_inference_stalls_total") == 1
    assert metric(pool, "t1_inference_failovers_total") == 1
    assert res.cached_tokens == 0, "the other replica prefilled the whole context"
    expected = await backend(req(context, "", 2, max_tokens=30))
    assert res.token_ids.tolist() == expected.token_ids.tolist()
    for _ in range(50):  # the held request was cancelled on the stalled server
        if servers[home].cancelled:
            break
        await asyncio.sleep(0.05)
    assert servers[home].cancelled == 1
    await pool.close()


async def test_with_kv_admission_the_stalled_replicas_session_takes_its_room_along(servers) -> None:
    """KV admission on: the turn cut off by the stall gives up its room on the stalled replica, and the session
    is admitted on the other one, which then holds its whole context."""
    pool = stall_pool(list(servers), kv_admission=True, kv_expected_context_tokens=1000)
    context = prompt(30, seed=5)
    first = await pool(req(context, "s", 1))
    home = pool.replica_of("s")
    assert home is not None and pool.kv_usage()[home][1] == 30 + len(first.token_ids)
    context = np.concatenate([context, first.token_ids, prompt(4, seed=6)])
    servers[home].hold_generation(True)
    res = await pool(req(context, "s", 2, max_tokens=30))
    other = pool.replica_of("s")
    assert other != home and len(pool.stalls) == 1
    assert {address: held for address, (_, held) in pool.kv_usage().items()} == {
        home: 0, other: len(context) + len(res.token_ids)}
    pool.end_session("s")
    assert all(held == 0 for _, held in pool.kv_usage().values())
    await pool.close()


async def test_a_weight_load_that_never_finishes_is_a_stall(servers, tiny_model_dir) -> None:
    pool = stall_pool(list(servers), weights_timeout_s=0.3, stall_s=600)  # only the load can be the verdict
    first = await pool(req(prompt(20, seed=1), "w", 1))
    home = pool.replica_of("w")
    assert home is not None
    held = servers[home]
    held.hold_generation(True)
    load = asyncio.create_task(held.load_version(str(tiny_model_dir), 1))  # the server's own load (follow)
    context = np.concatenate([prompt(20, seed=1), first.token_ids])
    res = await pool(req(context, "w", 2, max_tokens=12))
    assert len(res.token_ids) == 12 and pool.replica_of("w") != home
    [stall] = pool.stalls
    assert stall.kind == StallKind.WEIGHTS_LOAD and stall.weights_loading_s > 0.3
    load.cancel()
    await asyncio.gather(load, return_exceptions=True)
    await pool.close()


async def test_a_turn_interrupted_mid_generation_keeps_every_route(servers, backend) -> None:
    """Turn 3 of 5 is cut off after some of its tokens streamed; its retry on the other replica gives a
    trajectory whose routing covers every position (but the last, which nothing processed) exactly as
    an uninterrupted run does, aligned with ids that do not drift by one token."""
    pool = stall_pool(list(servers))
    start = prompt(24, seed=9)
    context, reference = start, start
    blocks, reference_blocks = [], []
    for turn in range(5):
        seed, extra = 40 + turn, prompt(3, seed=100 + turn) if turn < 4 else prompt(0)  # ends on a sampled id
        task = asyncio.create_task(pool(req(context, "long", seed, max_tokens=24)))
        if turn == 2:
            home = pool.replica_of("long")
            assert home is not None
            held = servers[home]
            before = held.completed_tokens
            while held.completed_tokens < before + 6:  # mid-generation: some tokens streamed already
                await asyncio.sleep(0.005)
            held.hold_generation(True)
        res: GenerateResult = await task
        expected = await backend(req(reference, "ref", seed, max_tokens=24))
        assert res.routing is not None and expected.routing is not None
        blocks.append(res.routing)
        reference_blocks.append(expected.routing)
        context = np.concatenate([context, res.token_ids, extra])
        reference = np.concatenate([reference, expected.token_ids, extra])
    assert len(pool.stalls) == 1 and metric(pool, "t1_inference_failovers_total") == 1
    assert blocks[2].start == 0, "the retry prefilled the whole context on the other replica"
    drift = int((context != reference).sum()) if len(context) == len(reference) else -1
    assert drift == 0
    routing, _ = concat_blocks(blocks, len(context))
    ref_routing, _ = concat_blocks(reference_blocks, len(reference))
    assert routing is not None and ref_routing is not None
    report = validate_routing(routing[:-1], num_tokens=len(context) - 1)  # the last token was never processed
    assert report.coverage == 1.0
    np.testing.assert_array_equal(routing, ref_routing)  # the retried turn's routes are the uninterrupted run's
    await pool.close()


async def test_a_long_prefill_is_progress_not_a_stall(tiny_model_dir: Path) -> None:
    """No token comes out while a long prompt is prefilled (one position per model step here), yet the
    server's model steps move: the watch leaves it alone."""
    from t1.inference.server.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir, prefill_chunk=1)
    server = GrpcServer([inference_binding(backend)], ServerConfig(port=0, grace_s=0.2), AuthConfig())
    await server.start()
    pool = stall_pool([server.address], stall_s=0.3, stall_check_s=0.05)
    res = await pool(req(prompt(1500, seed=4), "p", 1, max_tokens=4))
    assert backend.num_steps >= 1500 and len(res.token_ids) == 4
    assert pool.stalls == [] and res.cached_tokens == 0
    await pool.close()
    await server.stop()
    await backend.close()
