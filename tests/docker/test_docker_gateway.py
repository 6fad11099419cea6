"""The harness gateway in docker sandboxes on the real engine: a socket on the loopback of the container's own
network namespace (`DockerProvider.listen_inside`), reached by a harness inside the container and by nothing
else, with the local provider's isolation (tests/gateway/test_hostile_harness.py's probe, run in a container)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from t1.config.rollout import HarnessConfig
from t1.inference.types import GenerateRequest, GenerateResult, collect
from t1.sandbox.docker.docker_provider import DockerProvider
from t1.sandbox.loopback_port import LoopbackPortError
from t1.trajectory.types import EpisodeStatus
from tests.gateway.test_harness_episode import HARNESS, episode
from tests.gateway.test_hostile_harness import assert_only_own_generation, probe_from_sandbox


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path):
    from t1.inference.server.torch_backend import TorchBackend

    return TorchBackend(tiny_model_dir, capture_routing=True)


@pytest.mark.slow
async def test_harness_in_a_container_calls_its_gateway_with_exact_tokens(
        tmp_path: Path, docker_provider: DockerProvider, renderers, backend) -> None:
    sampled: list[np.ndarray] = []

    async def generate(req: GenerateRequest) -> GenerateResult:
        res = await collect(backend.stream(req))
        sampled.append(res.token_ids.copy())
        return res

    harness = HarnessConfig(command='python3 -c "$T1_HARNESS" hello', env={"T1_HARNESS": HARNESS}, timeout_s=200)
    ep = episode(tmp_path, docker_provider, renderers, generate, harness)
    result = await ep.run()
    text = Path(result.transcript).read_text()
    assert result.status is EpisodeStatus.OK, (result.failure_mode, text[-3000:])
    assert "harness done: 4 calls" in text
    assert result.report.resolved and result.trajectory.reward == 1.0
    assert ep.gateway.calls == 4 and dict(ep.segment_causes) == {"first": 1}
    (seg,) = result.trajectory.segments
    assert np.array_equal(seg.token_ids[seg.loss_mask], np.concatenate(sampled)) and result.drift_tokens == 0


async def test_hostile_harness_in_a_container_reaches_only_its_own_generation(
        docker_provider: DockerProvider, renderers, backend) -> None:
    async def generate(req: GenerateRequest) -> GenerateResult:
        return await collect(backend.stream(req))

    assert_only_own_generation(*await probe_from_sandbox(docker_provider, next(iter(renderers.values())), generate))


async def test_no_port_for_a_sandbox_that_is_not_live(docker_provider: DockerProvider) -> None:
    with pytest.raises(LoopbackPortError, match="sb-gone is not live"):
        await docker_provider.listen_inside("sb-gone", 8087)
