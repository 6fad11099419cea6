"""Issue 19 cases 1, 6 and 7 at the RPC edge: bounded fields, lazy attempts, bounded pass@k, paged
ListJobs, SQLite off the event loop, a job that cannot be resumed marked failed, a damaged jobs.db
named in its error. Real gRPC on 127.0.0.1, the real store, a scripted AttemptRunner."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import pytest

from t1.cli.main import main as t1_main
from t1.config.limits import RequestLimits
from t1.config.shared import AuthConfig, ServerConfig
from t1.config.tasks import TasksConfig
from t1.coordinator.evals.eval_jobs import EvalAttempt, EvalJobs
from t1.coordinator.evals.eval_request import (
    EvalRequest,
    OpenAIEndpointRequest,
    request_bytes,
    request_of,
    stored_request,
)
from t1.coordinator.evals.job_store import JobState, JobStore
from t1.coordinator.evals.service import CoordinatorServicer
from t1.coordinator.tasksource import make_resolver
from t1.evals.results import AttemptOutcome, summarize, summary_of
from t1.rpc.errors import RequestError
from t1.rpc.server import GrpcServer
from t1.trajectory.types import EpisodeStatus
from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc
from t1.workdir import StorageError


class CountingRunner:
    """Resolves attempts divisible by 3; tracks how many run at once."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.runs = 0
        self.now = 0
        self.peak = 0

    async def __call__(self, a: EvalAttempt) -> AttemptOutcome:
        self.runs += 1
        self.now += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(self.delay_s)
        self.now -= 1
        ok = a.attempt % 3 == 0
        return AttemptOutcome(a.task.id, a.attempt, float(ok), int(ok), 1, EpisodeStatus.OK, resolved=ok)


@contextlib.asynccontextmanager
async def _served(tmp_path: Path, runner: CountingRunner, limits: RequestLimits | None = None
                  ) -> AsyncIterator[tuple[pb_grpc.CoordinatorServiceStub, EvalJobs]]:
    jobs = EvalJobs(JobStore(tmp_path / "jobs.db"), make_resolver(TasksConfig()), runner, 4, limits=limits)
    servicer = CoordinatorServicer(jobs, lambda: pb.RunStatus(run_name="test"))
    server = GrpcServer([servicer.binding()], ServerConfig(port=0), AuthConfig())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as ch:
            yield pb_grpc.CoordinatorServiceStub(ch), jobs
    finally:
        await jobs.close()
        await server.stop(0)


async def _invalid(call: Awaitable[object], needle: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert needle in (info.value.details() or ""), info.value.details()


async def test_every_submit_field_is_bounded(tmp_path: Path, task_root: Path) -> None:
    limits = RequestLimits(max_attempts_per_job=20)
    root = str(task_root)
    async with _served(tmp_path, CountingRunner(), limits) as (stub, _):
        await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=20_000_000), timeout=10),
                       "attempts: must be in [1, 1000]")
        await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=7), timeout=10),
                       "3 tasks x 7 attempts = 21")
        await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=1, name="n" * 1_000_000),
                                       timeout=10), "name: 1000000 characters")
        for bad in (math.nan, math.inf, -1.0, 1e9):
            await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=1, timeout_multiplier=bad),
                                           timeout=10), "timeout_multiplier")
        await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=1, inference_endpoints=["a:1", "x"]),
                                       timeout=10), "inference_endpoints[1]: 'x': expected host:port")
        await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=1, concurrency=10**6), timeout=10),
                       "concurrency")
        await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=1, task_ids=["x"] * 20_000),
                                       timeout=10), "task_ids: 20000 entries")
        huge = task_root / "task-1" / "instruction.md"
        huge.write_text("x" * 300_000)  # an 8.9 MB instruction blocked the loop for seconds per attempt
        await _invalid(stub.SubmitEval(pb.SubmitEvalRequest(tasks=root, attempts=1), timeout=10),
                       "task task-1 has an instruction of 300000 characters")
        await _invalid(stub.ListJobs(pb.ListJobsRequest(limit=10**6), timeout=10), "limit")
        await _invalid(stub.ListJobs(pb.ListJobsRequest(page_token="garbage"), timeout=10), "page_token")
        await _invalid(stub.GetJob(pb.GetJobRequest(job_id="j" * 10_000), timeout=10), "job_id")
        listed = await stub.ListJobs(pb.ListJobsRequest(), timeout=10)
        assert list(listed.jobs) == [], "nothing refused was stored"


async def test_attempts_start_lazily_and_pass_at_k_is_bounded(tmp_path: Path, task_root: Path) -> None:
    runner = CountingRunner()
    async with _served(tmp_path, runner, RequestLimits(max_pass_at_k=4)) as (stub, jobs):
        before = len(asyncio.all_tasks())
        job = await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1000, concurrency=5),
                                    timeout=10)
        await asyncio.sleep(0.05)
        assert len(asyncio.all_tasks()) - before < 20, "3000 attempts, but only the running ones are tasks"
        await jobs.wait(job.job_id)
        done = await stub.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=10)
        assert done.state == pb.JOB_STATE_SUCCEEDED and done.finished_attempts == 3000 == runner.runs
        assert runner.peak <= 5
        assert sorted(done.summary.pass_at_k) == [1, 2, 3, 4]
        # 334 of 1000 attempts per task resolve: the unbiased estimate, by hand.
        assert done.summary.pass_at_k[1] == pytest.approx(334 / 1000)
        assert done.summary.pass_at_k[2] == pytest.approx(1 - (666 * 665) / (1000 * 999))
        [listed] = (await stub.ListJobs(pb.ListJobsRequest(), timeout=10)).jobs
        assert listed.summary == done.summary and listed.finished_attempts == 3000, "listed from tallies"


async def test_list_jobs_pages_through_every_job_once(tmp_path: Path, task_root: Path) -> None:
    async with _served(tmp_path, CountingRunner()) as (stub, _):
        made = [(await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1, name=f"j{i}"),
                                       timeout=10)).job_id for i in range(5)]
        seen: list[str] = []
        token = ""
        pages = 0
        while True:
            page = await stub.ListJobs(pb.ListJobsRequest(limit=2, page_token=token), timeout=10)
            seen += [j.job_id for j in page.jobs]
            pages += 1
            token = page.next_page_token
            if not token:
                break
        assert pages == 3 and sorted(seen) == sorted(made) and len(set(seen)) == 5
        assert seen == sorted(seen, key=made.index, reverse=True), "newest first"


async def test_store_calls_never_block_the_event_loop(tmp_path: Path, task_root: Path) -> None:
    async with _served(tmp_path, CountingRunner()) as (stub, jobs):
        job = await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1), timeout=10)
        jobs.store._lock.acquire()  # a slow disk: every store call waits 1 s
        asyncio.get_running_loop().call_later(1.0, jobs.store._lock.release)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        got = await stub.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=10)
        tick.cancel()
        assert got.job_id == job.job_id
        assert ticks > 30, f"the loop kept running while SQLite waited ({ticks} ticks)"


async def test_a_job_beyond_the_limits_is_marked_failed_not_resumed(tmp_path: Path, task_root: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    huge = pb.SubmitEvalRequest(tasks=str(task_root), attempts=20_000_000)
    big = store.create_job("old", huge.SerializeToString(), ["task-0", "task-1", "task-2"], 20_000_000)
    garbage = store.create_job("bad", b"\xff\xff\xff", ["task-0"], 1)
    ok = store.create_job("ok", pb.SubmitEvalRequest(tasks=str(task_root), attempts=1).SerializeToString(),
                          ["task-0"], 1)
    runner = CountingRunner()
    jobs = EvalJobs(store, make_resolver(TasksConfig()), runner, 4)
    assert await jobs.resume() == [ok.job_id]
    await jobs.wait(ok.job_id)
    failed = store.get(big.job_id)
    assert failed is not None and failed.state is JobState.FAILED
    assert "attempts: must be in [1, 1000]" in failed.error
    bad = store.get(garbage.job_id)
    assert bad is not None and bad.state is JobState.FAILED and "cannot resume" in bad.error
    assert runner.runs == 1
    await jobs.close()


def test_damaged_job_database_is_named(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError, match=str(path)):
        JobStore(path)


def test_tally_summary_equals_the_attempt_summary(tmp_path: Path) -> None:
    S = EpisodeStatus
    outs = [AttemptOutcome(t, a, r, 0, 1, st, resolved=r == 1.0) for t, a, r, st in [
        ("a", 0, 1.0, S.OK), ("a", 1, 0.0, S.OK), ("a", 2, 0.5, S.TIMEOUT), ("b", 0, 0.0, S.INFRA_ERROR),
        ("b", 1, 1.0, S.OK), ("c", 0, 0.0, S.OK), ("c", 1, 0.0, S.OK), ("c", 2, 1.0, S.OK)]]
    store = JobStore(tmp_path / "jobs.db")
    rec = store.create_job("x", b"", ["a", "b", "c"], 3)
    for o in outs:
        store.record_attempt(rec.job_id, o)
    assert summary_of(store.tallies(rec.job_id), 3, 16) == summarize(outs, 3)
    store.close()


def test_the_stored_request_is_the_submitted_protobuf() -> None:
    """EvalJobs takes an EvalRequest; jobs.db keeps storing the SubmitEvalRequest bytes a client sent, so rows that
    earlier coordinators wrote read back, and GetJob echoes the same request."""
    msg = pb.SubmitEvalRequest(tasks="set", attempts=3, concurrency=2, inference_endpoints=["a:1"],
                               timeout_multiplier=1.5, agent_format=pb.AGENT_FORMAT_TERMINUS2, name="n",
                               task_ids=["t1", "t2"])
    req = request_of(msg)
    assert req == EvalRequest(tasks="set", attempts=3, name="n", task_ids=("t1", "t2"), concurrency=2,
                              timeout_multiplier=1.5, agent_format="terminus2", inference_endpoints=("a:1",))
    assert request_bytes(req) == msg.SerializeToString() and stored_request(msg.SerializeToString()) == req
    chat = pb.SubmitEvalRequest(tasks="set", attempts=1, openai_endpoint=pb.OpenAIEndpoint(base_url="u", model="m"))
    assert request_of(chat).openai_endpoint == OpenAIEndpointRequest(base_url="u", model="m")
    assert request_bytes(request_of(chat)) == chat.SerializeToString()
    with pytest.raises(RequestError, match="agent_format: unknown value 9"):
        request_of(pb.SubmitEvalRequest(tasks="set", attempts=1, agent_format=9))  # type: ignore[arg-type]


def test_no_model_version_field_that_does_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A job evaluates the weights the pool serves; a request that named a version silently got those anyway,
    so the field and its flag are gone (the proto reserves the number)."""
    assert "model_version" not in pb.SubmitEvalRequest.DESCRIPTOR.fields_by_name
    with pytest.raises(ValueError, match="model_version"):
        pb.SubmitEvalRequest(tasks="x", model_version=3)
    with pytest.raises(SystemExit) as exit_:
        t1_main(["eval", "submit", "--tasks", "x", "--model-version", "3"])
    assert exit_.value.code == 2 and "--model-version" in capsys.readouterr().err


async def _exhausted(call: Awaitable[object], needle: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    assert needle in (info.value.details() or ""), info.value.details()


async def test_the_number_of_active_jobs_is_bounded(tmp_path: Path, task_root: Path) -> None:
    """100 jobs held 0.9 GB and their tasks for ever: at most max_active_jobs run, and an ended job lets its tasks
    go."""
    runner = CountingRunner(delay_s=0.3)
    async with _served(tmp_path, runner, RequestLimits(max_active_jobs=2)) as (stub, jobs):
        first = await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1), timeout=10)
        await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1), timeout=10)
        await _exhausted(stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1), timeout=10),
                         "2 eval jobs are queued or running, the most limits.max_active_jobs allows")
        await jobs.wait(first.job_id)
        await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1), timeout=10)
        assert set(await jobs.families(await jobs.get(first.job_id))) == {"task-0", "task-1", "task-2"}
        assert jobs._live[first.job_id].tasks == {}, "an ended job holds no tasks"


async def test_the_job_database_size_is_bounded(tmp_path: Path, task_root: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    store.create_job("big", b"x" * (3 << 20), ["t"], 1)  # 3 MB of stored request
    store.close()
    async with _served(tmp_path, CountingRunner(), RequestLimits(max_jobs_db_mb=2)) as (stub, _):
        await _exhausted(stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=1), timeout=10),
                         "over limits.max_jobs_db_mb (2)")
