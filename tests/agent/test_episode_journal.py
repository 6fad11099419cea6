"""A journaled episode exports the trajectory an in-memory one does, from its journal on disk."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_episode import _says, _task, limits

from t1.agent.episode import Episode, EpisodeSpec, acquire_from
from t1.agent.formats import FormatName, get_format
from t1.agent.scripted import ScriptedPolicy
from t1.agent.transcript import Transcript
from t1.coordinator.spool.journal import Journal, read_events
from t1.coordinator.spool.journal_recovery import recover
from t1.coordinator.spool.trajectory_spool import Spool
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams
from t1.tasks.formats.dataset import load_task
from t1.trajectory.serialization import decode_trajectory, encode_trajectory
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
            episode = Episode(
                spec, policy, acquire_from(provider), renderer, Transcript(None, task.id, name), journal=j
            )
            result = await episode.run()
            assert result.status is EpisodeStatus.OK and result.report.resolved, result.failure_mode
            assert result.drift_tokens == 0 and result.turns == 2
            payloads.append(encode_trajectory(replace(result.trajectory, timings=())))
        assert payloads[0] == payloads[1]  # byte for byte (the wall times aside)
        kinds = [k for k, _ in read_events(journal.path_of("ep-1"))[0]]
        assert kinds == ["begin", "segment", "sandbox", "ready", "gen", "turn", "ctx", "gen", "turn"]
        turns = [f for k, f in read_events(journal.path_of("ep-1"))[0] if k == "turn"]
        assert turns[-1]["done"] and turns[0]["commands"] and turns[0]["checkpoint"] is not None
    finally:
        journal.close()


async def test_an_episode_its_coordinator_left_unfinished_is_spooled_as_infra_error(tmp_path: Path, provider,
                                                                                    renderers) -> None:
    """The coordinator dies at turn 3 (the episode task is gone mid-generation, a partial frame at the journal's
    end): the next one spools the episode's completed turns as an infra_error trajectory and removes the journal."""
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0.05)
    stuck = asyncio.Event()
    spool = Spool.open(tmp_path / "spool", 1 << 30, 1 << 26)
    try:
        async def policy(req: GenerateRequest) -> GenerateResult:
            if len(asked) == 2:
                stuck.set()
                await asyncio.sleep(3600)
            asked.append(req)
            return _says(renderer, '<tool_call>\n{"name": "bash", "arguments": {"command": "ls /"}}\n</tool_call>', req)

        asked: list[GenerateRequest] = []
        spec = EpisodeSpec("g-1-a0", task, "g-1", 0, get_format(FormatName.TOOL_CALLS), SamplingParams(max_tokens=64),
                           limits("rollout.max_turns=10"))
        ep = journal.episode(spec.episode_id)
        run = asyncio.create_task(
            Episode(spec, policy, acquire_from(provider), renderer, Transcript(None, task.id, "x"), journal=ep).run()
        )
        await asyncio.wait_for(stuck.wait(), 60)
        await ep.written()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        with ep.path.open("ab") as f:  # the frame being written when the process died
            f.write(b"\x00\x10\x00\x00torn")
        recovered = await recover(journal, spool, resume=False)
        assert (recovered.episodes, recovered.infra_errors, recovered.turns_lost, recovered.damaged) == (1, 1, 2, 0)
        assert journal.files() == []
        with spool.cursor() as cursor:
            traj = decode_trajectory(cursor.next_nowait().payload)
        assert traj.id == "g-1-a0" and traj.group_id == "g-1" and traj.status is EpisodeStatus.INFRA_ERROR
        assert traj.reward == 0.0 and len(traj.segments[0].turns) == 2
        seg = traj.segments[0]
        assert renderer.decode(seg.token_ids[seg.loss_mask].tolist()).count("ls /") == 2
        # A second restart finds nothing left to do.
        assert (await recover(journal, spool, resume=False)).episodes == 0
    finally:
        journal.close()
        spool.close()


async def test_a_journal_that_does_not_replay_is_set_aside_and_an_eval_attempts_is_not_spooled(tmp_path: Path
                                                                                               ) -> None:
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0)
    spool = Spool.open(tmp_path / "spool", 1 << 30, 1 << 26)
    try:
        ep = journal.episode("e")
        ep.begin(task_id="t", group_id="g", attempt=0, agent_format="tool_calls")
        ep.context(np.arange(3, dtype=np.int32), [])  # an observation before any segment: not a buffer's record
        await ep.written()
        ev = journal.episode("eval-1", training=False)  # its job reruns the attempt: nothing for the trainer
        ev.begin(task_id="t", group_id="eval-j-t", attempt=0, agent_format="tool_calls")
        ev.segment(np.arange(5, dtype=np.int32), [{"role": "user", "content": "hi"}], 0)
        await ev.written()
        recovered = await recover(journal, spool, resume=False)
        assert (recovered.episodes, recovered.damaged, recovered.infra_errors) == (2, 1, 0)
        assert spool.pending_count == 0
        assert journal.files() == [] and (tmp_path / "journal" / "e.journal.corrupt").exists()
    finally:
        journal.close()
        spool.close()
