"""A journaled episode exports the trajectory an in-memory one does, from its journal on disk."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_episode import _task, limits

from t1.agent.episode import Episode, EpisodeSpec, acquire_from
from t1.agent.formats import FormatName, get_format
from t1.agent.scripted import ScriptedPolicy
from t1.agent.transcript import Transcript
from t1.coordinator.journal import Journal, read_events
from t1.inference.types import SamplingParams
from t1.tasks.dataset import load_task
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus


@pytest.mark.parametrize("fmt_name", [FormatName.TOOL_CALLS, FormatName.TERMINUS2])
async def test_a_journaled_episode_exports_the_trajectory_an_in_memory_one_does(tmp_path: Path, provider, renderers,
                                                                               fmt_name: FormatName) -> None:
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[fmt_name]
    fmt = get_format(fmt_name)
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0.05)
    payloads = []
    try:
        for name, j in (("plain", None), ("journaled", journal.episode("ep-1"))):
            spec = EpisodeSpec("ep-1", task, "g-1", 0, fmt, SamplingParams(max_tokens=400),
                               limits("reward.process_every_k_turns=1"))
            policy = ScriptedPolicy(renderer, policy_version=3).for_episode(task, fmt)
            episode = Episode(spec, policy, acquire_from(provider), renderer, Transcript(None, task.id, name), journal=j)
            result = await episode.run()
            assert result.status is EpisodeStatus.OK and result.report.resolved, result.failure_mode
            assert result.drift_tokens == 0 and result.turns == 2
            payloads.append(encode_trajectory(replace(result.trajectory, timings=())))
        assert payloads[0] == payloads[1]  # byte for byte (the wall times aside)
        kinds = [k for k, _ in read_events(journal.path_of("ep-1"))[0]]
        assert kinds == ["begin", "segment", "gen", "turn", "ctx", "gen", "turn"]
        turns = [f for k, f in read_events(journal.path_of("ep-1"))[0] if k == "turn"]
        assert turns[-1]["done"] and turns[0]["commands"] and turns[0]["checkpoint"] is not None
    finally:
        journal.close()
