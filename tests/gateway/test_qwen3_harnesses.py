"""Each real harness on the real-vocabulary Qwen3 model (the `qwen3-vocab` preset: Qwen's tokenizer and
Qwen3's own chat template) with thinking off, generating in-process: the harness runs to its end, every
segment start is counted with its cause (Qwen3 drops each past turn's empty think block: a call that
extends the last renders otherwise), drift 0, never an exception or an infra error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from t1.config.rollout import HarnessConfig
from t1.coordinator.model_setup import make_renderers
from t1.inference.types import GenerateRequest, GenerateResult, collect
from t1.trajectory.types import EpisodeStatus

from .test_harness_episode import episode
from .test_real_harnesses import (
    AIDER,
    AIDER_ENV,
    MINI,
    MINI_ENV,
    TERMINUS2,
    TERMINUS2_ENV,
    installed,
)

# (command, env, fewest calls): aider answers its one message and exits when a reply holds no edit.
HARNESSES = {"mini-swe-agent": (MINI, MINI_ENV, 2), "harbor": (TERMINUS2, TERMINUS2_ENV, 2),
             "aider": (AIDER, AIDER_ENV, 1)}


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from t1.model.init import init_model

    return init_model(tmp_path_factory.mktemp("models") / "qwen3-vocab", "qwen3-vocab", seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("harness", list(HARNESSES))
async def test_harness_on_qwen3_thinking_off(tmp_path: Path, provider, qwen3_model: Path, harness: str) -> None:
    from t1.inference.server.torch_backend import TorchBackend

    installed(harness)
    renderers = make_renderers(qwen3_model, template_kwargs={"enable_thinking": False})
    backend = TorchBackend(qwen3_model, capture_routing=True)
    sampled: list[np.ndarray] = []

    async def generate(req: GenerateRequest) -> GenerateResult:
        res = await collect(backend.stream(req))
        sampled.append(res.token_ids.copy())
        return res

    command, env, fewest = HARNESSES[harness]
    ep = episode(tmp_path, provider, renderers, generate, HarnessConfig(command=command, env=env, timeout_s=90))
    result = await ep.run()
    text = Path(result.transcript).read_text()
    assert result.status in (EpisodeStatus.OK, EpisodeStatus.TIMEOUT), (result.failure_mode, text[-4000:])
    assert ep.gateway.calls >= fewest, text[-4000:]
    assert result.drift_tokens == 0
    segments = result.trajectory.segments
    assert sum(ep.segment_causes.values()) == len(segments)
    assert np.array_equal(np.concatenate([s.token_ids[s.loss_mask] for s in segments]), np.concatenate(sampled))
    print(harness, dict(ep.segment_causes))
