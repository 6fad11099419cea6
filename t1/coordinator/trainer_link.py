"""The trainer link: streams the spool to TrainerService.PushTrajectories and applies acks by id.

Each connection reads the spool from a fresh cursor, so everything not yet acknowledged
is sent again after a reconnect (the trainer answers DUPLICATE for what it already has).
ACCEPTED and DUPLICATE acks remove the record from the spool; a REJECTED record will never
be accepted, so it is moved to `rejected/` beside the spool (kept for a person) and acked.
When the trainer is unreachable the link retries with backoff while rollouts keep filling
the spool up to its bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from t1.config.service import AuthConfig
from t1.coordinator.spool import Spool
from t1.metrics import registry as m
from t1.rpc.client import call_options, make_channel
from t1.rpc.options import STREAM_DEADLINE_S
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class TrainerLink:
    """`await run()` until cancelled; `connected` tells whether the stream is open now."""

    def __init__(self, spool: Spool, target: str, auth: AuthConfig | None = None, backoff_s: float = 0.5,
                 max_backoff_s: float = 10.0) -> None:
        self.spool = spool
        self.target = target
        self._auth = auth or AuthConfig()
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self.connected = False
        self.sent = 0
        self.rejected = 0
        self.reconnects = 0
        self._rejected_dir = spool.directory / "rejected"

    async def run(self) -> None:
        delay = self._backoff_s
        channel = make_channel(self.target, self._auth)
        try:
            while True:
                try:
                    await self._stream(pb_grpc.TrainerServiceStub(channel))
                    delay = self._backoff_s
                except grpc.aio.AioRpcError as err:  # the fault-tolerance point: the trainer is away
                    log.warning("trainer link to %s: %s: %s; %d trajectories wait in the spool (retry in %.1fs)",
                                self.target, err.code().name, err.details(), self.spool.pending_count, delay)
                finally:
                    self.connected = False
                    m.TRAINER_CONNECTED.set(0)
                self.reconnects += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_backoff_s)
        finally:
            await channel.close()

    async def _stream(self, stub: pb_grpc.TrainerServiceStub) -> None:
        opts = call_options(self._auth, STREAM_DEADLINE_S)
        with self.spool.cursor() as cursor:

            async def envelopes() -> AsyncIterator[pb.TrajectoryEnvelope]:
                while True:
                    rec = await cursor.next()
                    self.sent += 1
                    yield pb.TrajectoryEnvelope(trajectory_id=rec.trajectory_id, payload=rec.payload)

            call = stub.PushTrajectories(envelopes(), **opts.kw())
            try:
                await call.wait_for_connection()
                self.connected = True
                m.TRAINER_CONNECTED.set(1)
                log.info("trainer link to %s open; %d trajectories pending", self.target, self.spool.pending_count)
                async for ack in call:
                    self._on_ack(ack)
            finally:
                call.cancel()

    def _on_ack(self, ack: pb.PushAck) -> None:
        if ack.status == pb.ACK_STATUS_REJECTED:
            self.rejected += 1
            log.error("trainer rejected trajectory %s: %s (kept in %s)", ack.trajectory_id, ack.error,
                      self._rejected_dir)
            self._keep_rejected(ack.trajectory_id, ack.error)
        elif ack.status not in (pb.ACK_STATUS_ACCEPTED, pb.ACK_STATUS_DUPLICATE):
            log.error("trainer sent an ack with unknown status %d for %s", ack.status, ack.trajectory_id)
            return
        self.spool.ack(ack.trajectory_id)

    def _keep_rejected(self, trajectory_id: str, error: str) -> None:
        rec = self.spool.record_of(trajectory_id)
        if rec is None:
            return
        self._rejected_dir.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in trajectory_id)
        Path(self._rejected_dir / f"{safe}.msgpack").write_bytes(rec.payload)
        Path(self._rejected_dir / f"{safe}.error.txt").write_text(error + "\n")
