"""The episode loop through real parts: local sandbox over SSH, the tiny model's chat template, TITO, verifiers.

The policy is the scripted one (the task's reference solution typed as actions), so outcomes
are known: a solvable task resolves, and the tokens in the loss region are exactly the replies.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from t1.agent import transcript as transcript_module
from t1.agent.episode import Episode, EpisodeSpec, acquire_from
from t1.agent.episode_limits import EpisodeLimits
from t1.agent.formats import FormatName, get_format
from t1.agent.scripted import ScriptedPolicy
from t1.agent.transcript import Transcript
from t1.config.loader import load_config
from t1.inference.types import FinishReason, GenerateRequest, GenerateResult, SamplingParams
from t1.tasks.formats.dataset import load_task
from t1.trajectory.types import EpisodeStatus


def limits(*overrides: str) -> EpisodeLimits:
    """Limits as production makes them, from the config (with dotted overrides)."""
    cfg = load_config(None, list(overrides))
    return EpisodeLimits.from_config(cfg.rollout, cfg.reward)


def _task(root: Path, name: str, word: str) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "task.toml").write_text(f'[task]\nname = "{name}"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n')
    (d / "instruction.md").write_text(f"Write {word} into /app/answer.txt\n")
    (d / "tests" / "test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\n'
        f'if [ "$(cat /app/answer.txt 2>/dev/null)" = "{word}" ]; then echo 1 > /logs/verifier/reward.txt; '
        'else echo 0 > /logs/verifier/reward.txt; fi\n')
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {word} > /app/answer.txt\n")
    return d


def _says(renderer, text: str, req: GenerateRequest) -> GenerateResult:
    """A policy's reply of `text` (ended like a sampled turn) to `req`."""
    ids = np.asarray(renderer.encode(text) + list(renderer.end_of_turn_ids), np.int32)
    return GenerateResult(ids, np.full(len(ids), -1.0, np.float32), FinishReason.STOP, 0,
                          np.zeros(len(ids), np.int32), None, len(req.prompt_ids))


@pytest.mark.parametrize("fmt_name", [FormatName.TOOL_CALLS, FormatName.TERMINUS2])
async def test_scripted_episode_resolves_with_exact_tokens(tmp_path: Path, provider, renderers, fmt_name) -> None:
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[fmt_name]
    policy = ScriptedPolicy(renderer, policy_version=3)
    fmt = get_format(fmt_name)
    spec = EpisodeSpec("ep-1", task, "g-1", 0, fmt, SamplingParams(max_tokens=400), limits())
    scripted = policy.for_episode(task, fmt)
    replies: list[np.ndarray] = []

    async def recording(req: GenerateRequest) -> GenerateResult:
        res = await scripted(req)
        replies.append(res.token_ids)
        return res

    result = await Episode(
        spec, recording, acquire_from(provider), renderer, Transcript(tmp_path / "tx", task.id, "ep-1")
    ).run()
    assert result.status is EpisodeStatus.OK, result.failure_mode
    assert result.report.resolved and result.trajectory.reward == 1.0
    assert result.turns == 2
    seg = result.trajectory.segments[0]
    # The loss region is exactly the sampled replies, in order, with their versions.
    assert np.array_equal(seg.token_ids[seg.loss_mask], np.concatenate(replies))
    assert (seg.policy_versions[seg.loss_mask] == 3).all()
    assert [(t.end - t.start) for t in seg.turns] == [len(r) for r in replies]
    text = Path(result.transcript).read_text()
    assert "base64 -d" in text and "## Result" in text and "- reward: 1" in text


async def test_bad_replies_count_as_turns_and_unsolved_task_scores_zero(tmp_path: Path, provider, renderers) -> None:
    task = load_task(_task(tmp_path, "t", "x"))
    renderer = renderers[FormatName.TOOL_CALLS]

    async def babbling(req: GenerateRequest) -> GenerateResult:
        return _says(renderer, "I will not use tools.", req)

    spec = EpisodeSpec("ep-2", task, "g", 0, get_format("tool_calls"), SamplingParams(max_tokens=64),
                       limits("rollout.max_turns=3"))
    result = await Episode(spec, babbling, acquire_from(provider), renderer, Transcript(None, task.id, "ep-2")).run()
    assert result.status is EpisodeStatus.OK and result.turns == 3
    assert result.trajectory.reward == 0.0 and not result.report.resolved
    prompt = renderer.decode(result.trajectory.segments[0].token_ids.tolist())
    assert prompt.count("ERROR: no tool call found") == 2  # the third turn hit the limit


async def test_bad_replies_in_a_row_end_the_episode_and_its_work_is_verified(tmp_path: Path, provider,
                                                                             renderers) -> None:
    """rollout.max_bad_replies counts replies in a row: a valid action between bad ones starts the count again,
    and the episode that ends on the limit is verified like one at the turn limit (its work counts)."""
    task = load_task(_task(tmp_path, "t", "x"))
    renderer = renderers[FormatName.TOOL_CALLS]
    good = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo x > /app/answer.txt"}}\n</tool_call>'
    script = ["no tools", good, "still none", "none again", good, good]  # the last two are never asked for
    asked: list[str] = []

    async def policy(req: GenerateRequest) -> GenerateResult:
        asked.append(script[len(asked)])
        return _says(renderer, asked[-1], req)

    spec = EpisodeSpec("ep-b", task, "g", 0, get_format("tool_calls"), SamplingParams(max_tokens=64),
                       limits("rollout.max_turns=10", "rollout.max_bad_replies=2"))
    tx = Transcript(tmp_path / "tx", task.id, "ep-b")
    result = await Episode(spec, policy, acquire_from(provider), renderer, tx).run()
    assert asked == script[:4] and result.turns == 4
    assert result.status is EpisodeStatus.OK and result.report.resolved and result.trajectory.reward == 1.0
    assert "2 bad replies in a row: the episode ends" in Path(result.transcript).read_text()


@pytest.mark.parametrize("process", [False, True])
async def test_a_reply_with_no_valid_action_costs_its_penalty(tmp_path: Path, provider, renderers,
                                                              process: bool) -> None:
    """reward.bad_reply_penalty: each malformed reply (a broken finish call too) is taken off the episode's reward,
    and with process rewards off that turn's own reward, so the returns still add up to the episode's reward."""
    task = load_task(_task(tmp_path, "t", "x"))
    renderer = renderers[FormatName.TOOL_CALLS]
    good = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo x > /app/answer.txt"}}\n</tool_call>'
    broken_finish = '<tool_call>\n{"name": "finish", "bash > answer.txt"}}\n</tool_call>'  # seen in a PPO run
    script = ["no tools", good, broken_finish, "none again"]

    asked: list[str] = []

    async def policy(req: GenerateRequest) -> GenerateResult:
        asked.append(script[len(asked)])
        return _says(renderer, asked[-1], req)

    overrides = ["rollout.max_turns=10", "rollout.max_bad_replies=2", "reward.bad_reply_penalty=0.25",
                 *(["reward.process_every_k_turns=1"] if process else [])]
    spec = EpisodeSpec(
        "ep-p", task, "g", 0, get_format("tool_calls"), SamplingParams(max_tokens=64), limits(*overrides)
    )
    result = await Episode(spec, policy, acquire_from(provider), renderer, Transcript(None, task.id, "ep-p")).run()
    assert result.turns == 4 and result.report.resolved
    assert result.trajectory.reward == pytest.approx(1.0 - 3 * 0.25)
    turns = result.trajectory.segments[0].turns
    expected = [-0.25, 1.0, -0.25, -0.25] if process else [0.0] * 4
    assert [t.reward for t in turns] == pytest.approx(expected)


async def test_inference_failure_past_retries_is_infra_error(tmp_path: Path, provider, renderers) -> None:
    task = load_task(_task(tmp_path, "t", "x"))
    calls = 0

    async def dead(req: GenerateRequest) -> GenerateResult:
        nonlocal calls
        calls += 1
        raise ConnectionError("replica gone")

    spec = EpisodeSpec("ep-3", task, "g", 0, get_format("tool_calls"), SamplingParams(max_tokens=64),
                       limits("rollout.turn_retries=2"))
    result = await Episode(
        spec, dead, acquire_from(provider), renderers[FormatName.TOOL_CALLS], Transcript(None, task.id, "e")
    ).run()
    assert calls == 3
    assert result.status is EpisodeStatus.INFRA_ERROR and result.trajectory.reward == 0.0
    assert "InferenceFailed" in result.failure_mode


async def test_process_rewards_sum_to_final_count(tmp_path: Path, provider, renderers) -> None:
    task = load_task(_task(tmp_path, "t", "yes"))
    renderer = renderers[FormatName.TOOL_CALLS]
    fmt = get_format("tool_calls")
    scripted = ScriptedPolicy(renderer).for_episode(task, fmt)
    spec = EpisodeSpec(
        "ep-4", task, "g", 0, fmt, SamplingParams(max_tokens=400), limits("reward.process_every_k_turns=1")
    )
    result = await Episode(spec, scripted, acquire_from(provider), renderer, Transcript(None, task.id, "ep-4")).run()
    turns = result.trajectory.segments[0].turns
    # The solution turn takes the passing count from 0 to 1; the finish turn adds nothing.
    assert [t.reward for t in turns] == [1.0, 0.0] and result.trajectory.reward == 1.0
    assert sum(t.reward for t in turns) == result.report.passed == 1


async def test_cancelled_episode_keeps_its_transcript(tmp_path: Path, provider, renderers, monkeypatch) -> None:
    """Transcript writes are buffered; an episode cancelled mid-turn still leaves every turn it wrote on disk."""
    monkeypatch.setattr(transcript_module, "FLUSH_EVERY_S", 3600.0)
    task = load_task(_task(tmp_path, "t", "x"))
    renderer = renderers[FormatName.TOOL_CALLS]
    fmt = get_format("tool_calls")
    scripted = ScriptedPolicy(renderer).for_episode(task, fmt)
    second_turn = asyncio.Event()

    async def stalls_on_second_turn(req: GenerateRequest) -> GenerateResult:
        if scripted.calls == 1:
            second_turn.set()
            await asyncio.Event().wait()  # the model never answers: the episode is cancelled here
        return await scripted(req)

    tx = Transcript(tmp_path / "tx", task.id, "ep-5")
    spec = EpisodeSpec("ep-5", task, "g", 0, fmt, SamplingParams(max_tokens=400), limits())
    run = asyncio.create_task(Episode(spec, stalls_on_second_turn, acquire_from(provider), renderer, tx).run())
    await asyncio.wait_for(second_turn.wait(), 60)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert tx.path is not None
    text = tx.path.read_text()
    assert "## Turn 0" in text and "base64 -d" in text and "exit 0" in text


async def test_training_episode_is_spooled_byte_exact(tmp_path: Path, provider, renderers) -> None:
    """RolloutRunner.train_episode: export, encode and the fsynced append run off the loop; the spooled
    record is the episode's trajectory, and the runner knows which policy versions sampled it."""
    from t1.coordinator.rollout.runner import RolloutRunner
    from t1.coordinator.spool.trajectory_spool import Spool
    from t1.trajectory.serialization import decode_trajectory, encode_trajectory

    task = load_task(_task(tmp_path, "spooled", "yes"))
    policy = ScriptedPolicy(renderers[FormatName.TOOL_CALLS], policy_version=7)
    cfg = load_config(None)
    runner = RolloutRunner(cfg, renderers, acquire_from(provider), lambda job, task, fmt: policy.for_episode(task, fmt),
                           tmp_path / "tx")
    spool = Spool.open(tmp_path / "spool", max_bytes=1 << 30, segment_bytes=1 << 20)
    result = await runner.train_episode(task, "grp", 0, spool)
    assert result.status is EpisodeStatus.OK and result.trajectory.reward == 1.0
    with spool.cursor() as cursor:
        rec = cursor.next_nowait()
    assert rec is not None and rec.trajectory_id == result.trajectory.id
    assert rec.payload == encode_trajectory(result.trajectory)
    back = decode_trajectory(rec.payload)
    assert np.array_equal(back.segments[0].token_ids, result.trajectory.segments[0].token_ids)
    assert runner.stats.versions == {7} and runner.stats.finished == 1
    assert "## Result" in Path(result.transcript).read_text()
    spool.close()


async def test_only_training_episodes_run_the_per_turn_verifiers(tmp_path: Path, provider, renderers) -> None:
    """Process rewards are a training signal: a training episode gets its turn rewards, while an eval attempt
    and a demonstration (run_episode's default) run only the final verification, with the same outcome."""
    from t1.coordinator.rollout.runner import RolloutRunner
    from t1.coordinator.spool.trajectory_spool import Spool

    task = load_task(_task(tmp_path, "per-turn", "yes"))
    policy = ScriptedPolicy(renderers[FormatName.TOOL_CALLS])
    cfg = load_config(None, ["reward.process_every_k_turns=1"])
    runner = RolloutRunner(cfg, renderers, acquire_from(provider), lambda job, task, fmt: policy.for_episode(task, fmt),
                           tmp_path / "tx")
    spool = Spool.open(tmp_path / "spool", max_bytes=1 << 30, segment_bytes=1 << 20)
    trained = await runner.train_episode(task, "grp", 0, spool)
    spool.close()
    plain = await runner.run_episode(task, "grp", 1)
    assert [t.reward for t in trained.trajectory.segments[0].turns] == [1.0, 0.0]
    assert [t.reward for t in plain.trajectory.segments[0].turns] == [0.0, 0.0]
    assert trained.report.resolved and plain.report.resolved and plain.trajectory.reward == 1.0
    assert "Verifier (turn 1)" in Path(trained.transcript).read_text()
    assert "Verifier (turn" not in Path(plain.transcript).read_text()


async def test_episodes_ending_together_hold_at_most_the_ending_slots(tmp_path: Path, provider, renderers,
                                                                      monkeypatch) -> None:
    """RolloutRunner: between its export and the end of `persist`, an episode holds one slot: copies stay bounded."""
    from t1.coordinator.rollout import runner as rollout

    monkeypatch.setattr(rollout, "ENDING_SLOTS", 2)
    task = load_task(_task(tmp_path, "t", "x"))

    async def dead(req: GenerateRequest) -> GenerateResult:
        raise ConnectionError("replica gone")

    holding, most, persisted = 0, 0, []

    async def persist(traj) -> None:
        nonlocal holding, most
        holding += 1
        most = max(most, holding)
        await asyncio.sleep(0.05)  # a slow disk
        persisted.append(traj.id)
        holding -= 1

    cfg = load_config(None, ["rollout.transcripts=false", "rollout.turn_retries=0"])
    runner = rollout.RolloutRunner(cfg, renderers, acquire_from(provider), lambda job, task, fmt: dead, None)
    options = rollout.EpisodeOptions(persist=persist)
    results = await asyncio.gather(*(runner.run_episode(task, "g", i, options) for i in range(6)))
    assert sorted(persisted) == sorted(r.trajectory.id for r in results) and len(persisted) == 6
    assert all(r.status is EpisodeStatus.INFRA_ERROR for r in results)
    assert most == 2


async def test_separate_verifier_sees_only_declared_artifacts(tmp_path: Path, provider, renderers) -> None:
    """Harbor environment_mode = "separate": the episode's verifier runs in a fresh sandbox that got the artifacts."""
    d = _task(tmp_path, "sep-task", "hello")
    (d / "task.toml").write_text('artifacts = ["/app/answer.txt"]\n[task]\nname = "sep-task"\n[agent]\n'
                                 'timeout_sec = 60\n[verifier]\ntimeout_sec = 30\nenvironment_mode = "separate"\n')
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/answer.txt; touch /app/agent-only\n")
    (d / "tests" / "test.sh").write_text(
        '#!/bin/bash\nok=0; [ "$(cat /app/answer.txt)" = hello ] && [ ! -e /app/agent-only ] && ok=1\n'
        'echo $ok > /logs/verifier/reward.txt\n')
    task = load_task(d)
    renderer = renderers[FormatName.TOOL_CALLS]
    fmt = get_format(FormatName.TOOL_CALLS)
    spec = EpisodeSpec("ep-sep", task, "g", 0, fmt, SamplingParams(max_tokens=400), limits())
    policy = ScriptedPolicy(renderer).for_episode(task, fmt)
    result = await Episode(spec, policy, acquire_from(provider), renderer, Transcript(None, task.id, "ep-sep")).run()
    assert result.status is EpisodeStatus.OK and result.report.resolved, (result.failure_mode, result.report)


async def test_every_generate_session_is_ended_when_the_episode_ends(tmp_path: Path, provider, renderers) -> None:
    """A generate function that keeps per-session state (the InferencePool) is told each session ended."""
    task = load_task(_task(tmp_path, "t", "yes"))
    renderer = renderers[FormatName.TOOL_CALLS]
    fmt = get_format("tool_calls")
    scripted = ScriptedPolicy(renderer).for_episode(task, fmt)
    requested: list[str] = []
    ended: list[tuple[str, int]] = []

    class Sessions:
        async def __call__(self, req: GenerateRequest) -> GenerateResult:
            assert req.session_id not in {s for s, _ in ended}, "a request on a session already ended"
            requested.append(req.session_id)
            return await scripted(req)

        def end_session(self, session_id: str) -> None:
            ended.append((session_id, len(requested)))

    spec = EpisodeSpec("ep-6", task, "g", 0, fmt, SamplingParams(max_tokens=400), limits())
    result = await Episode(spec, Sessions(), acquire_from(provider), renderer, Transcript(None, task.id, "e")).run()
    assert result.status is EpisodeStatus.OK and len(requested) == 2
    assert [s for s, _ in ended] == ["ep-6/s1"] and ended[0][1] == len(requested)


def _task_with_a_passing_check(root: Path) -> Path:
    """Two checks in reward.json, one already passing before the agent's first turn (a baseline of 1)."""
    d = _task(root, "baseline", "yes")
    (d / "environment").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nRUN echo ready > /app/ready.txt\n")
    (d / "tests" / "test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\nr=0; a=0\n[ -f /app/ready.txt ] && r=1\n'
        '[ "$(cat /app/answer.txt 2>/dev/null)" = yes ] && a=1\n'
        'echo "{\\"ready\\": $r, \\"answer\\": $a}" > /logs/verifier/reward.json\n')
    return d


@pytest.mark.parametrize("shared", [True, False])
async def test_a_group_measures_its_baseline_once(tmp_path: Path, provider, renderers, shared: bool) -> None:
    """The attempts of a group start alike: one verifier run before their first turns serves them all, and
    the process rewards are what each attempt would have measured itself (the answer's check: +1)."""
    from t1.coordinator.rollout.runner import RolloutRunner
    from t1.coordinator.spool.trajectory_spool import Spool

    task = load_task(_task_with_a_passing_check(tmp_path))
    policy = ScriptedPolicy(renderers[FormatName.TOOL_CALLS])
    cfg = load_config(None, ["reward.process_every_k_turns=1", f"reward.shared_baseline={str(shared).lower()}"])
    runner = RolloutRunner(cfg, renderers, acquire_from(provider), lambda job, task, fmt: policy.for_episode(task, fmt),
                           tmp_path / "tx")
    spool = Spool.open(tmp_path / "spool", max_bytes=1 << 30, segment_bytes=1 << 20)
    results = await asyncio.gather(*(runner.train_episode(task, "grp", i, spool) for i in range(4)))
    spool.close()
    for r in results:
        assert [t.reward for t in r.trajectory.segments[0].turns] == [1.0, 0.0] and r.report.passed == 2
    texts = [Path(r.transcript).read_text() for r in results]
    assert sum("Verifier (baseline)" in t for t in texts) == (1 if shared else 4)
    assert sum("measured by another attempt of the group" in t for t in texts) == (3 if shared else 0)
