"""Eval jobs against an OpenAI-compatible endpoint, over real gRPC on 127.0.0.1: the CLI's
`--endpoint URL --model NAME`, what an attempt is given, the text-level mark, and requests refused
by the field they got wrong."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from t1.cli.main import main as t1_main
from t1.config.shared import AuthConfig, ServerConfig
from t1.config.tasks import TasksConfig
from t1.coordinator.evals.eval_jobs import EvalAttempt, EvalJobs
from t1.coordinator.evals.job_store import JobStore
from t1.coordinator.evals.service import CoordinatorServicer
from t1.coordinator.tasksource import make_resolver
from t1.evals.results import AttemptOutcome
from t1.rpc.server import GrpcServer
from t1.trajectory.types import EpisodeStatus
from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc

URL = "https://api.example.invalid/v1"


class Recording:
    def __init__(self) -> None:
        self.attempts: list[EvalAttempt] = []

    async def __call__(self, a: EvalAttempt) -> AttemptOutcome:
        self.attempts.append(a)
        return AttemptOutcome(a.task.id, a.attempt, 0.0, 0, 1, EpisodeStatus.OK, turns=1)


async def _serve(tmp_path: Path, runner: Recording) -> tuple[GrpcServer, EvalJobs]:
    jobs = EvalJobs(JobStore(tmp_path / "jobs.db"), make_resolver(TasksConfig()), runner, default_concurrency=2)
    server = GrpcServer([CoordinatorServicer(jobs, lambda: pb.RunStatus(run_name="t")).binding()],
                        ServerConfig(port=0), AuthConfig())
    await server.start()
    return server, jobs


async def test_cli_submits_an_endpoint_job_that_runs_terminus2_and_reports_text_level(
        tmp_path: Path, task_root: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("T1_TEST_HOSTED_KEY", "sk-x")
    runner = Recording()
    server, jobs = await _serve(tmp_path, runner)
    try:
        rc = await asyncio.to_thread(t1_main, [
            "eval", "submit", "--tasks", str(task_root), "--endpoint", URL, "--model", "hosted-1",
            "--api-key-env", "T1_TEST_HOSTED_KEY", "--wait", "--address", server.address])
        out = capsys.readouterr().out
    finally:
        await jobs.close()
        await server.stop(0)
    assert rc == 0 and f"endpoint {URL} model hosted-1: text-level (no exact tokens)" in out
    assert runner.attempts
    for a in runner.attempts:
        assert a.openai is not None and a.openai.base_url == URL and a.openai.model == "hosted-1"
        assert a.openai.api == "chat" and a.openai.api_key_env == "T1_TEST_HOSTED_KEY"
        assert a.agent_format == "terminus2" and a.inference_endpoints == ()


def test_cli_refuses_an_endpoint_url_without_a_model(task_root: Path) -> None:
    with pytest.raises(SystemExit, match="needs --model NAME"):
        t1_main(["eval", "submit", "--tasks", str(task_root), "--endpoint", URL, "--address", "127.0.0.1:1"])
    with pytest.raises(SystemExit, match="--model goes with an OpenAI-compatible --endpoint URL"):
        t1_main(["eval", "submit", "--tasks", str(task_root), "--endpoint", "127.0.0.1:5", "--model", "m",
                 "--address", "127.0.0.1:1"])


@pytest.mark.parametrize(("endpoint", "fmt", "field"), [
    ({"base_url": "ftp://h/v1", "model": "m"}, 0, "openai_endpoint.base_url"),
    ({"base_url": URL, "model": ""}, 0, "openai_endpoint.model"),
    ({"base_url": URL, "model": "m", "api": "embeddings"}, 0, "openai_endpoint.api"),
    ({"base_url": URL, "model": "m", "api_key_env": "T1_TEST_UNSET_KEY"}, 0, "T1_TEST_UNSET_KEY is not set"),
    ({"base_url": URL, "model": "m"}, pb.AGENT_FORMAT_TOOL_CALLS, "agent_format: tool_calls over a chat endpoint"),
])
async def test_bad_endpoint_requests_name_the_field(tmp_path: Path, task_root: Path, endpoint, fmt, field) -> None:
    server, jobs = await _serve(tmp_path, Recording())
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = pb_grpc.CoordinatorServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1, agent_format=fmt,
                                                           openai_endpoint=pb.OpenAIEndpoint(**endpoint)))
    finally:
        await jobs.close()
        await server.stop(0)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
