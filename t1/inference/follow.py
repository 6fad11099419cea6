"""An inference server that follows the trainer: it loads each new weight version itself.

With several coordinators sharing one fleet, exactly one party must make a server load a
version. Each server following the trainer's WatchVersions is that party for itself: the trainer
need not know the fleet, a replica that is added or restarted catches up on its own (from the
newest version, not every one in between), and coordinators only wait until the servers they
route to serve a version (`await_served`, which the gRPC transport's `load_weights` calls in follow
mode). Loads go through the servicer's `load_version`, so a version is loaded at most once per server
whoever else asks for it.

A burst of announcements (a restarted server hears every kept version at once) is read to its
end before loading: only the newest is loaded. A lost stream is reopened from the served version;
a failed load is retried with backoff, since a server stuck on an old policy stalls training.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from t1.config.shared import AuthConfig
from t1.rpc.client import call_options, make_channel
from t1.rpc.options import STREAM_DEADLINE_S
from t1.v1 import inference_pb2 as ipb
from t1.v1 import trainer_pb2 as pb
from t1.v1 import trainer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

LoadFn = Callable[[str, int], Awaitable[object]]  # (weights path, version) -> served
BURST_S = 0.05  # announcements this close together are one burst: only the newest is loaded
MAX_BACKOFF_S = 10.0
POLL_S = 0.2  # how often a coordinator asks a following server whether it serves a version yet


class TrainerFollower:
    """`await follower.run()` keeps the server on the trainer's newest version until cancelled."""

    def __init__(self, trainer_target: str, load: LoadFn, served: Callable[[], int], auth: AuthConfig | None = None,
                 backoff_s: float = 0.5) -> None:
        self.trainer_target = trainer_target
        self._load, self._served = load, served
        self._auth = auth or AuthConfig()
        self._backoff_s = backoff_s
        self._latest: pb.WeightVersion | None = None
        self._announced = asyncio.Event()

    async def run(self) -> None:
        loader = asyncio.ensure_future(self._load_latest())
        try:
            await self._watch()
        finally:
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)

    async def _watch(self) -> None:
        channel = make_channel(self.trainer_target, self._auth)
        stub = pb_grpc.TrainerServiceStub(channel)
        opts = call_options(self._auth, STREAM_DEADLINE_S)
        try:
            while True:
                start = max(self._served(), self._latest.version if self._latest is not None else 0)
                try:
                    async for wv in stub.WatchVersions(pb.WatchVersionsRequest(from_version=start), **opts.kw()):
                        if self._latest is None or wv.version > self._latest.version:
                            self._latest = wv
                            self._announced.set()
                except grpc.aio.AioRpcError as err:  # the trainer restarts or is away: reopen
                    log.info("WatchVersions on %s: %s; reopening from v%d", self.trainer_target, err.code().name,
                             start)
                await asyncio.sleep(self._backoff_s)
        finally:
            await channel.close()

    async def _load_latest(self) -> None:
        delay = self._backoff_s
        while True:
            await self._announced.wait()
            await asyncio.sleep(BURST_S)
            self._announced.clear()
            wv = self._latest
            if wv is None or wv.version <= self._served():
                continue
            try:
                await self._load(wv.path, int(wv.version))
                delay = self._backoff_s
            except Exception as exc:  # the folder is not there yet, or the load failed: the version must land
                log.warning("loading weights v%d (%s) announced by %s failed: %s; retry in %.1fs", wv.version,
                            wv.path, self.trainer_target, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                self._announced.set()


async def await_served(stub: Any, version: int, deadline_s: float, kw: Callable[[float], dict[str, Any]],
                       probe_timeout_s: float, poll_s: float = POLL_S) -> int:
    """Ask a following server its version until it serves `version` or newer; the version it serves.

    Raises TimeoutError when it does not within `deadline_s` (its follower is stuck or the trainer is
    out of its reach), AioRpcError when it cannot be asked.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while True:
        info = await stub.GetModelInfo(ipb.GetModelInfoRequest(), wait_for_ready=True, **kw(probe_timeout_s))
        served = int(info.policy_version)
        if served >= version:
            return served
        if loop.time() + poll_s > deadline:
            raise TimeoutError(f"still serving v{served} after {deadline_s:.0f}s, waiting for v{version}")
        await asyncio.sleep(poll_s)
