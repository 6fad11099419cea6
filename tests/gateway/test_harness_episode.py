"""A harness episode through real parts: a local sandbox, the gateway on its own loopback, the tiny model
generating in-process, a harness process inside the sandbox, the task's verifier, the exported trajectory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from t1.agent.episode import EpisodeSpec, acquire_from
from t1.agent.episode_limits import EpisodeLimits
from t1.agent.formats import FormatName, get_format
from t1.agent.harness import HarnessEpisode
from t1.agent.transcript import Transcript
from t1.config.loader import load_config
from t1.config.rollout import HarnessConfig
from t1.coordinator.rollout.runner import EpisodeOptions, RolloutRunner
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams, collect
from t1.tasks.formats.dataset import load_task
from t1.trajectory.types import EpisodeStatus

HARNESS = (Path(__file__).parent / "stdlib_harness.py").read_text()


def echo_task(root: Path, word: str) -> Path:
    d = root / "echo-task"
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text('[task]\nname = "echo-task"\n[agent]\ntimeout_sec = 120\n[verifier]\n'
                                 'timeout_sec = 30\n'
                                 '[environment]\nallow_internet = false\n')
    (d / "instruction.md").write_text(f"Write {word} into /app/answer.txt\n")
    (d / "tests" / "test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\n'
        f'if [ "$(cat /app/answer.txt 2>/dev/null)" = "{word}" ]; then echo 1 > /logs/verifier/reward.txt; '
        'else echo 0 > /logs/verifier/reward.txt; fi\n')
    return d


def episode(tmp_path: Path, provider, renderers, generate, harness: HarnessConfig, word: str = "hello"):
    cfg = load_config(None, ["rollout.max_context_tokens=8192"])  # the tiny model's context
    task = load_task(echo_task(tmp_path, word))
    fmt = get_format(FormatName.TOOL_CALLS)
    spec = EpisodeSpec("ep-h", task, "g-h", 0, fmt, SamplingParams(max_tokens=16),
                       EpisodeLimits.from_config(cfg.rollout, cfg.reward))
    return HarnessEpisode(spec, generate, acquire_from(provider), renderers[FormatName.TOOL_CALLS],
                          Transcript(tmp_path / "tx", task.id, "ep-h"), ports=provider, harness=harness)


async def test_harness_calls_are_the_trajectory_exactly(tmp_path: Path, provider, renderers, backend) -> None:
    sampled: list[np.ndarray] = []

    async def generate(req: GenerateRequest) -> GenerateResult:
        res = await collect(backend.stream(req))
        sampled.append(res.token_ids.copy())
        return res

    harness = HarnessConfig(command='python3 -c "$T1_HARNESS" hello', env={"T1_HARNESS": HARNESS}, timeout_s=200)
    ep = episode(tmp_path, provider, renderers, generate, harness)
    result = await ep.run()
    text = Path(result.transcript).read_text()
    assert result.status is EpisodeStatus.OK, (result.failure_mode, text[-3000:])
    assert "harness done: 4 calls" in text
    # The verifier scored what the harness did in the sandbox.
    assert result.report.resolved and result.trajectory.reward == 1.0
    # Four calls (OpenAI plain, streamed twice, Anthropic), one segment: each call extended the last.
    assert ep.gateway.calls == 4 and result.turns == 4
    assert dict(ep.segment_causes) == {"first": 1}
    assert [r.cause for r in ep.gateway.records] == ["first", "", "", ""]
    (seg,) = result.trajectory.segments
    assert np.array_equal(seg.token_ids[seg.loss_mask], np.concatenate(sampled))
    assert result.drift_tokens == 0
    # Routing for every position the sampler processed (the last sampled token is never fed back).
    assert seg.routing is not None
    assert not (seg.routing[:-1] == np.iinfo(seg.routing.dtype).max).all(axis=(1, 2)).any()
    # The run's temperature, not the harness's (honour: run), and its max_tokens within the run's.
    assert all(r.used["temperature"] == 1.0 and r.used["max_tokens"] == 12 for r in ep.gateway.records[:3])
    assert all(r.asked.get("temperature") == 0.7 for r in ep.gateway.records[:3])
    assert "gateway call 3: continues the segment" in text


async def test_harness_timeout_ends_the_episode_as_timeout(tmp_path: Path, provider, renderers, backend) -> None:
    async def generate(req: GenerateRequest) -> GenerateResult:
        return await collect(backend.stream(req))

    ep = episode(tmp_path, provider, renderers, generate, HarnessConfig(command="sleep 600", timeout_s=2))
    result = await ep.run()
    assert result.status is EpisodeStatus.TIMEOUT
    assert not result.report.resolved and result.trajectory.segments == ()


async def test_rollout_runner_runs_the_configured_harness(tmp_path: Path, provider, renderers, backend) -> None:
    """The rollout path: `rollout.harness.command` set, the runner plays a harness episode and counts its
    segment starts."""
    cfg = load_config(None, [f"sandbox.local.root={tmp_path / 'trees'}", "rollout.harness.command=echo hi"])
    runner = RolloutRunner(cfg, renderers, acquire_from(provider), lambda *_: None, tmp_path / "tx", ports=provider)

    async def generate(req: GenerateRequest) -> GenerateResult:
        return await collect(backend.stream(req))

    result = await runner.run_episode(load_task(echo_task(tmp_path, "x")), "g", 0, EpisodeOptions(generate=generate))
    assert result.status is EpisodeStatus.OK and result.turns == 0 and not result.report.resolved
    assert "hi" in Path(result.transcript).read_text()
    with pytest.raises(ValueError, match=r"rollout\.harness\.command"):
        RolloutRunner(cfg, renderers, acquire_from(provider), lambda *_: None, None)
