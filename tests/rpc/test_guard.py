"""Issue 19 case 8 at the gRPC edge, on a real loopback server: garbage bodies get INVALID_ARGUMENT (no
traceback), oversized control bodies RESOURCE_EXHAUSTED before parsing, unauthenticated bodies are
never parsed, and every kind of method still works through the guard."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest

from t1.config.shared import AuthConfig, ServerConfig
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.v1 import coordinator_pb2 as cpb
from t1.v1 import coordinator_pb2_grpc as cpb_grpc
from t1.v1 import trainer_pb2 as tpb
from t1.v1 import trainer_pb2_grpc as tpb_grpc

GARBAGE = b"\xff\xff\xff\xff\x0f"


class Coordinator(cpb_grpc.CoordinatorServiceServicer):
    parsed = 0

    async def GetJob(self, request: cpb.GetJobRequest, context: grpc.aio.ServicerContext) -> cpb.EvalJob:
        Coordinator.parsed += 1
        return cpb.EvalJob(job_id=request.job_id)

    async def WatchJob(self, request: cpb.WatchJobRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[cpb.JobEvent]:
        for i in range(3):
            yield cpb.JobEvent(job_id=f"{request.job_id}-{i}")


class Trainer(tpb_grpc.TrainerServiceServicer):
    async def PushTrajectories(self, request_iterator: AsyncIterator[tpb.TrajectoryEnvelope],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[tpb.PushAck]:
        async for env in request_iterator:
            yield tpb.PushAck(trajectory_id=env.trajectory_id)


async def _server(token: str | None = None) -> GrpcServer:
    bindings = [ServiceBinding("t1.v1.CoordinatorService", cpb_grpc.add_CoordinatorServiceServicer_to_server,
                               Coordinator(), max_request_bytes=1 << 20),
                ServiceBinding("t1.v1.TrainerService", tpb_grpc.add_TrainerServiceServicer_to_server, Trainer())]
    server = GrpcServer(bindings, ServerConfig(port=0, grace_s=0.1), AuthConfig(token=token))
    await server.start()
    return server


def _raw(ch: grpc.aio.Channel, method: str, stream: bool = False) -> Any:
    return ch.unary_stream(method) if stream else ch.unary_unary(method)


async def _code(call: Awaitable[object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        result = await call
        assert result is None
    return info.value.code(), info.value.details() or ""


async def test_bad_bodies_get_status_codes_not_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    server = await _server()
    caplog.set_level(logging.ERROR)
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            code, details = await _code(_raw(ch, "/t1.v1.CoordinatorService/GetJob")(GARBAGE, timeout=5))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "GetJob" in details and "not a valid" in details
            stream = ch.unary_stream("/t1.v1.CoordinatorService/WatchJob")(GARBAGE, timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                _ = [x async for x in stream]
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            code, details = await _code(_raw(ch, "/t1.v1.CoordinatorService/GetJob")(b"\x0a" + b"\x00" * (2 << 20),
                                                                                     timeout=10))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 1048576" in details
            push = ch.stream_stream("/t1.v1.TrainerService/PushTrajectories")
            call = push(timeout=5)
            await call.write(tpb.TrajectoryEnvelope(trajectory_id="ok").SerializeToString())
            await call.write(GARBAGE)
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                _ = [x async for x in call]
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            # Sound requests of every cardinality still pass through.
            job = await cpb_grpc.CoordinatorServiceStub(ch).GetJob(cpb.GetJobRequest(job_id="j"), timeout=5)
            assert job.job_id == "j"
            events = [e.job_id async for e in cpb_grpc.CoordinatorServiceStub(ch).WatchJob(
                cpb.WatchJobRequest(job_id="w"), timeout=5)]
            assert events == ["w-0", "w-1", "w-2"]
            acks = [a.trajectory_id async for a in tpb_grpc.TrainerServiceStub(ch).PushTrajectories(
                iter([tpb.TrajectoryEnvelope(trajectory_id=f"t{i}") for i in range(3)]), timeout=5)]
            assert acks == ["t0", "t1", "t2"]
    finally:
        await server.stop(0)
    assert not [r for r in caplog.records if "deserializ" in r.getMessage().lower() or r.exc_info], \
        [r.getMessage() for r in caplog.records]


async def test_unauthenticated_bodies_are_never_parsed() -> None:
    server = await _server(token="s3cret")
    Coordinator.parsed = 0
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            code, _ = await _code(_raw(ch, "/t1.v1.CoordinatorService/GetJob")(GARBAGE, timeout=5))
            assert code == grpc.StatusCode.UNAUTHENTICATED, "refused before the body was looked at"
            code, _ = await _code(cpb_grpc.CoordinatorServiceStub(ch).GetJob(cpb.GetJobRequest(job_id="x"), timeout=5))
            assert code == grpc.StatusCode.UNAUTHENTICATED and Coordinator.parsed == 0
            job = await cpb_grpc.CoordinatorServiceStub(ch).GetJob(
                cpb.GetJobRequest(job_id="x"), timeout=5, metadata=(("authorization", "Bearer s3cret"),))
            assert job.job_id == "x" and Coordinator.parsed == 1
    finally:
        await server.stop(0)
