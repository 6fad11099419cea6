"""The trainer link: streams the spool to TrainerService.PushTrajectories and applies acks by id.

Each connection reads the spool from a fresh cursor, so everything not yet acknowledged
is sent again after a reconnect (the trainer answers DUPLICATE for what it already has).
ACCEPTED and DUPLICATE acks remove the record from the spool; a REJECTED record will never
be accepted, so it is moved to `rejected/` beside the spool (kept for a person) and acked; one
that cannot be kept there (an unwritable disk) stays in the spool and is sent again later.
When the trainer is unreachable the link retries with backoff while rollouts keep filling
the spool up to its bound.

T1 owns both directions of the stream: a writer task it creates sends envelopes with
`call.write`, and acks are read with `call.read`. gRPC is never handed a request iterator: when
a call handed one broke, grpc cancelled its own task consuming the iterator while the generator
was suspended in `cursor.next()`; the task was destroyed pending and closing the generator failed
("aclose(): asynchronous generator is already running"), inside grpc's call machinery, just
before the coordinator once died of SIGABRT. On any end of a call the writer is cancelled and
awaited before the call is cancelled, and a write refused because the call has ended (or a read
of an ended call) makes the link reconnect.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from t1.config.shared import AuthConfig
from t1.coordinator.spool.trajectory_spool import Spool, SpoolCursor
from t1.metrics import registry as m
from t1.rpc.client import call_options, make_channel
from t1.rpc.options import STREAM_DEADLINE_S
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STREAM_ENDED = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)
"""How a broken call shows: a status from the trainer or the channel, or a write or read refused
because the call has already ended."""

STATUS_WAIT_S = 5.0
"""How long the reader may take to see the status of a call whose writer was refused."""


def describe_end(err: BaseException) -> str:
    """How a call ended, for the log (pure)."""
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    return f"the stream ended ({type(err).__name__}: {err})"


async def stop_tasks(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel each task and wait until it has ended, in order; what it ended with is dropped (the call's
    status, already reported by the other task of the stream, or nothing)."""
    for task in tasks:
        if task is None:
            continue
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as never retrieved


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
                except STREAM_ENDED as err:  # the fault-tolerance point: the trainer is away
                    log.warning("trainer link to %s: %s; %d trajectories wait in the spool (retry in %.1fs)",
                                self.target, describe_end(err), self.spool.pending_count, delay)
                except Exception:  # a local fault or a bug: delivery must go on for the rest of the run
                    log.exception("trainer link to %s failed; %d trajectories wait in the spool (retry in %.1fs)",
                                  self.target, self.spool.pending_count, delay)
                finally:
                    self.connected = False
                    m.TRAINER_CONNECTED.set(0)
                self.reconnects += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_backoff_s)
        finally:
            await channel.close()

    async def _stream(self, stub: pb_grpc.TrainerServiceStub) -> None:
        """One call: returns when the trainer ends it cleanly; raises one of STREAM_ENDED when it breaks."""
        opts = call_options(self._auth, STREAM_DEADLINE_S)
        call = stub.PushTrajectories(**opts.kw())  # no request iterator: the writer below writes
        writer: asyncio.Task[None] | None = None
        reader: asyncio.Task[None] | None = None
        try:
            await call.wait_for_connection()
            self.connected = True
            m.TRAINER_CONNECTED.set(1)
            log.info("trainer link to %s open; %d trajectories pending", self.target, self.spool.pending_count)
            with self.spool.cursor() as cursor:
                loop = asyncio.get_running_loop()
                writer = loop.create_task(self._write(call, cursor), name="trainer-link-writer")
                reader = loop.create_task(self._read(call), name="trainer-link-reader")
                await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
                if not reader.done():  # the writer saw the call end: the reader ends with the call's status
                    await asyncio.wait({reader}, timeout=STATUS_WAIT_S)
                for task in (reader, writer):
                    if task.done() and not task.cancelled() and (err := task.exception()) is not None:
                        raise err
        finally:
            try:
                await stop_tasks(writer, reader)  # the writer first: no write is in flight when the call is cancelled
            finally:
                call.cancel()

    async def _write(self, call: grpc.aio.StreamStreamCall, cursor: SpoolCursor) -> None:
        while True:
            rec = await cursor.next()
            await call.write(pb.TrajectoryEnvelope(trajectory_id=rec.trajectory_id, payload=rec.payload))
            self.sent += 1

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while (ack := await call.read()) is not grpc.aio.EOF:
            self._on_ack(ack)

    def _on_ack(self, ack: pb.PushAck) -> None:
        if ack.status == pb.ACK_STATUS_REJECTED:
            self.rejected += 1
            try:
                self._keep_rejected(ack.trajectory_id, ack.error)
            except OSError as exc:  # not acked: a record is never dropped before it is kept aside
                log.error("trainer rejected trajectory %s: %s; cannot keep it aside (%s): it stays in the spool "
                          "and is sent again on the next connection", ack.trajectory_id, ack.error, exc)
                return
            log.error("trainer rejected trajectory %s: %s (kept in %s)", ack.trajectory_id, ack.error,
                      self._rejected_dir)
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
