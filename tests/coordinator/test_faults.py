"""Faults through real parts: weight sync reaches both of two real t1-inference servers, then one is killed
mid-episode; the episode goes on, every turn carrying the synced version."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from coordproc import write_harbor_task

from t1.agent.episode import Episode, EpisodeSpec, acquire_from
from t1.agent.episode_limits import EpisodeLimits
from t1.agent.formats import get_format
from t1.agent.transcript import Transcript
from t1.config.inference import InferencePoolConfig
from t1.config.loader import load_config
from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.config.shared import AuthConfig, ServerConfig
from t1.coordinator.local.children import Child, service_argv
from t1.coordinator.model_setup import make_renderers
from t1.coordinator.trainer_side.weights import WeightSync
from t1.inference.client.pool import InferencePool
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams
from t1.rpc.loop import cancel_and_wait
from t1.rpc.server import GrpcServer, ServiceBinding
from t1.sandbox.local.local_provider import LocalProvider
from t1.tasks.formats.dataset import load_task
from t1.trajectory.types import EpisodeStatus
from t1.v1 import trainer_pb2 as tpb
from t1.v1 import trainer_pb2_grpc as tpb_grpc


class OneVersion(tpb_grpc.TrainerServiceServicer):
    """WatchVersions as the trainer serves it: the versions after from_version, then the stream stays open."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def WatchVersions(self, request: tpb.WatchVersionsRequest, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[tpb.WeightVersion]:
        if request.from_version < 1:
            yield tpb.WeightVersion(version=1, path=self.path, step=1)
        await asyncio.Event().wait()


@pytest.fixture()
async def provider() -> AsyncIterator[LocalProvider]:
    root = Path(tempfile.mkdtemp(prefix="t1-faults-"))
    root.chmod(0o711)
    p = LocalProvider(LocalProviderConfig(root=root / "trees"), ShellConfig(output_cap_bytes=2048))
    yield p
    await p.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow  # two model servers and an episode: about a minute on 2 busy cores
async def test_killing_one_of_two_inference_servers_mid_episode(tmp_path: Path, tiny_model_dir: Path,
                                                                provider: LocalProvider) -> None:
    servers = [Child(f"inference-{i}", service_argv("t1.cli.inference", None, [], ["--model", str(tiny_model_dir),
                                                                                    "--port", "0"]),
                     tmp_path / f"inference-{i}.log") for i in range(2)]
    try:
        addresses = await asyncio.gather(*(s.start(180) for s in servers))
        pool = InferencePool(
            InferencePoolConfig(request_timeout_s=60, retries=2, backoff_s=0.1, unhealthy_s=60), addresses
        )
        # Weight sync first: the trainer's WatchVersions announces v1, every server loads it.
        trainer = GrpcServer([ServiceBinding("t1.v1.TrainerService", tpb_grpc.add_TrainerServiceServicer_to_server,
                                             OneVersion(str(tiny_model_dir)))], ServerConfig(port=0), AuthConfig())
        await trainer.start()
        loaded: list[tuple[str, ...]] = []

        async def load(path: str, version: int) -> None:
            loaded.append((await pool.update_weights(path, version)).updated)

        sync = WeightSync(trainer.address, load, backoff_s=0.1)
        sync_task = asyncio.create_task(sync.run())
        await asyncio.wait_for(sync.wait_for_version(lambda v: v >= 1), 120)
        await cancel_and_wait(sync_task)
        await trainer.stop(0)
        assert loaded == [tuple(addresses)], "both servers serve v1"
        task = load_task(write_harbor_task(tmp_path / "tasks", "t", "w"))
        fmt = get_format("tool_calls")
        renderer = make_renderers(tiny_model_dir)[fmt.name]
        killed: list[str] = []

        async def generate(req: GenerateRequest) -> GenerateResult:
            result = await pool(req)
            if not killed:  # after the first turn, kill the replica this session is bound to
                bound = pool.replica_of(req.session_id)
                victim = next(s for s in servers if s.address == bound)
                assert victim.proc is not None
                victim.proc.kill()
                await victim.proc.wait()
                killed.append(victim.address)
            return result

        cfg = load_config(None, ["rollout.max_turns=4", "rollout.max_context_tokens=4096"])
        spec = EpisodeSpec("ep-fault", task, "g", 0, fmt, SamplingParams(max_tokens=24, seed=1),
                           EpisodeLimits.from_config(cfg.rollout, cfg.reward))
        result = await Episode(spec, generate, acquire_from(provider), renderer,
                               Transcript(None, task.id, "ep-fault")).run()
        assert result.status is EpisodeStatus.OK, result.failure_mode
        assert result.turns == 4
        survivor = pool.replica_of("ep-fault/s1")
        assert survivor is not None and survivor != killed[0]
        # Every turn's tokens are in the trajectory, sampled by one server or the other.
        seg = result.trajectory.segments[0]
        assert len(seg.turns) == 4 and seg.loss_mask.sum() > 0
        assert set(seg.policy_versions[seg.loss_mask].tolist()) == {1}, "new turns carry the new version"
        await pool.close()
    finally:
        for s in servers:
            await s.stop(10)
