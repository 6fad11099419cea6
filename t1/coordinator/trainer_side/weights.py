"""Weight sync: follow the trainer's WatchVersions and make every inference server load each new version.

`version` is the policy version the inference servers serve (new turns carry it); waiters
(the scheduler's staleness admission) are woken on every change. A lost stream is reopened
from the last version seen; a failed UpdateWeights is retried until it lands, since serving
a stale policy forever would silently stall training.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from t1.config.shared import AuthConfig
from t1.metrics import registry as m
from t1.rpc.client import call_options, make_channel
from t1.rpc.options import STREAM_DEADLINE_S
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

LoadFn = Callable[[str, int], Awaitable[object]]  # (weights path, version) -> done on every server


class WeightSync:
    def __init__(self, trainer_target: str, load: LoadFn, auth: AuthConfig | None = None, start_version: int = 0,
                 backoff_s: float = 0.5) -> None:
        self.trainer_target = trainer_target
        self._load = load
        self._auth = auth or AuthConfig()
        self.version = start_version
        self.trainer_step = 0
        self._backoff_s = backoff_s
        self._changed = asyncio.Condition()

    async def wait_for_version(self, predicate: Callable[[int], bool]) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self.version))
            return self.version

    async def changed(self) -> None:
        """Return at the next version change (for waiters that combine several conditions)."""
        async with self._changed:
            await self._changed.wait()

    async def run(self) -> None:
        channel = make_channel(self.trainer_target, self._auth)
        stub = pb_grpc.TrainerServiceStub(channel)
        opts = call_options(self._auth, STREAM_DEADLINE_S)
        try:
            while True:
                try:
                    call = stub.WatchVersions(pb.WatchVersionsRequest(from_version=self.version), **opts.kw())
                    async for wv in call:
                        if wv.version > self.version:
                            await self._apply(wv)
                except grpc.aio.AioRpcError as err:  # the trainer restarts or is away: reopen
                    log.info("WatchVersions on %s: %s; reopening from v%d", self.trainer_target, err.code().name,
                             self.version)
                await asyncio.sleep(self._backoff_s)
        finally:
            await channel.close()

    async def _apply(self, wv: pb.WeightVersion) -> None:
        delay = self._backoff_s
        while True:
            try:
                await self._load(wv.path, wv.version)
                break
            except Exception as exc:  # an inference server is restarting: retry, the version must land
                log.warning("loading weights v%d (%s) failed: %s; retry in %.1fs", wv.version, wv.path, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        async with self._changed:
            self.version = int(wv.version)
            self.trainer_step = int(wv.step)
            m.POLICY_VERSION.set(self.version)
            self._changed.notify_all()
        log.info("policy v%d (trainer step %d) loaded on the inference servers", wv.version, wv.step)
