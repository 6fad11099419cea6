"""The stall watch's driver in the gRPC pool: probes busy replicas, and fails a stalled one's sends.

While any replica is busy (requests of the pool outstanding there, or a weight load of its own
running) a task probes the busy ones every `check_s` and feeds their answers to the `StallWatch`
(t1.inference.client.stall); it ends when none is busy, and the next guarded send starts it again.
Each send runs as a task of its own; a verdict calls the pool's `on_stall` (avoid the replica, log,
count) and cancels that replica's sends (on the server too), which then fail with UNAVAILABLE, so the
pool retries their turns on other replicas (a failover).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import grpc

from t1.inference.client.stall import Stall, StallWatch
from t1.inference.multiplex import rpc_error
from t1.v1 import inference_pb2 as pb

T = TypeVar("T")


class Guarded(Protocol):
    outstanding: int
    sync_lock: asyncio.Lock
    aborts: set[asyncio.Future[Any]]  # its sends in flight, cancelled when it stalls

    @property
    def address(self) -> str: ...


R = TypeVar("R", bound=Guarded)


class StallGuard(Generic[R]):
    """One pool's stall watch at work over its replicas."""

    def __init__(self, watch: StallWatch, check_s: float, replicas: Sequence[R],
                 probe: Callable[[R], Awaitable[pb.ModelInfo | None]], on_stall: Callable[[R, Stall], None]) -> None:
        self.watch, self.check_s = watch, check_s
        self._replicas, self._probe, self._on_stall = replicas, probe, on_stall
        self._task: asyncio.Task[None] | None = None
        self._verdicts: dict[asyncio.Future[Any], grpc.aio.AioRpcError] = {}  # sends cancelled for a stall: why

    async def send(self, replica: R, send: Awaitable[T]) -> T:
        """`send`, failed with the stall's UNAVAILABLE (and cancelled) when the watch finds `replica` stalled."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="inference-pool-stall-watch")
        sending = asyncio.ensure_future(send)
        replica.aborts.add(sending)
        try:
            return await sending
        except asyncio.CancelledError:
            verdict = self._verdicts.pop(sending, None)
            if verdict is None:  # our own cancellation, not the watch's
                raise
            raise verdict from None
        finally:
            replica.aborts.discard(sending)
            self._verdicts.pop(sending, None)

    async def _run(self) -> None:
        """Probe the busy replicas for progress until none is busy."""
        while True:
            await asyncio.sleep(self.check_s)
            busy = [r for r in self._replicas if r.outstanding or r.sync_lock.locked()]
            for r in self._replicas:
                if r not in busy:
                    self.watch.idle(r.address)
            if not busy:
                return
            infos = await asyncio.gather(*(self._probe(r) for r in busy))
            now = time.monotonic()
            for replica, info in zip(busy, infos, strict=True):
                stall = self.watch.observe(replica.address, info, now)
                if stall is not None:
                    self._stalled(replica, stall)

    def _stalled(self, replica: R, stall: Stall) -> None:
        self._on_stall(replica, stall)
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, stall.describe())
        for sending in list(replica.aborts):
            if sending.cancel():  # a send that finished as the verdict came keeps its result
                self._verdicts[sending] = error

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
