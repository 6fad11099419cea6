"""The trainer link under a trainer that breaks its stream mid-write, many times, over real gRPC on loopback.

The server follows TrainerService's contract (ack by id once durable, DUPLICATE for ids it holds)
and, seeded, breaks calls the ways a real trainer's do: an abort with a status after a few
messages, a clean end of the stream, a record made durable but the call aborted before its ack,
a stall (the link's large writes wait on flow control) ended by an abort, and whole-server
restarts on the same port with calls in flight. Meanwhile the coordinator side keeps appending.
After it: every record reached the trainer, each was ACCEPTED exactly once and removed from the
spool by exactly one ack, the link never died, and nothing was logged at ERROR (in particular no
"aclose(): asynchronous generator is already running" from a request iterator grpc closed).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from t1.config.shared import AuthConfig, ServerConfig
from t1.coordinator.spool.trajectory_spool import Spool
from t1.coordinator.trainer_side.trainer_link import TrainerLink
from t1.rpc.loop import cancel_and_wait
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

FAULTS = ("abort", "end", "durable-no-ack", "stall-abort")


class FlakyTrainer(pb_grpc.TrainerServiceServicer):
    """A contract trainer whose every call breaks, after a seeded number (0-6) of messages, in a seeded way."""

    def __init__(self, held: dict[str, bytes], accepted: Counter[str], rng: random.Random) -> None:
        self.held = held
        self.accepted = accepted
        self.rng = rng
        self.faults: Counter[str] = Counter()

    async def PushTrajectories(self, request_iterator: AsyncIterator[pb.TrajectoryEnvelope],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.PushAck]:
        fault = self.rng.choice(FAULTS)
        after = self.rng.randint(0, 6)
        n = 0
        async for env in request_iterator:
            if n == after:
                self.faults[fault] += 1
                if fault == "end":
                    return
                if fault == "durable-no-ack" and env.trajectory_id not in self.held:
                    self.held[env.trajectory_id] = env.payload
                    self.accepted[env.trajectory_id] += 1
                if fault == "stall-abort":
                    await asyncio.sleep(self.rng.uniform(0.05, 0.3))  # the client's writes back up meanwhile
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"chaos: {fault} after {n} messages")
            n += 1
            if env.trajectory_id in self.held:
                yield pb.PushAck(trajectory_id=env.trajectory_id, status=pb.ACK_STATUS_DUPLICATE)
            else:
                self.held[env.trajectory_id] = env.payload
                self.accepted[env.trajectory_id] += 1
                yield pb.PushAck(trajectory_id=env.trajectory_id, status=pb.ACK_STATUS_ACCEPTED)


async def _serve(servicer: FlakyTrainer, port: int = 0) -> GrpcServer:
    server = GrpcServer([ServiceBinding("t1.v1.TrainerService", pb_grpc.add_TrainerServiceServicer_to_server,
                                        servicer)], ServerConfig(port=port), AuthConfig())
    await server.start()
    return server


def _payload(i: int, rng: random.Random) -> bytes:
    size = rng.choice((16, 4096, 300_000, 1_500_000))  # large ones are mid-write when a call breaks
    return (f"payload-{i}-".encode() * (size // 10 + 1))[:size]


def _another_loops_event(ctx: dict) -> bool:
    """grpc's one process-wide completion queue handing this loop an event of an earlier test's closed loop.

    Its poller drains every loop's events from the loop that reads its socket and forwards a foreign one with
    call_soon_threadsafe, which raises "Event loop is closed" here when a call of an earlier test (same worker
    process, another loop) completes late. Not this test's link, and nothing of this loop's is lost: the poller's
    socket holds a byte per event, so the events queued behind it are read on the next wake-up.
    """
    exc = ctx.get("exception")
    return (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
            and "PollerCompletionQueue._handle_events" in repr(ctx.get("handle")))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])  # about 8 s each
async def test_link_recovers_from_every_kind_of_broken_stream_losing_and_duplicating_nothing(
        tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    loop_errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _loop, ctx: None if _another_loops_event(ctx) else loop_errors.append(ctx))
    rng = random.Random(seed)
    held: dict[str, bytes] = {}
    accepted: Counter[str] = Counter()
    servicer = FlakyTrainer(held, accepted, random.Random(seed + 100))
    server = await _serve(servicer)
    port = server.port
    assert port is not None
    spool = Spool.open(tmp_path / "spool", max_bytes=64 << 20, segment_bytes=2 << 20, fsync=False)
    acked: Counter[str] = Counter()
    ack = spool.ack

    def counting_ack(trajectory_id: str) -> bool:
        removed = ack(trajectory_id)
        acked[trajectory_id] += removed
        return removed

    spool.ack = counting_ack  # type: ignore[method-assign]
    link = TrainerLink(spool, f"127.0.0.1:{port}", backoff_s=0.01, max_backoff_s=0.05)
    task = asyncio.create_task(link.run())
    payloads = {f"t{i}": _payload(i, rng) for i in range(160)}
    restarts = 0
    try:
        for i, (tid, payload) in enumerate(payloads.items()):
            await spool.wait_for_room()
            await spool.append(tid, payload)
            if i % 40 == 39:  # the whole trainer goes away with calls in flight, and comes back on its port
                await server.stop(0)
                await asyncio.sleep(rng.uniform(0.0, 0.2))
                server = await _serve(servicer, port)
                restarts += 1
            await asyncio.sleep(rng.uniform(0.0, 0.01))
            assert not task.done(), f"the link died: {task.exception() if not task.cancelled() else 'cancelled'}"
        async with asyncio.timeout(150):
            while spool.pending_count:
                assert not task.done(), f"the link died: {task.exception() if not task.cancelled() else 'cancelled'}"
                await asyncio.sleep(0.05)
    finally:
        await cancel_and_wait(task)
        spool.close()
        await server.stop(0)
    for _ in range(3):  # any generator grpc left suspended is finalized now, and its error logged
        gc.collect()
        await asyncio.sleep(0.05)
    assert held == payloads, "every record reached the trainer intact"
    assert set(accepted.values()) == {1}, f"accepted more than once: {[t for t, c in accepted.items() if c > 1]}"
    assert acked == Counter(dict.fromkeys(payloads, 1)), "each record removed from the spool by exactly one ack"
    assert sum(servicer.faults.values()) >= 30 and len(servicer.faults) == 4, servicer.faults
    assert restarts == 4 and link.reconnects >= 30
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert not [r for r in caplog.records if "already running" in r.getMessage()]
    assert not loop_errors, loop_errors
    assert any("chaos:" in r.getMessage() for r in caplog.records
               if r.name == "t1.coordinator.trainer_side.trainer_link")


class RejectingTrainer(pb_grpc.TrainerServiceServicer):
    """Rejects every record (a record no model could take) and counts what it saw."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def PushTrajectories(self, request_iterator: AsyncIterator[pb.TrajectoryEnvelope],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.PushAck]:
        async for env in request_iterator:
            self.seen[env.trajectory_id] += 1
            yield pb.PushAck(trajectory_id=env.trajectory_id, status=pb.ACK_STATUS_REJECTED, error="ids out of vocab")


async def test_a_rejected_record_that_cannot_be_kept_aside_stays_in_the_spool(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    servicer = RejectingTrainer()
    server = GrpcServer([ServiceBinding("t1.v1.TrainerService", pb_grpc.add_TrainerServiceServicer_to_server,
                                        servicer)], ServerConfig(port=0), AuthConfig())
    await server.start()
    port = server.port
    spool = Spool.open(tmp_path / "spool", max_bytes=1 << 20, segment_bytes=1 << 20, fsync=False)
    blocker = tmp_path / "spool" / "rejected"
    blocker.write_text("a file where the rejected/ directory goes: keeping a record aside fails")
    link = TrainerLink(spool, f"127.0.0.1:{port}", backoff_s=0.01, max_backoff_s=0.05)
    task = asyncio.create_task(link.run())
    try:
        await spool.append("bad-1", b"payload")
        async with asyncio.timeout(10):
            while not servicer.seen["bad-1"]:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert not task.done(), "the link lives on"
        assert spool.pending_count == 1, "not acked while it could not be kept"
        assert any("cannot keep it aside" in r.getMessage() and "bad-1" in r.getMessage() for r in caplog.records)
        blocker.unlink()  # the disk is fixed; the next connection sends it again and it is kept
        await server.stop(0)
        server = GrpcServer([ServiceBinding("t1.v1.TrainerService", pb_grpc.add_TrainerServiceServicer_to_server,
                                            servicer)], ServerConfig(port=port), AuthConfig())
        await server.start()
        async with asyncio.timeout(10):
            while spool.pending_count:
                await asyncio.sleep(0.02)
        assert (blocker / "bad-1.msgpack").read_bytes() == b"payload"
        assert "ids out of vocab" in (blocker / "bad-1.error.txt").read_text()
    finally:
        await cancel_and_wait(task)
        spool.close()
        await server.stop(0)
