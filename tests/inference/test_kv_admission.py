"""Admission by KV headroom with real torch-backend gRPC servers on loopback: a server reports its KV
capacity and use in tokens, a new session waits while its server is full and starts once another
session ends there, and a resident session keeps taking turns when only it could free room."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from inference_helpers import prompt

from t1.config.inference import InferencePoolConfig
from t1.config.service import AuthConfig, ServerConfig
from t1.inference.pool import InferencePool
from t1.inference.server import inference_binding
from t1.inference.types import GenerateRequest, SamplingParams
from t1.rpc.client import make_channel
from t1.rpc.server import GrpcServer
from t1.v1 import inference_pb2 as pb
from t1.v1.inference_pb2_grpc import InferenceServiceStub


def req(ids: np.ndarray, session: str, seed: int, max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(seed=seed, max_tokens=max_tokens))


@pytest.fixture
async def small_server(tiny_model_dir: Path):
    """One server whose KV budget (session_cache_mb=4) holds 2730 positions of the tiny model."""
    from t1.inference.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir, session_cache_mb=4)
    server = GrpcServer([inference_binding(backend)], ServerConfig(port=0, grace_s=0.2), AuthConfig())
    await server.start()
    yield server.address, backend
    await server.stop()
    await backend.close()


async def test_a_new_session_waits_for_room_on_a_full_server_and_starts_when_one_ends(small_server) -> None:
    address, backend = small_server
    capacity, used = backend.kv_usage()
    assert (capacity, used) == (2730, 0)
    pool = InferencePool(InferencePoolConfig(kv_admission=True, backoff_s=0.01), [address])
    first = await pool(req(prompt(700, seed=1), "a", 1))
    info = await InferenceServiceStub(make_channel(address, AuthConfig())).GetModelInfo(pb.GetModelInfoRequest())
    # The server counts what its cache costs (its KV slot row's whole capacity, at least the 707 positions it holds).
    assert info.kv_capacity_tokens == 2730 and 707 <= info.kv_used_tokens <= 2730
    assert pool.kv_usage() == {address: (2730, 708)}

    # 708 held + 2100 + 8 > 2730: "b" is not admitted while "a" holds its context.
    waiting = asyncio.create_task(pool(req(prompt(2100, seed=2), "b", 2)))
    await asyncio.sleep(1.0)
    assert not waiting.done() and pool.kv_usage() == {address: (2730, 708)}

    # "a" is resident and nothing else runs there: its next turn starts (the preemption rule).
    context = np.concatenate([prompt(700, seed=1), first.token_ids, prompt(4, seed=3)])
    second = await pool(req(context, "a", 3))
    assert len(second.token_ids) == 8 and not waiting.done()

    pool.end_session("a")  # the episode ended: its room frees, "b" starts
    res = await asyncio.wait_for(waiting, 60)
    expected = await backend(req(prompt(2100, seed=2), "", 2))
    assert res.token_ids.tolist() == expected.token_ids.tolist()
    registry = pool.metrics.registry
    assert registry.get_sample_value("t1_inference_kv_waits_total") == 1
    assert (registry.get_sample_value("t1_inference_kv_wait_seconds_total") or 0) >= 1.0
    assert pool.kv_usage() == {address: (2730, 2108)}
    await pool.close()


async def test_without_kv_admission_the_same_session_is_not_held_back(small_server) -> None:
    """The control: the pool's default (kv_admission off) starts "b" at once on the full server."""
    address, _ = small_server
    pool = InferencePool(InferencePoolConfig(backoff_s=0.01), [address])
    await pool(req(prompt(700, seed=1), "a", 1))
    res = await asyncio.wait_for(pool(req(prompt(2100, seed=2), "b", 2)), 60)
    assert len(res.token_ids) == 8 and pool.kv_usage() == {}
    await pool.close()
