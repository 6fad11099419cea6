"""Whole episodes over OpenAI-compatible endpoints (the loopback stand-in), through a real local sandbox:
exact tokens over completions, text-level eval over chat (Terminus-2 and tool calls), and endpoint
faults that end as infra errors, never as a scored zero."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openai_standin import StandIn, logprob_of, serve

from t1.agent.episode import Episode, EpisodeResult, EpisodeSpec, acquire_from
from t1.agent.episode_limits import EpisodeLimits
from t1.agent.formats import FormatName, get_format
from t1.agent.transcript import Transcript
from t1.config.inference import InferencePoolConfig
from t1.config.loader import load_config
from t1.inference.openai.openai_pool import OpenAIPool
from t1.inference.types import SamplingParams
from t1.tasks.formats.dataset import load_task
from t1.tito import ChatRenderer
from t1.trajectory.types import EpisodeStatus

WRITE = "echo hello > /app/answer.txt"
TERMINUS_REPLIES = [
    json.dumps({"analysis": "empty", "plan": "write it", "task_complete": False,
                "commands": [{"keystrokes": WRITE + "\n", "duration": 1}]}),
    json.dumps({"analysis": "written", "plan": "", "commands": [], "task_complete": True}),
]
TOOL_REPLIES = [
    '<tool_call>{"name": "bash", "arguments": {"command": "' + WRITE + '"}}</tool_call>',
    '<tool_call>{"name": "finish", "arguments": {}}</tool_call>',
]


def _task(root: Path) -> Path:
    d = root / "echo-task"
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text('[task]\nname = "echo-task"\n[agent]\ntimeout_sec = 60\n[verifier]\n'
                                 'timeout_sec = 30\n')
    (d / "instruction.md").write_text("Write hello into /app/answer.txt\n")
    (d / "tests" / "test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\nif [ "$(cat /app/answer.txt 2>/dev/null)" = "hello" ]; then '
        'echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
    return d


async def _run(tmp_path: Path, provider, renderer: ChatRenderer, fmt: FormatName, pool: OpenAIPool,
               *overrides: str) -> EpisodeResult:
    cfg = load_config(None, ["rollout.turn_retries=1", *overrides])
    task = load_task(_task(tmp_path))
    spec = EpisodeSpec("ep-oa", task, "g", 0, get_format(fmt), SamplingParams(max_tokens=200),
                       EpisodeLimits.from_config(cfg.rollout, cfg.reward))
    return await Episode(
        spec, pool, acquire_from(provider), renderer, Transcript(tmp_path / "tx", task.id, "ep-oa")
    ).run()


def _pool(url: str, **endpoint: object) -> InferencePoolConfig:
    return InferencePoolConfig.model_validate({"retries": 2, "backoff_s": 0.01, "unhealthy_s": 0.01,
                                               "openai": [{"base_url": url, "model": "tiny", **endpoint}]})


async def test_tito_episode_over_completions_trains_on_exactly_the_servers_ids(tmp_path, provider, renderers,
                                                                              tiny_model_dir) -> None:
    renderer = renderers[FormatName.TOOL_CALLS]
    eot = list(renderer.end_of_turn_ids)
    replies = [renderer.encode(t) + eot for t in TOOL_REPLIES]
    s = StandIn(sampler=lambda prompt: replies.pop(0), faults=["429", "", "500"], retry_after="0.05")
    async with serve(s) as url:
        pool = OpenAIPool.from_model(_pool(url), tiny_model_dir)
        try:
            result = await _run(tmp_path, provider, renderer, FormatName.TOOL_CALLS, pool)
        finally:
            await pool.close()
    assert result.status is EpisodeStatus.OK and result.trajectory.reward == 1.0 and not result.text_level
    seg = result.trajectory.segments[0]
    sampled = np.concatenate([np.asarray(x, np.int32) for x in s.sampled])
    assert np.array_equal(seg.token_ids[seg.loss_mask], sampled)
    np.testing.assert_allclose(seg.logprobs[seg.loss_mask], [logprob_of(int(t)) for t in sampled], rtol=1e-6)
    assert result.drift_tokens == 0
    # Requests: 429, ok, 500, ok. A retry resends the same exact context; the next turn extends it.
    prompts = [b["prompt"] for _, b in s.bodies]
    assert len(prompts) == 4 and prompts[0] == prompts[1] and prompts[2] == prompts[3]
    assert prompts[3][: len(prompts[1]) + len(s.sampled[0])] == prompts[1] + s.sampled[0]


@pytest.mark.parametrize("fmt", [FormatName.TERMINUS2, FormatName.TOOL_CALLS])
async def test_eval_episode_over_chat_is_text_level_and_scored_by_the_verifier(tmp_path, provider, renderers,
                                                                              fmt) -> None:
    seen: list[list[dict]] = []

    def reply(messages):
        seen.append(messages)
        turn = len(seen) - 1
        if fmt is FormatName.TERMINUS2:
            return {"role": "assistant", "content": TERMINUS_REPLIES[turn]}
        call = {"name": "bash", "arguments": json.dumps({"command": WRITE})} if turn == 0 else \
            {"name": "finish", "arguments": "{}"}
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": f"srv{turn}", "type": "function", "function": call}]}

    s = StandIn(chat=reply)
    async with serve(s) as url:
        pool = OpenAIPool(_pool(url, api="chat", tool_calls=fmt is FormatName.TOOL_CALLS))
        try:
            result = await _run(tmp_path, provider, renderers[fmt], fmt, pool)
        finally:
            await pool.close()
    assert result.status is EpisodeStatus.OK and result.trajectory.reward == 1.0 and result.turns == 2
    assert result.text_level
    assert "text-level" in Path(result.transcript).read_text()
    second = seen[1]
    if fmt is FormatName.TERMINUS2:
        assert second[-2] == {"role": "assistant", "content": TERMINUS_REPLIES[0]}
        assert second[-1]["role"] == "user" and "New Terminal Output" in second[-1]["content"]
        assert "tools" not in s.bodies[0][1]
    else:
        call = second[-2]["tool_calls"][0]
        assert second[-2]["role"] == "assistant" and call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"command": WRITE}
        assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == call["id"]
        assert [t["function"]["name"] for t in s.bodies[0][1]["tools"]] == ["bash", "finish"]


@pytest.mark.parametrize("fault", ["500", "malformed", "auth"])
async def test_endpoint_faults_past_retries_are_infra_errors_never_a_scored_zero(tmp_path, provider, renderers,
                                                                                tiny_model_dir, monkeypatch,
                                                                                fault) -> None:
    monkeypatch.setenv("T1_TEST_OPENAI_KEY", "sk-wrong")
    s = StandIn(faults=[fault] * 50, api_key="sk-right" if fault == "auth" else "")
    key = {"api_key_env": "T1_TEST_OPENAI_KEY"} if fault == "auth" else {}
    async with serve(s) as url:
        pool = OpenAIPool.from_model(_pool(url, **key), tiny_model_dir)
        try:
            result = await _run(tmp_path, provider, renderers[FormatName.TOOL_CALLS], FormatName.TOOL_CALLS, pool)
        finally:
            await pool.close()
    assert result.status is EpisodeStatus.INFRA_ERROR and result.turns == 0
    assert "InferenceFailed" in result.failure_mode
    assert ("401" in result.failure_mode) if fault == "auth" else ("every attempt" in result.failure_mode)
