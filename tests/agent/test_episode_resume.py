"""A journaled episode continues after its coordinator dies: the buffer rebuilt from the journal is the live one,
and the resumed episode exports what an uninterrupted one does, in the same sandbox with its shell state."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_episode import _task, limits

from t1.agent.episode import Episode, EpisodeSpec, acquire_from
from t1.agent.formats import FormatName, get_format
from t1.agent.resume_point import NotResumable, resume_point
from t1.agent.transcript import Transcript
from t1.config.loader import load_config
from t1.coordinator.rollout.runner import RolloutRunner
from t1.coordinator.spool.journal import Journal, cut, read_frames
from t1.coordinator.spool.journal_recovery import recover
from t1.coordinator.spool.trajectory_spool import Spool
from t1.inference.types import FinishReason, GenerateRequest, GenerateResult, SamplingParams
from t1.routing.block import RoutingBlock
from t1.sandbox.pool import SandboxPool
from t1.sandbox.types import Sandbox, SandboxRequest
from t1.tasks.formats.dataset import load_task
from t1.tito import TokenBuffer
from t1.trajectory.serialization import decode_trajectory, encode_trajectory
from t1.trajectory.types import EpisodeStatus

LAYERS, TOP_K = 3, 2
COMMANDS = [
    "mkdir -p /app/work && cd /app/work && export T1_KEPT=kept-value && echo one > f1",
    "echo two >> f1",
    'echo "cwd=$(pwd) kept=$T1_KEPT"; cat f1',
    "echo hello > /app/answer.txt",
]


class Policy:
    """Deterministic in its prompt (the turn is the number of tool calls it holds), with routing for every position
    a session's server would process first (a new session: the whole prompt again, same experts)."""

    def __init__(self, renderer, stall_at: int | None = None, commands: list[str] = COMMANDS) -> None:
        self.renderer = renderer
        self.commands = commands
        self.stall_at = stall_at
        self.stalled = asyncio.Event()
        self.seen: dict[str, int] = {}

    async def __call__(self, req: GenerateRequest) -> GenerateResult:
        turn = self.renderer.decode(req.prompt_ids.tolist()).count("<|im_start|>assistant") - 1
        if turn == self.stall_at:
            self.stall_at = None
            self.stalled.set()
            await asyncio.sleep(3600)
        command = self.commands[turn] if turn < len(self.commands) else None
        call = json.dumps({"name": "finish", "arguments": {}} if command is None else
                          {"name": "bash", "arguments": {"command": command}})
        ids = np.asarray(self.renderer.encode(f"<tool_call>\n{call}\n"
                                              "</tool_call>") + list(self.renderer.end_of_turn_ids),
                         np.int32)
        n, prompt = len(ids), len(req.prompt_ids)
        start = self.seen.get(req.session_id, 0)
        full = np.concatenate([req.prompt_ids, ids]).astype(np.int64)
        positions = np.arange(start, prompt + n - 1)
        experts = ((full[positions, None, None] * 7 + positions[:, None, None] + np.arange(LAYERS)[None, :, None]
                    + np.arange(TOP_K)[None, None, :]) % 64).astype(np.uint8)
        self.seen[req.session_id] = prompt + n - 1
        return GenerateResult(ids, np.linspace(-1, -0.1, n).astype(np.float32), FinishReason.STOP, 5,
                              np.full(n, 4 + turn % 2, np.int32), RoutingBlock(start, experts), prompt)


class Recorder:
    """A BufferSink that keeps what it is sent."""

    def __init__(self, out: list[tuple]) -> None:
        self.out = out

    def segment(self, *args: object) -> None:
        self.out.append(("segment", args))

    def generation(self, *args: object, **kwargs: object) -> None:
        self.out.append(("gen", args))

    def context(self, *args: object) -> None:
        self.out.append(("ctx", args))


def _kept(sandbox: Sandbox):
    """An acquire that hands out one sandbox and leaves it alive (a coordinator that dies does not destroy it)."""
    @contextlib.asynccontextmanager
    async def acquire(request: SandboxRequest) -> AsyncIterator[Sandbox]:
        yield sandbox
    return acquire


def _spec(task) -> EpisodeSpec:
    return EpisodeSpec("g-1-a0", task, "g-1", 0, get_format(FormatName.TOOL_CALLS), SamplingParams(max_tokens=400),
                       limits("reward.process_every_k_turns=2"))


async def _interrupted(journal: Journal, spec, policy, sandbox, renderer, gens: int | None = None) -> Episode:
    """An episode run until its policy stalls (or its journal holds `gens` generations: the last one's commands
    run), then cancelled as a coordinator's death would leave it."""
    episode = Episode(spec, policy, _kept(sandbox), renderer, Transcript(None, spec.task.id, "x"),
                      journal=journal.episode(spec.episode_id))
    run = asyncio.create_task(episode.run())
    if gens is None:
        await asyncio.wait_for(policy.stalled.wait(), 120)
    else:
        path = journal.path_of(spec.episode_id)
        while not path.exists() or sum(k == "gen" for (k, _), _ in read_frames(path)) < gens:
            await asyncio.sleep(0.05)
            await journal.drained()
    await journal.drained()
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    return episode


async def test_the_buffer_rebuilt_from_the_journal_is_the_live_one(tmp_path: Path, provider, renderers) -> None:
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0)
    sandbox = await provider.create(SandboxRequest())
    try:
        policy = Policy(renderer, stall_at=2)
        live = (await _interrupted(journal, _spec(task), policy, sandbox, renderer)).buf
        events = [e for e, _ in read_frames(journal.path_of("g-1-a0"))]
        rebuilt = TokenBuffer.restore(renderer, [e for e in events if e[0] in ("segment", "gen", "ctx")],
                                      live.resume_state(), sink=journal.episode("other"))
        assert np.array_equal(rebuilt.prompt_ids(), live.prompt_ids()) and len(live.prompt_ids()) > 100
        assert rebuilt.messages == live.messages and rebuilt.counters == live.counters
        assert rebuilt.num_segments == live.num_segments
        assert rebuilt._text == live._text and rebuilt._turn_text == live._turn_text
        assert (rebuilt._since_check, rebuilt._synced) == (live._since_check, live._synced)
        # The same next turn appended to both sends the journal the same records, byte for byte.
        sent: list[list[tuple]] = [[], []]
        for buf, out in ((live, sent[0]), (rebuilt, sent[1])):
            buf.sink = Recorder(out)
            result = await Policy(renderer)(GenerateRequest("s", buf.prompt_ids(), SamplingParams()))
            buf.append_generation(result, {"role": "assistant", "content": "x"})
            buf.append_observation([{"role": "tool", "content": "out"}])
        assert repr(sent[0]) == repr(sent[1])
    finally:
        journal.close()
        await provider.destroy(sandbox)


async def test_a_resumed_episode_exports_what_an_uninterrupted_one_does(tmp_path: Path, provider, renderers) -> None:
    """Killed while its turn 2 generates: the restarted side cuts the journal at turn 1's end, reattaches the sandbox,
    opens a new shell with the directory and exported variable restored, and goes on; the trajectory (ids, logprobs,
    mask, versions, routing, turn rewards) equals an uninterrupted run's byte for byte."""
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0)
    payloads, outputs, trajs = [], [], []
    try:
        for name in ("whole", "resumed"):
            sandbox = await provider.create(SandboxRequest())
            try:
                spec = replace(_spec(task), episode_id=f"g-1-a0-{name}")
                if name == "whole":
                    episode = Episode(spec, Policy(renderer), _kept(sandbox), renderer, Transcript(None, task.id, name),
                                      journal=journal.episode(spec.episode_id))
                else:
                    await _interrupted(journal, spec, Policy(renderer, stall_at=2), sandbox, renderer)
                    path = journal.path_of(spec.episode_id)
                    point = resume_point(read_frames(path))
                    assert (point.turns, point.turn_lost, point.done) == (2, False, False)
                    assert point.shell is not None and "/app/work" in point.shell.cwd_quoted
                    cut(path, point.keep_bytes)
                    episode = Episode(spec, Policy(renderer), _kept(sandbox), renderer,
                                      Transcript(None, task.id, name), journal=journal.episode(spec.episode_id),
                                      resume=(point, sandbox))
                result = await episode.run()
                assert result.status is EpisodeStatus.OK and result.report.resolved and result.drift_tokens == 0
                assert result.turns == 5
                payloads.append(encode_trajectory(replace(result.trajectory, id="", timings=())))
                trajs.append(result.trajectory)
                outputs.append(renderer.decode(result.trajectory.segments[0].token_ids.tolist()))
            finally:
                await provider.destroy(sandbox)
        assert "cwd=/app/work kept=kept-value" in outputs[1]
        assert "one\ntwo" in outputs[1]
        for a, b in zip(trajs[0].segments, trajs[1].segments, strict=True):
            for f in ("token_ids", "logprobs", "loss_mask", "policy_versions", "routing"):
                x, y = getattr(a, f), getattr(b, f)
                assert x.shape == y.shape and np.array_equal(x, y, equal_nan=f == "logprobs"), f
            assert a.turns == b.turns
        assert payloads[0] == payloads[1]
        kinds = [k for (k, _), _ in read_frames(journal.path_of("g-1-a0-resumed"))]
        assert kinds.count("resumed") == 1 and kinds.count("turn") == 5
    finally:
        journal.close()


def test_a_journal_without_a_finished_setup_does_not_resume() -> None:
    begin = (("begin", {"episode_id": "e", "task_id": "t", "group_id": "g", "attempt": 0, "agent_format": "x"}), 10)
    with pytest.raises(NotResumable, match="setup"):
        resume_point([begin, (("segment", {}), 20), (("sandbox", {"id": "s", "record": None}), 30)])
    with pytest.raises(NotResumable, match="eval"):
        resume_point([(("begin", {**begin[0][1], "training": False}), 10)])


async def _dies_at_turn_2(cfg, renderers, sandbox: Sandbox, journal: Journal, task, spool: Spool) -> None:
    """A training episode whose coordinator dies while its turn 2 generates (its sandbox lives on)."""
    stalling = Policy(renderers[FormatName.TOOL_CALLS], stall_at=2)
    dead = RolloutRunner(cfg, renderers, _kept(sandbox), lambda job, t, f: stalling, None, journal=journal)
    run = asyncio.create_task(dead.train_episode(task, "g-1", 0, spool))
    await asyncio.wait_for(stalling.stalled.wait(), 120)
    await journal.drained()
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run


async def test_a_training_episode_its_coordinator_left_resumes_and_is_spooled_once(tmp_path: Path, provider,
                                                                                   renderers) -> None:
    """The rollout side: the dead coordinator's journal is found resumable (its sandbox's record), the restarted
    runner continues it in the reattached sandbox, spools its trajectory once, counts it and removes the journal."""
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    cfg = load_config(None, ["reward.process_every_k_turns=2"])
    sandbox = await provider.create(SandboxRequest())
    spool = Spool.open(tmp_path / "spool", 1 << 30, 1 << 26)
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0)
    try:
        await _dies_at_turn_2(cfg, renderers, sandbox, journal, task, spool)
        journal.close()
        journal = Journal.open(tmp_path / "journal", fsync_window_s=0)  # the restarted coordinator's
        recovered = await recover(journal, spool, resume=True)
        assert (recovered.episodes, recovered.resumable, recovered.infra_errors) == (1, 1, 0)
        unfinished = recovered.unfinished[0]
        assert unfinished.record == sandbox.record() and unfinished.group_id == "g-1"
        runner = RolloutRunner(cfg, renderers, acquire_from(provider), lambda job, t, f: Policy(renderer), None,
                               journal=journal)
        result = await runner.resume_episode(unfinished, task, spool, lambda record: _kept(sandbox)(SandboxRequest()))
        assert result is not None and result.status is EpisodeStatus.OK and result.report.resolved
        assert result.turns == 5 and result.drift_tokens == 0
        assert (runner.stats.resumed, runner.stats.resume_turns_lost, runner.stats.resume_failed) == (1, 0, 0)
        assert runner.stats.train_scored == 1
        with spool.cursor() as cursor:
            records = [cursor.next_nowait(), cursor.next_nowait()]
        assert records[1] is None and records[0] is not None
        traj = decode_trajectory(records[0].payload)
        assert traj.id == "g-1-a0" and len(traj.segments[0].turns) == 5 and traj.reward == 1.0
        await journal.drained()
        assert journal.files() == []
    finally:
        journal.close()
        spool.close()
        await provider.destroy(sandbox)


async def test_an_episode_whose_sandbox_is_gone_ends_as_infra_error(tmp_path: Path, provider, renderers) -> None:
    """A sandbox that did not survive (the local provider's die with their coordinator): the episode's completed
    turns are spooled as infra_error (kept out of training), counted, and its journal goes."""
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    cfg = load_config(None)
    sandbox = await provider.create(SandboxRequest())
    spool = Spool.open(tmp_path / "spool", 1 << 30, 1 << 26)
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0)
    try:
        await _dies_at_turn_2(cfg, renderers, sandbox, journal, task, spool)
        await provider.destroy(sandbox)
        unfinished = (await recover(journal, spool, resume=True)).unfinished[0]
        pool = SandboxPool(provider, load_config(None).sandbox.pool)
        runner = RolloutRunner(cfg, renderers, pool.acquire, lambda job, t, f: Policy(renderer), None, journal=journal)
        assert await runner.resume_episode(unfinished, task, spool, pool.reattach) is None
        assert (runner.stats.resumed, runner.stats.resume_failed, runner.stats.infra_errors) == (0, 1, 1)
        with spool.cursor() as cursor:
            traj = decode_trajectory(cursor.next_nowait().payload)
        assert traj.status is EpisodeStatus.INFRA_ERROR and traj.reward == 0.0 and len(traj.segments[0].turns) == 2
        assert journal.files() == []
    finally:
        journal.close()
        spool.close()


@pytest.mark.slow  # a command that sleeps, killed and run again: about 5 s
async def test_a_turn_in_flight_is_lost_and_played_again(tmp_path: Path, provider, renderers) -> None:
    """Killed while turn 2's command runs: its generation is in the journal but no turn record; the resume cuts it
    (one turn lost, counted), the policy answers turn 2 again, and the trajectory is an uninterrupted run's."""
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    slow = [*COMMANDS[:2], "sleep 2; " + COMMANDS[2], *COMMANDS[3:]]
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0)
    payloads = []
    try:
        for name in ("whole", "resumed"):
            sandbox = await provider.create(SandboxRequest())
            try:
                spec = replace(_spec(task), episode_id=f"g-1-a0-{name}")
                resume = None
                if name == "resumed":
                    await _interrupted(journal, spec, Policy(renderer, commands=slow), sandbox, renderer, gens=3)
                    path = journal.path_of(spec.episode_id)
                    point = resume_point(read_frames(path))
                    assert (point.turns, point.turn_lost) == (2, True)
                    cut(path, point.keep_bytes)
                    resume = (point, sandbox)
                episode = Episode(spec, Policy(renderer, commands=slow), _kept(sandbox), renderer,
                                  Transcript(None, task.id, name), journal=journal.episode(spec.episode_id),
                                  resume=resume)
                result = await episode.run()
                assert result.status is EpisodeStatus.OK and result.report.resolved and result.turns == 5
                payloads.append(encode_trajectory(replace(result.trajectory, id="", timings=())))
            finally:
                await provider.destroy(sandbox)
        assert payloads[0] == payloads[1]
    finally:
        journal.close()
