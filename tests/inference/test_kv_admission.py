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
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.kv_admission import KvAdmission
from t1.inference.client.pool import InferencePool
from t1.inference.server.servicer import inference_binding
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
    from t1.inference.server.torch_backend import TorchBackend

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


async def test_episodes_are_admitted_by_their_learned_peak_and_resident_turns_are_never_held_back(small_server) -> None:
    """The prior (1000 positions an episode) admits two 300-token episodes on the 2730-position server and
    holds three more back. The first admitted ends at 308 positions: the expected peak is (4 x 1000 + 308) / 5
    (the prior weighs as four episodes), and two of the three start; the second ends too, and the third. A
    resident session's turn past every reservation then starts without a wait."""
    address, _ = small_server
    pool = InferencePool(InferencePoolConfig(kv_admission=True, kv_expected_context_tokens=1000, backoff_s=0.01),
                         [address])
    registry = pool.metrics.registry
    await pool(req(prompt(300, seed=1), "a", 1))
    await pool(req(prompt(300, seed=2), "b", 2))
    assert registry.get_sample_value("t1_inference_kv_waits_total") == 0
    later = [asyncio.create_task(pool(req(prompt(300, seed=s), f"n{s}", s))) for s in (3, 4, 5)]
    await asyncio.sleep(1.0)
    assert not any(t.done() for t in later)  # 1000 + 1000 reserved: 1000 more does not fit in 2730

    pool.end_session("a")  # expected peak 862: 862 x 3 fits, 862 x 4 does not
    for _ in range(600):
        if sum(t.done() for t in later) == 2:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.7)
    assert sum(t.done() for t in later) == 2
    pool.end_session("b")  # expected peak (4 x 1000 + 2 x 308) / 6 = 769: the third fits
    done = await asyncio.wait_for(asyncio.gather(*later), 60)
    assert [len(r.token_ids) for r in done] == [8, 8, 8]
    assert registry.get_sample_value("t1_inference_kv_waits_total") == 3
    assert pool.kv_usage() == {address: (2730, 3 * 308)}

    # "n3" is resident: a turn of 2308 positions starts at once though the others reserve 2 x 769 (3846 > 2730).
    long_context = np.concatenate([prompt(300, seed=3), done[0].token_ids, prompt(1992, seed=6)])
    assert len((await asyncio.wait_for(pool(req(long_context, "n3", 7)), 60)).token_ids) == 8
    assert registry.get_sample_value("t1_inference_kv_waits_total") == 3
    assert pool.kv_usage() == {address: (2730, 2 * 308 + 2308)}
    await pool.close()


class _Up:
    outstanding = 0
    unhealthy_until = 0.0

    def healthy(self, now: float) -> bool:
        return True


async def test_the_expected_peak_counts_episodes_in_admission_order_so_short_ones_ending_first_do_not_bias_it() -> None:
    kv = KvAdmission(1, expected_context=3000)
    kv.set_capacity(0, 10_000, max_context=32_768)

    async def turn(session: str, context: int) -> None:
        idx, _ = await kv.admit(session, context, lambda: 0, [_Up()])
        kv.finish(idx, session, context)

    await turn("long", 700)
    await turn("short", 700)
    await turn("long", 6000)
    await turn("short", 1000)
    kv.end("short")  # ended first, admitted second: it waits for "long"
    assert kv.expected_peak(0) == 3000
    # The reservations: "long" holds 6000, a new session 3000 (the prior): 9000 fits, one of 4001 does not.
    assert kv.fits(0, "new", 700) and not kv.fits(0, "new", 4001)
    kv.end("long")
    assert kv.expected_peak(0) == 3167  # (4 x 3000 + 6000 + 1000) / 6: both in, the prior weighs as four
    kv.end("never-admitted")
    assert kv.expected_peak(0) == 3167 and kv.usage(0) == (10_000, 0)

    alone = KvAdmission(1)  # no prior: an episode may grow to the model's context limit: one at a time
    alone.set_capacity(0, 10_000, max_context=32_768)
    assert alone.expected_peak(0) == 10_000  # the context limit, but no more than the capacity
    await alone.admit("x", 700, lambda: 0, [_Up()])
    assert not alone.fits(0, "y", 700) and alone.fits(0, "x", 9000)
