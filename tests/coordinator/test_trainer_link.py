"""Spool -> trainer delivery over real gRPC: exactly once across restarts of either side, back-pressure.

The trainer here follows TrainerService's contract (ack by id once durable, DUPLICATE for ids it
already holds, REJECTED for malformed records) without DeepSpeed behind it; its `held` dict
survives its restarts the way the real trainer's SQLite buffer does.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from t1.config.shared import AuthConfig, ServerConfig
from t1.coordinator.spool.trajectory_spool import Spool
from t1.coordinator.trainer_side.trainer_link import TrainerLink
from t1.rpc.loop import cancel_and_wait
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc


class ContractTrainer(pb_grpc.TrainerServiceServicer):
    def __init__(self, held: dict[str, bytes], ack_delay_s: float = 0.0) -> None:
        self.held = held
        self.ack_delay_s = ack_delay_s
        self.received: Counter[str] = Counter()

    async def PushTrajectories(self, request_iterator: AsyncIterator[pb.TrajectoryEnvelope],
                               context: grpc.aio.ServicerContext) -> AsyncIterator[pb.PushAck]:
        async for env in request_iterator:
            self.received[env.trajectory_id] += 1
            await asyncio.sleep(self.ack_delay_s)
            if env.payload == b"bad":
                yield pb.PushAck(trajectory_id=env.trajectory_id, status=pb.ACK_STATUS_REJECTED, error="not msgpack")
            elif env.trajectory_id in self.held:
                yield pb.PushAck(trajectory_id=env.trajectory_id, status=pb.ACK_STATUS_DUPLICATE)
            else:
                self.held[env.trajectory_id] = env.payload
                yield pb.PushAck(trajectory_id=env.trajectory_id, status=pb.ACK_STATUS_ACCEPTED)


async def _start(held: dict[str, bytes], port: int = 0, ack_delay_s: float = 0.0) -> tuple[GrpcServer, ContractTrainer]:
    servicer = ContractTrainer(held, ack_delay_s)
    server = GrpcServer(
        [ServiceBinding("t1.v1.TrainerService", pb_grpc.add_TrainerServiceServicer_to_server, servicer)],
        ServerConfig(port=port),
        AuthConfig(),
    )
    await server.start()
    return server, servicer


async def _until(cond, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


async def test_delivery_survives_trainer_outage_and_coordinator_restart(tmp_path: Path) -> None:
    held: dict[str, bytes] = {}
    server, _ = await _start(held, ack_delay_s=0.05)
    port = server.port
    spool = Spool.open(tmp_path / "spool", max_bytes=1 << 20, segment_bytes=2048, fsync=False)
    link = TrainerLink(spool, f"127.0.0.1:{port}", backoff_s=0.05, max_backoff_s=0.2)
    task = asyncio.create_task(link.run())
    for i in range(20):
        await spool.append(f"t{i}", f"payload-{i}".encode())
    await _until(lambda: len(held) >= 5)
    # Coordinator "crash": drop the link and the spool without waiting for acks in flight.
    await cancel_and_wait(task)
    spool.close()
    # Trainer goes away too; the coordinator restarts and keeps rolling into the spool.
    await server.stop(0)
    spool = Spool.open(tmp_path / "spool", max_bytes=1 << 20, segment_bytes=2048, fsync=False)
    link = TrainerLink(spool, f"127.0.0.1:{port}", backoff_s=0.05, max_backoff_s=0.2)
    task = asyncio.create_task(link.run())
    for i in range(20, 30):
        await spool.append(f"t{i}", f"payload-{i}".encode())
    await asyncio.sleep(0.3)
    assert not link.connected and spool.pending_count >= 10
    # Trainer back on the same port with its durable buffer.
    server, _ = await _start(held, port=port)
    await _until(lambda: spool.pending_count == 0)
    assert held == {f"t{i}": f"payload-{i}".encode() for i in range(30)}, "every trajectory exactly once"
    assert link.reconnects >= 1
    await cancel_and_wait(task)
    spool.close()
    await server.stop(0)
    again = Spool.open(tmp_path / "spool", max_bytes=1 << 20, segment_bytes=2048)
    assert again.pending_count == 0, "acks survive the restart: nothing is re-sent"
    again.close()


async def test_rejected_records_are_kept_aside_and_do_not_block(tmp_path: Path) -> None:
    held: dict[str, bytes] = {}
    server, _ = await _start(held)
    spool = Spool.open(tmp_path / "spool", max_bytes=1 << 20, segment_bytes=1 << 20, fsync=False)
    link = TrainerLink(spool, server.address, backoff_s=0.05)
    task = asyncio.create_task(link.run())
    await spool.append("good-1", b"ok")
    await spool.append("bad-1", b"bad")
    await spool.append("good-2", b"ok2")
    await _until(lambda: spool.pending_count == 0)
    assert set(held) == {"good-1", "good-2"} and link.rejected == 1
    assert (tmp_path / "spool" / "rejected" / "bad-1.msgpack").read_bytes() == b"bad"
    await cancel_and_wait(task)
    spool.close()
    await server.stop(0)


async def test_spool_bound_holds_admission_while_trainer_is_down(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path / "spool", max_bytes=1000, segment_bytes=1 << 20, fsync=False)
    link = TrainerLink(spool, "127.0.0.1:1", backoff_s=0.05, max_backoff_s=0.1)
    task = asyncio.create_task(link.run())
    admitted = 0
    while True:
        try:
            async with asyncio.timeout(0.2):
                await spool.wait_for_room()
        except TimeoutError:
            break
        await spool.append(f"t{admitted}", b"x" * 300)
        admitted += 1
    assert admitted == 4 and not spool.has_room  # 3 x 300 < 1000 <= 4 x 300
    await cancel_and_wait(task)
    spool.close()
