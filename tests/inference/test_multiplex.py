"""GenerateBatched over real gRPC on 127.0.0.1: the pool's default transport, with the real torch backend."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from inference_helpers import prompt

from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.pool import InferencePool, InferenceUnavailable
from t1.inference.convert import request_to_proto
from t1.inference.multiplex import BatchedSession
from t1.inference.server.servicer import InferenceServicer
from t1.inference.types import GenerateRequest, SamplingParams
from t1.rpc.client import make_channel
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.rpc.tensors import to_tensor
from t1.v1 import inference_pb2 as pb
from t1.v1 import inference_pb2_grpc


def req(ids: np.ndarray, session: str = "", **sampling) -> GenerateRequest:
    sampling.setdefault("seed", 5)
    sampling.setdefault("max_tokens", 10)
    return GenerateRequest(session, ids.astype(np.int32), SamplingParams(**sampling))


async def start_server(servicer: InferenceServicer) -> GrpcServer:
    """A loopback InferenceService around this servicer (its backend may be wrapped)."""
    server = GrpcServer(
        [ServiceBinding("t1.v1.InferenceService", inference_pb2_grpc.add_InferenceServiceServicer_to_server, servicer)],
        ServerConfig(host="127.0.0.1", port=0, grace_s=0.5),
        AuthConfig(),
    )
    await server.start()
    return server


async def raw_stream(address: str, messages: list[pb.GenerateBatchRequest]) -> list[pb.GenerateBatchReply]:
    """Send these messages on one GenerateBatched stream, close it, and return every reply."""
    async def requests() -> AsyncIterator[pb.GenerateBatchRequest]:
        for m in messages:
            yield m

    async with make_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        return [r async for r in stub.GenerateBatched(requests(), timeout=60)]


async def test_batched_results_equal_generate_calls(served) -> None:
    """Same seeded requests, both transports: identical ids, versions, routing and cache counts; logprobs to
    rounding."""
    prompts = [prompt(20 + 3 * i, seed=i) for i in range(6)]
    calls = InferencePool(InferencePoolConfig(batched_stream=False), [served])
    batched = InferencePool(InferencePoolConfig(), [served])
    try:
        want = [await calls(req(p, f"c{i}")) for i, p in enumerate(prompts)]
        got = await asyncio.gather(*(batched(req(p, f"b{i}")) for i, p in enumerate(prompts)))
        follow = np.concatenate([prompts[0], got[0].token_ids, prompt(5, seed=99)])
        again = await batched(req(follow, "b0"))  # same session: served from its cache
    finally:
        await calls.close()
        await batched.close()
    for w, g in zip(want, got, strict=True):
        assert g.token_ids.tolist() == w.token_ids.tolist()
        # The concurrent requests share decode forwards (any lengths batch), the sequential ones do
        # not: logprobs differ by the rounding of batched matmuls only.
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(g.token_versions, w.token_versions)
        assert g.finish_reason == w.finish_reason and g.prompt_tokens == w.prompt_tokens
        assert g.routing is not None and w.routing is not None
        assert g.routing.start == w.routing.start
        np.testing.assert_array_equal(np.sort(g.routing.experts, -1), np.sort(w.routing.experts, -1))
    assert again.cached_tokens > len(prompts[0]) and again.prompt_tokens == len(follow)


async def test_bad_request_fails_alone_naming_the_field(served) -> None:
    pool = InferencePool(InferencePoolConfig(), [served])
    bad = GenerateRequest("s-bad", np.array([3, 99999], np.int32), SamplingParams(max_tokens=4))
    try:
        results = await asyncio.gather(pool(req(prompt(12), "s-ok")), pool(bad), return_exceptions=True)
    finally:
        await pool.close()
    ok, err = results
    assert not isinstance(ok, BaseException) and len(ok.token_ids) > 0
    assert isinstance(err, grpc.aio.AioRpcError)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt_ids" in (err.details() or "")


async def test_missing_and_duplicate_request_ids_are_refused(served) -> None:
    good = request_to_proto(req(prompt(10)), "r1")
    twin = request_to_proto(req(prompt(11)), "r1")
    nameless = request_to_proto(req(prompt(9)), "")
    replies = await raw_stream(served, [pb.GenerateBatchRequest(requests=[good, twin, nameless])])
    results = [r for reply in replies for r in reply.results]
    by_error = {(r.request_id, r.error_code) for r in results}
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert ("r1", invalid) in by_error and ("", invalid) in by_error
    assert any(r.request_id == "r1" and r.error_code == 0 and len(r.token_ids.data) > 0 for r in results)
    assert all("request_id" in r.error_message for r in results if r.error_code)


class _Held:
    """The real backend, except that requests for session "held" wait (until cancelled) once started."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.started = asyncio.Event()

    def stream(self, request: GenerateRequest):
        if request.session_id != "held":
            return self.inner.stream(request)
        return self._hold()

    async def _hold(self):
        self.started.set()
        await asyncio.Event().wait()
        yield  # never reached: makes this an async generator

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_client_cancel_stops_the_request_on_the_server(backend) -> None:
    held = _Held(backend)
    servicer = InferenceServicer(held)  # type: ignore[arg-type]
    server = await start_server(servicer)
    pool = InferencePool(InferencePoolConfig(), [server.address])
    try:
        waiting = asyncio.create_task(pool(req(prompt(16), "held")))
        await asyncio.wait_for(held.started.wait(), 30)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(200):
            if servicer.cancelled:
                break
            await asyncio.sleep(0.05)
        assert servicer.cancelled == 1
        after = await pool(req(prompt(8), "next"))  # the stream still serves
        assert len(after.token_ids) > 0
    finally:
        await pool.close()
        await server.stop()


async def test_deadline_raises_and_cancels_on_the_server(backend) -> None:
    held = _Held(backend)
    servicer = InferenceServicer(held)  # type: ignore[arg-type]
    server = await start_server(servicer)
    pool = InferencePool(InferencePoolConfig(request_timeout_s=0.5, retries=0), [server.address])
    try:
        with pytest.raises(InferenceUnavailable) as err:
            await pool(req(prompt(16), "held"))
        cause = err.value.__cause__
        assert isinstance(cause, grpc.aio.AioRpcError) and cause.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(200):
            if servicer.cancelled:
                break
            await asyncio.sleep(0.05)
        assert servicer.cancelled == 1
    finally:
        await pool.close()
        await server.stop()


class _CallsOnly(InferenceServicer):
    """A server from before GenerateBatched: the generated base answers UNIMPLEMENTED."""

    GenerateBatched = inference_pb2_grpc.InferenceServiceServicer.GenerateBatched  # type: ignore[assignment]


async def test_server_without_batched_stream_is_served_by_calls(backend, caplog) -> None:
    server = await start_server(_CallsOnly(backend))
    pool = InferencePool(InferencePoolConfig(retries=0), [server.address])
    try:
        with caplog.at_level(logging.WARNING, logger="t1.inference.client.pool"):
            first = await pool(req(prompt(12), "a"))
            second = await pool(req(prompt(13), "b"))
    finally:
        await pool.close()
        await server.stop()
    assert len(first.token_ids) > 0 and len(second.token_ids) > 0
    assert sum("no GenerateBatched" in r.getMessage() for r in caplog.records) == 1


async def test_ready_results_share_one_reply_message() -> None:
    """Results that finish together leave in one message: the stream's whole point under load."""
    release = asyncio.Event()

    async def run_one(request: pb.GenerateRequest) -> pb.GenerateResult:
        await release.wait()
        return pb.GenerateResult(token_ids=to_tensor(np.array([1], np.int32)))

    async def requests() -> AsyncIterator[pb.GenerateBatchRequest]:
        yield pb.GenerateBatchRequest(requests=[pb.GenerateRequest(request_id=f"r{i}") for i in range(20)])
        await asyncio.sleep(0.05)
        release.set()

    replies = [r async for r in BatchedSession(run_one).serve(requests())]
    assert [len(r.results) for r in replies] == [20]
    assert sorted(r.request_id for r in replies[0].results) == sorted(f"r{i}" for i in range(20))


async def test_linger_packs_results_that_finish_apart() -> None:
    async def run_one(request: pb.GenerateRequest) -> pb.GenerateResult:
        await asyncio.sleep(0.02 * int(request.request_id[1:]))  # r0..r4 finish 20 ms apart
        return pb.GenerateResult(token_ids=to_tensor(np.array([1], np.int32)))

    async def requests() -> AsyncIterator[pb.GenerateBatchRequest]:
        yield pb.GenerateBatchRequest(requests=[pb.GenerateRequest(request_id=f"r{i}") for i in range(5)])

    eager = [len(r.results) async for r in BatchedSession(run_one).serve(requests())]
    lingering = [len(r.results) async for r in BatchedSession(run_one, linger_s=0.5).serve(requests())]
    assert eager == [1, 1, 1, 1, 1] and lingering == [5]


async def test_a_reply_message_stops_taking_results_at_its_byte_budget() -> None:
    """A starved server that finds hundreds of results ready must not send them as one message of
    tens of MB: receiving it is one uninterrupted step of the coordinator's loop. A result bigger
    than the budget still travels."""
    release = asyncio.Event()
    sizes = {"r0": 700_000, "r1": 700_000, "r2": 700_000, "r3": 700_000, "r4": 3_000_000, "r5": 100}

    async def run_one(request: pb.GenerateRequest) -> pb.GenerateResult:
        await release.wait()
        n = sizes[request.request_id] // 4
        return pb.GenerateResult(token_ids=to_tensor(np.zeros(n, np.int32)))

    async def requests() -> AsyncIterator[pb.GenerateBatchRequest]:
        yield pb.GenerateBatchRequest(requests=[pb.GenerateRequest(request_id=r) for r in sizes])
        await asyncio.sleep(0.05)
        release.set()

    replies = [r async for r in BatchedSession(run_one, max_batch_bytes=2 << 20).serve(requests())]
    got = [[res.request_id for res in r.results] for r in replies]
    assert sorted(r for g in got for r in g) == sorted(sizes)
    assert [len(g) for g in got] == [3, 2, 1], got  # 2.1 MB reaches the budget, r3 + r4 (3.7 MB) too
    assert all(r.ByteSize() < (2 << 20) + 3_100_000 for r in replies)


def test_a_request_message_stops_taking_prompts_at_its_byte_budget() -> None:
    from t1.inference.multiplex import MAX_BATCH_REQUESTS, _fitting

    def request(tokens: int) -> pb.GenerateRequest:
        return pb.GenerateRequest(prompt_ids=to_tensor(np.zeros(tokens, np.int32)))

    big = [request(200_000) for _ in range(5)]  # 800 KB of prompt each
    assert _fitting(big, 2 << 20) == 3  # the third reaches 2 MB
    assert _fitting([request(10_000_000)], 2 << 20) == 1  # one over the budget still goes
    assert _fitting([request(10) for _ in range(600)], 2 << 20) == MAX_BATCH_REQUESTS
    assert _fitting([request(10) for _ in range(7)], 2 << 20) == 7
