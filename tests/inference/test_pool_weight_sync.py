"""The coordinator's WeightSync over an InferencePool with one dead server: versions still land on the live one."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from t1.config.inference import InferencePoolConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.coordinator.trainer_side.weights import WeightSync
from t1.inference.client.pool import InferencePool, WeightsUpdate
from t1.inference.server.servicer import inference_binding
from t1.rpc.loop import cancel_and_wait
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.v1 import trainer_pb2 as tpb
from t1.v1 import trainer_pb2_grpc as tpb_grpc


class TwoVersions(tpb_grpc.TrainerServiceServicer):
    """WatchVersions as the trainer serves it: versions 1 and 2 after from_version, then the stream stays open."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def WatchVersions(self, request: tpb.WatchVersionsRequest, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[tpb.WeightVersion]:
        for version in (1, 2):
            if request.from_version < version:
                yield tpb.WeightVersion(version=version, path=self.path, step=version)
        await asyncio.Event().wait()


async def test_weight_sync_advances_while_one_of_two_servers_is_dead(tiny_model_dir: Path) -> None:
    from t1.inference.server.torch_backend import TorchBackend

    backend = TorchBackend(tiny_model_dir)
    live = GrpcServer([inference_binding(backend)], ServerConfig(port=0, grace_s=0.2), AuthConfig())
    trainer = GrpcServer([ServiceBinding("t1.v1.TrainerService", tpb_grpc.add_TrainerServiceServicer_to_server,
                                         TwoVersions(str(tiny_model_dir)))], ServerConfig(port=0), AuthConfig())
    await live.start()
    await trainer.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    pool = InferencePool(InferencePoolConfig(backoff_s=0.01, unhealthy_s=60), [dead, live.address])
    updates: list[WeightsUpdate] = []

    async def load(path: str, version: int) -> None:
        updates.append(await pool.update_weights(path, version))

    sync = WeightSync(trainer.address, load, backoff_s=0.05)
    task = asyncio.create_task(sync.run())
    try:
        assert await asyncio.wait_for(sync.wait_for_version(lambda v: v >= 2), 60) == 2
        assert [(u.version, u.updated, u.skipped) for u in updates] == [
            (1, (live.address,), (dead,)), (2, (live.address,), (dead,))]
        assert backend.policy_version == 2 and pool.healthy_endpoints == [live.address]
    finally:
        await cancel_and_wait(task)
        await pool.close()
        await trainer.stop(0)
        await live.stop()
        await backend.close()
