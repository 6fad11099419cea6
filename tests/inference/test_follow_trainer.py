"""Issue 22: inference servers that follow the trainer's WatchVersions load each version once, by
themselves; a coordinator's pool in `weights: follow` waits until they serve it and never loads.
Real gRPC on loopback: a real InferenceService over the tiny model, a trainer stand-in that
announces versions the way the trainer does (all kept versions after from_version, then new ones)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from t1.config.inference import InferencePoolConfig, WeightsMode
from t1.config.shared import AuthConfig, ServerConfig
from t1.inference.client.pool import InferencePool
from t1.inference.follow import TrainerFollower
from t1.inference.server.servicer import InferenceServicer, inference_binding
from t1.rpc.loop import cancel_and_wait
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.v1 import trainer_pb2 as tpb
from t1.v1 import trainer_pb2_grpc as tpb_grpc


class Announcer(tpb_grpc.TrainerServiceServicer):
    """WatchVersions over a list of published versions that a test appends to."""

    def __init__(self, path: str) -> None:
        self.path, self.versions, self.changed = path, [1, 2], asyncio.Event()
        self.watchers = 0

    def publish(self, version: int) -> None:
        self.versions.append(version)
        self.changed.set()

    async def WatchVersions(self, request: tpb.WatchVersionsRequest, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[tpb.WeightVersion]:
        self.watchers += 1
        last = request.from_version
        while True:
            for v in [v for v in self.versions if v > last]:
                yield tpb.WeightVersion(version=v, path=self.path, step=v)
                last = v
            self.changed.clear()
            await self.changed.wait()


async def test_a_following_server_loads_each_version_once_and_the_pool_only_waits(tiny_model_dir: Path) -> None:
    from t1.inference.server.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir)
    servicer = InferenceServicer(backend)
    inference = GrpcServer([inference_binding(backend, servicer=servicer)], ServerConfig(port=0, grace_s=0.2),
                           AuthConfig())
    announcer = Announcer(str(tiny_model_dir))
    trainer = GrpcServer([ServiceBinding("t1.v1.TrainerService", tpb_grpc.add_TrainerServiceServicer_to_server,
                                         announcer)], ServerConfig(port=0), AuthConfig())
    await inference.start()
    await trainer.start()
    pools = [InferencePool(InferencePoolConfig(weights=WeightsMode.FOLLOW, weights_timeout_s=60), [inference.address])
             for _ in range(2)]  # two coordinators
    follower = TrainerFollower(trainer.address, servicer.load_version, lambda: backend.policy_version, backoff_s=0.05)
    task = asyncio.create_task(follower.run())
    try:
        # v1 and v2 come as one burst (a server starting late): only the newest is loaded.
        updates = await asyncio.gather(*(p.update_weights(str(tiny_model_dir), 2) for p in pools))
        assert [u.updated for u in updates] == [(inference.address,)] * 2
        assert (backend.policy_version, servicer.weight_loads) == (2, 1)
        announcer.publish(3)
        await asyncio.gather(*(p.update_weights(str(tiny_model_dir), 3) for p in pools))
        assert (backend.policy_version, servicer.weight_loads) == (3, 2), "v3 loaded once for two coordinators"
        await trainer.stop(0)  # the trainer restarts: the follower reopens from the served version
        trainer = GrpcServer([ServiceBinding("t1.v1.TrainerService", tpb_grpc.add_TrainerServiceServicer_to_server,
                                             announcer)], ServerConfig(port=int(trainer.address.rsplit(":", 1)[1])),
                             AuthConfig())
        await trainer.start()
        announcer.publish(4)
        await asyncio.wait_for(pools[0].update_weights(str(tiny_model_dir), 4), 60)
        assert (backend.policy_version, servicer.weight_loads) == (4, 3) and announcer.watchers >= 2
        stuck = await pools[1].update_weights(str(tiny_model_dir), 4)  # already served: returns at once
        assert stuck.updated == (inference.address,)
    finally:
        await cancel_and_wait(task)
        for p in pools:
            await p.close()
        await trainer.stop(0)
        await inference.stop()
        await backend.close()


async def test_a_pool_in_follow_mode_skips_a_server_that_never_catches_up(tiny_model_dir: Path) -> None:
    from t1.inference.server.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir)  # follows no one: stays on v0
    inference = GrpcServer([inference_binding(backend)], ServerConfig(port=0, grace_s=0.2), AuthConfig())
    await inference.start()
    pool = InferencePool(InferencePoolConfig(weights=WeightsMode.FOLLOW, weights_timeout_s=0.5), [inference.address])
    try:
        try:
            await pool.update_weights(str(tiny_model_dir), 1)
        except Exception as exc:
            assert "no replica loaded weights v1" in str(exc)
        else:
            raise AssertionError("a server that never serves v1 cannot count as updated")
        assert backend.policy_version == 0, "the pool never loads in follow mode"
    finally:
        await pool.close()
        await inference.stop()
        await backend.close()
