"""Real harnesses from PyPI, unmodified, in a local sandbox against the episode's gateway and the tiny model.

They are installed by scripts/harnesses.sh (run by setup) under /opt/t1-harnesses, where every
sandbox sees them. The tiny model's replies are noise; what is checked is the plumbing: every call
the harness made is in the trajectory with the sampler's exact ids (drift 0), routing for every
position, and its segments counted by cause.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from t1.config.rollout import HarnessConfig
from t1.inference.types import FinishReason, GenerateRequest, GenerateResult, collect
from t1.trajectory.types import EpisodeStatus

from .test_harness_episode import episode

HARNESSES = Path("/opt/t1-harnesses")
MINI = (f"{HARNESSES}/mini-swe-agent/bin/mini -y --exit-immediately -m openai/$T1_MODEL "
        '-t "$(cat $T1_INSTRUCTION_FILE)" -c mini.yaml -c agent.step_limit=4 -c agent.cost_limit=0 '
        "-o /tmp/mini.traj.json")
TERMINUS2 = f"{HARNESSES}/harbor/bin/t1-terminus2 --max-turns 4 --context-tokens 8192"
TERMINUS2_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
# Aider edits files from one message (--message-file) and exits; whole-file edits, its histories out of /app. A
# message that starts with "/" is one of its commands (an instruction that opens with a path would be refused).
AIDER = ('{ echo "Task:"; cat $T1_INSTRUCTION_FILE; } > /tmp/aider.task.md && '
         f"{HARNESSES}/aider/bin/aider --model openai/$T1_MODEL --message-file /tmp/aider.task.md --yes-always "
         "--no-git --no-gitignore --no-auto-commits --edit-format whole --map-tokens 0 --no-check-update "
         "--analytics-disable --no-show-model-warnings --no-show-release-notes --no-pretty --no-detect-urls "
         "--chat-history-file /tmp/aider.chat.md --input-history-file /tmp/aider.input")
AIDER_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "AIDER_ANALYTICS": "false"}
MINI_ENV = {"MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2"}


def installed(name: str) -> Path:
    path = HARNESSES / name
    if not (path / "bin" / "python").exists() or (name == "harbor" and not (path / "bin" / "t1-terminus2").exists()):
        pytest.fail(f"{path}: the {name} harness is not installed (scripts/harnesses.sh)")
    return path


async def noise_episode(tmp_path: Path, provider, renderers, backend, harness: HarnessConfig):
    """An episode of `harness` against the tiny model's noise replies; checks the plumbing (the loss region is
    the sampler's ids exactly, drift 0, every segment counted by cause) and returns the episode, its result and
    its transcript."""
    sampled: list[np.ndarray] = []

    async def generate(req: GenerateRequest) -> GenerateResult:
        res = await collect(backend.stream(req))
        sampled.append(res.token_ids.copy())
        return res

    ep = episode(tmp_path, provider, renderers, generate, harness)
    result = await ep.run()
    text = Path(result.transcript).read_text()
    if result.trajectory.segments:
        loss = np.concatenate([s.token_ids[s.loss_mask] for s in result.trajectory.segments])
        assert np.array_equal(loss, np.concatenate(sampled)), text[-4000:]
    assert result.drift_tokens == 0
    assert sum(ep.segment_causes.values()) == len(result.trajectory.segments)
    return ep, result, text


@pytest.mark.slow
async def test_mini_swe_agent_runs_unmodified_with_exact_tokens(tmp_path: Path, provider, renderers, backend) -> None:
    installed("mini-swe-agent")
    harness = HarnessConfig(command=MINI, env=MINI_ENV, timeout_s=240)
    ep, result, text = await noise_episode(tmp_path, provider, renderers, backend, harness)
    assert result.status is EpisodeStatus.OK, (result.failure_mode, text[-4000:])
    assert ep.gateway.calls >= 2, text[-4000:]
    print(dict(ep.segment_causes), [r.cause for r in ep.gateway.records])


async def test_mini_swe_agent_solves_with_tool_calls_in_one_segment(tmp_path: Path, provider, renderers) -> None:
    """Replies that are the template's tool calls (a policy that has learnt the format): mini-swe-agent runs
    them, echoes each reply with its tool result, and every call continues the one segment."""
    installed("mini-swe-agent")
    renderer = renderers[next(iter(renderers))]
    script = ['<tool_call>\n{"name": "bash", "arguments": {"command": "echo hello > /app/answer.txt"}}\n</tool_call>',
              'Done.\n<tool_call>\n{"name": "bash", "arguments": {"command": "echo '
              'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}'
              '\n</tool_call>']
    prompts: list[int] = []

    async def generate(req: GenerateRequest) -> GenerateResult:
        prompts.append(len(req.prompt_ids))
        ids = np.asarray(renderer.encode(script[len(prompts) - 1]) + list(renderer.end_of_turn_ids), np.int32)
        return GenerateResult(ids, np.full(len(ids), -0.5, np.float32), FinishReason.STOP, 7,
                              np.full(len(ids), 7, np.int32), None, len(req.prompt_ids))

    ep = episode(tmp_path, provider, renderers, generate, HarnessConfig(command=MINI, env=MINI_ENV, timeout_s=240))
    result = await ep.run()
    text = Path(result.transcript).read_text()
    assert result.status is EpisodeStatus.OK, (result.failure_mode, text[-4000:])
    assert result.report.resolved and result.trajectory.reward == 1.0
    assert ep.gateway.calls == 2 and dict(ep.segment_causes) == {"first": 1}, [r.cause for r in ep.gateway.records]
    (seg,) = result.trajectory.segments
    assert result.drift_tokens == 0 and (seg.policy_versions[seg.loss_mask] == 7).all()
    # The second call sent only the reply's delta and the tool result after the first context.
    assert prompts[1] > prompts[0] + seg.turns[0].end - seg.turns[0].start


@pytest.mark.slow
async def test_terminus2_runs_unmodified_with_exact_tokens(tmp_path: Path, provider, renderers, backend) -> None:
    installed("harbor")
    # Noise replies never parse as Terminus-2 JSON: it asks again until its limit here.
    harness = HarnessConfig(command=TERMINUS2, env=TERMINUS2_ENV, timeout_s=45)
    ep, result, text = await noise_episode(tmp_path, provider, renderers, backend, harness)
    assert result.status in (EpisodeStatus.OK, EpisodeStatus.TIMEOUT), (result.failure_mode, text[-4000:])
    assert ep.gateway.calls >= 2, text[-4000:]


async def test_terminus2_solves_in_one_segment(tmp_path: Path, provider, renderers) -> None:
    """Replies in Terminus-2's JSON protocol: Harbor's agent types them into its tmux session in the sandbox,
    echoes each reply with the new terminal output, and every call continues the one segment."""
    installed("harbor")
    renderer = renderers[next(iter(renderers))]
    step = {"analysis": "a", "plan": "p", "commands": [{"keystrokes": "echo hello > /app/answer.txt\n",
                                                        "duration": 0.5}], "task_complete": False}
    script = [json.dumps(step), json.dumps({**step, "commands": [], "task_complete": True})]
    calls = 0

    async def generate(req: GenerateRequest) -> GenerateResult:
        nonlocal calls
        calls += 1
        ids = np.asarray(renderer.encode(script[min(calls, 2) - 1]) + list(renderer.end_of_turn_ids), np.int32)
        return GenerateResult(ids, np.full(len(ids), -0.5, np.float32), FinishReason.STOP, 5,
                              np.full(len(ids), 5, np.int32), None, len(req.prompt_ids))

    harness = HarnessConfig(command=TERMINUS2, env=TERMINUS2_ENV, timeout_s=240)
    ep = episode(tmp_path, provider, renderers, generate, harness)
    result = await ep.run()
    text = Path(result.transcript).read_text()
    assert result.status is EpisodeStatus.OK, (result.failure_mode, text[-4000:])
    assert result.report.resolved and result.trajectory.reward == 1.0, text[-4000:]
    assert ep.gateway.calls >= 2 and dict(ep.segment_causes) == {"first": 1}, [r.cause for r in ep.gateway.records]
    assert result.drift_tokens == 0 and len(result.trajectory.segments) == 1


@pytest.mark.slow
async def test_aider_runs_unmodified_with_exact_tokens(tmp_path: Path, provider, renderers, backend) -> None:
    installed("aider")
    # Noise replies hold no edit: aider answers its one message and exits.
    harness = HarnessConfig(command=AIDER, env=AIDER_ENV, timeout_s=240)
    ep, result, text = await noise_episode(tmp_path, provider, renderers, backend, harness)
    assert result.status is EpisodeStatus.OK, (result.failure_mode, text[-4000:])
    assert ep.gateway.calls >= 1, text[-4000:]


@pytest.mark.slow
async def test_aider_solves_with_a_whole_file_edit(tmp_path: Path, provider, renderers) -> None:
    """A reply in aider's whole-file edit format (a policy that has learnt it): aider writes the file in the
    sandbox, the verifier scores it, and its one call is the trajectory's one segment."""
    installed("aider")
    renderer = renderers[next(iter(renderers))]
    reply = "answer.txt\n```\nhello\n```"
    prompts: list[int] = []

    async def generate(req: GenerateRequest) -> GenerateResult:
        prompts.append(len(req.prompt_ids))
        ids = np.asarray(renderer.encode(reply) + list(renderer.end_of_turn_ids), np.int32)
        return GenerateResult(ids, np.full(len(ids), -0.5, np.float32), FinishReason.STOP, 3,
                              np.full(len(ids), 3, np.int32), None, len(req.prompt_ids))

    ep = episode(tmp_path, provider, renderers, generate, HarnessConfig(command=AIDER, env=AIDER_ENV, timeout_s=240))
    result = await ep.run()
    text = Path(result.transcript).read_text()
    assert result.status is EpisodeStatus.OK, (result.failure_mode, text[-4000:])
    assert result.report.resolved and result.trajectory.reward == 1.0, text[-4000:]
    assert ep.gateway.calls == 1 and dict(ep.segment_causes) == {"first": 1}, [r.cause for r in ep.gateway.records]
    (seg,) = result.trajectory.segments
    assert result.drift_tokens == 0 and (seg.policy_versions[seg.loss_mask] == 3).all()
