"""Eval jobs over real gRPC on 127.0.0.1: submit, watch, get, list, cancel, errors, resume, and the CLI.

The AttemptRunner here is the seam's cheap second implementation: it reads the task's
oracle answer from its solution and decides by attempt parity, so results are known in advance.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from t1.cli.main import main as t1_main
from t1.config.shared import AuthConfig, ServerConfig
from t1.config.tasks import TasksConfig
from t1.coordinator.evals.eval_jobs import EvalAttempt, EvalJobs
from t1.coordinator.evals.eval_request import EvalRequest
from t1.coordinator.evals.job_store import JobStore
from t1.coordinator.evals.service import CoordinatorServicer
from t1.coordinator.tasksource import make_resolver
from t1.evals.results import AttemptOutcome
from t1.rpc.introspect import health_status, list_services
from t1.rpc.server import GrpcServer
from t1.trajectory.types import EpisodeStatus
from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc


class ParityRunner:
    """Resolves even attempts; task-2 attempt 1 is an infra error; records every run."""

    def __init__(self, delay_s: float = 0.01) -> None:
        self.delay_s = delay_s
        self.runs: list[tuple[str, int]] = []

    async def __call__(self, a: EvalAttempt) -> AttemptOutcome:
        self.runs.append((a.task.id, a.attempt))
        await asyncio.sleep(self.delay_s)
        if a.task.id == "task-2" and a.attempt == 1:
            return AttemptOutcome(
                a.task.id, a.attempt, 0.0, 0, 0, EpisodeStatus.INFRA_ERROR, failure_mode="sandbox_lost"
            )
        ok = a.attempt % 2 == 0
        why: dict[str, Any] = {} if ok else {"why": "1 of 1 tests failed: t.py::test_x (assert 1 == 2)",
                             "failed_tests": (("t.py::test_x", "assert 1 == 2"),), "verifier_output_tail": "E   assert"}
        return AttemptOutcome(a.task.id, a.attempt, float(ok), int(ok), 1, EpisodeStatus.OK, turns=3, tokens=40,
                              resolved=ok, **why)


async def _serve(tmp_path: Path, runner: ParityRunner) -> tuple[GrpcServer, EvalJobs]:
    jobs = EvalJobs(JobStore(tmp_path / "jobs.db"), make_resolver(TasksConfig()), runner, default_concurrency=2)
    servicer = CoordinatorServicer(jobs, lambda: pb.RunStatus(run_name="test", stage="eval"))
    server = GrpcServer([servicer.binding()], ServerConfig(port=0), AuthConfig())
    await server.start()
    return server, jobs


async def test_submit_watch_get_list(tmp_path: Path, task_root: Path) -> None:
    runner = ParityRunner()
    server, jobs = await _serve(tmp_path, runner)
    assert await asyncio.to_thread(health_status, server.address, "t1.v1.CoordinatorService") == "SERVING"
    assert "t1.v1.CoordinatorService" in await asyncio.to_thread(list_services, server.address)
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = pb_grpc.CoordinatorServiceStub(ch)
        job = await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=3, name="t"), timeout=10)
        assert job.total_attempts == 9
        events = [ev async for ev in stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), timeout=30)]
        kinds = [ev.WhichOneof("event") for ev in events]
        assert kinds[0] is None, "the stream starts with a snapshot"
        assert kinds.count("attempt_started") + kinds.count("attempt_finished") <= 18
        assert kinds[-1] == "job_finished" and events[-1].state == pb.JOB_STATE_SUCCEEDED
        summary = events[-1].job_finished
        # 3 tasks x attempts {0,1,2}: even ones resolve; task-2#1 is infra and not scored.
        assert summary.resolve_rate == pytest.approx(6 / 8)
        assert summary.infra_errors == 1 and summary.num_tasks == 3
        assert summary.pass_at_k[1] == pytest.approx((2 / 3 + 2 / 3 + 1.0) / 3)
        full = await stub.GetJob(pb.GetJobRequest(job_id=job.job_id, include_attempts=True), timeout=10)
        assert sorted((a.task_id, a.attempt) for a in full.attempts) == sorted(runner.runs)
        failed = [a for a in full.attempts if a.status == "ok" and not a.resolved]
        assert failed and all(a.why.startswith("1 of 1 tests failed") and a.verifier_output_tail == "E   assert"
                              for a in failed)  # the why fields survive the store and cross gRPC
        assert [(t.name, t.message) for t in failed[0].failed_tests] == [("t.py::test_x", "assert 1 == 2")]
        finished = [ev.attempt_finished for ev in events if ev.WhichOneof("event") == "attempt_finished"]
        assert any(f.why for f in finished) and all(f.why == "" for f in finished if f.resolved)
        assert len(runner.runs) == 9 == full.finished_attempts
        listed = await stub.ListJobs(pb.ListJobsRequest(states=[pb.JOB_STATE_SUCCEEDED]), timeout=10)
        assert [j.job_id for j in listed.jobs] == [job.job_id]
        status = await stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=10)
        assert status.run_name == "test"
    await jobs.close()
    await server.stop(0)


async def test_bad_requests_name_the_field(tmp_path: Path, task_root: Path) -> None:
    server, jobs = await _serve(tmp_path, ParityRunner())
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = pb_grpc.CoordinatorServiceStub(ch)
        cases = [
            (pb.SubmitEvalRequest(tasks=str(task_root), attempts=0), "attempts"),
            (pb.SubmitEvalRequest(attempts=1), "tasks: required"),
            (pb.SubmitEvalRequest(tasks=str(tmp_path / "nope"), attempts=1), "no such folder"),
            (pb.SubmitEvalRequest(tasks=str(task_root), attempts=1, task_ids=["zzz"]), "zzz"),
        ]
        for req, needle in cases:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.SubmitEval(req, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetJob(pb.GetJobRequest(job_id="job-missing"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    await jobs.close()
    await server.stop(0)


async def test_cancel_ends_watchers(tmp_path: Path, task_root: Path) -> None:
    server, jobs = await _serve(tmp_path, ParityRunner(delay_s=5))
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = pb_grpc.CoordinatorServiceStub(ch)
        job = await stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(task_root), attempts=2), timeout=10)
        call = stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), timeout=30)
        await asyncio.sleep(0.2)
        cancelled = await stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id), timeout=10)
        assert cancelled.state == pb.JOB_STATE_CANCELLED
        events = [ev async for ev in call]
        assert events[-1].state == pb.JOB_STATE_CANCELLED
    await jobs.close()
    await server.stop(0)


async def test_resume_runs_only_unfinished_attempts(tmp_path: Path, task_root: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    first = ParityRunner(delay_s=0.3)
    jobs = EvalJobs(store, make_resolver(TasksConfig()), first, default_concurrency=3)
    record = await jobs.submit(EvalRequest(tasks=str(task_root), attempts=2))
    while len(store.finished_keys(record.job_id)) < 3:
        await asyncio.sleep(0.05)
    await jobs.close()  # a shutdown mid-job: the job stays running in the store
    done_before = store.finished_keys(record.job_id)
    store.close()

    store2 = JobStore(tmp_path / "jobs.db")
    second = ParityRunner()
    jobs2 = EvalJobs(store2, make_resolver(TasksConfig()), second, default_concurrency=3)
    assert await jobs2.resume() == [record.job_id]
    await jobs2.wait(record.job_id)
    assert set(second.runs).isdisjoint(done_before), "no finished attempt runs twice"
    assert store2.finished_keys(record.job_id) == {(f"task-{i}", a) for i in range(3) for a in range(2)}
    assert store2.get(record.job_id).state.value == "succeeded"  # type: ignore[union-attr]
    await jobs2.close()


async def test_cli_submit_wait_and_report(tmp_path: Path, task_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server, jobs = await _serve(tmp_path, ParityRunner())
    addr = ["--address", server.address]
    rc = await asyncio.to_thread(
        t1_main, ["eval", "submit", "--tasks", str(task_root), "--attempts", "2", "--wait", *addr]
    )
    out = capsys.readouterr().out
    assert rc == 0
    job_id = out.splitlines()[0].strip()
    assert "resolve rate 0.600" in out  # 5 scored attempts, 3 resolved
    rc = await asyncio.to_thread(t1_main, ["eval", "report", job_id, "--format", "csv", *addr])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and lines[0].startswith("task_id,attempt,status") and len(lines) == 7
    assert "task-2,1,infra_error,no" in "\n".join(lines)
    rc = await asyncio.to_thread(t1_main, ["eval", "report", job_id, "--format", "md", *addr])
    assert rc == 0 and "| task-0 | 0 | ok | yes |" in capsys.readouterr().out
    rc = await asyncio.to_thread(t1_main, ["eval", "list", *addr])
    assert rc == 0 and job_id in capsys.readouterr().out
    rc = await asyncio.to_thread(t1_main, ["eval", "report", "job-nope", "--format", "json", *addr])
    assert rc == 1 and "NOT_FOUND" in capsys.readouterr().err
    await jobs.close()
    await server.stop(0)


async def test_cli_watch_and_cancel(tmp_path: Path, task_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server, jobs = await _serve(tmp_path, ParityRunner(delay_s=30))
    addr = ["--address", server.address]
    rc = await asyncio.to_thread(t1_main, ["eval", "submit", "--tasks", str(task_root), "--attempts", "1", *addr])
    job_id = capsys.readouterr().out.strip()
    assert rc == 0 and job_id.startswith("job-")
    watch = asyncio.create_task(asyncio.to_thread(t1_main, ["eval", "watch", job_id, *addr]))
    await asyncio.sleep(0.5)
    assert not watch.done(), "watch follows a running job"
    rc = await asyncio.to_thread(t1_main, ["eval", "cancel", job_id, *addr])
    out = capsys.readouterr().out  # the watch's summary can land here too: it ends as soon as the job does
    assert rc == 0 and f"{job_id}: cancelled" in out
    assert await asyncio.wait_for(watch, 30) == 1, "a cancelled job is not a success"
    out += capsys.readouterr().out
    assert f"job {job_id} (" in out and "): cancelled, " in out, "the watch's summary says cancelled"
    rc = await asyncio.to_thread(t1_main, ["eval", "report", job_id, "--format", "json", *addr])
    out = capsys.readouterr().out
    assert rc == 0 and '"state": "JOB_STATE_CANCELLED"' in out
    await jobs.close()
    await server.stop(0)


def test_store_from_before_why_fields_and_segments_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript("CREATE TABLE attempts (job_id TEXT NOT NULL, task_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
                     "reward REAL NOT NULL, passed INTEGER NOT NULL, total INTEGER NOT NULL, status TEXT NOT NULL, "
                     "turns INTEGER NOT NULL, tokens INTEGER NOT NULL, duration_s REAL NOT NULL, failure_mode TEXT "
                     "NOT NULL, resolved INTEGER NOT NULL, finished REAL NOT NULL, PRIMARY KEY (job_id, task_id, "
                     "attempt));")
    db.execute("INSERT INTO attempts VALUES ('j', 't', 0, 1.0, 1, 1, 'ok', 2, 10, 1.0, '', 1, 0.0)")
    db.commit()
    db.close()
    store = JobStore(tmp_path / "old.db")
    old = store.attempts("j")[0]
    assert old.why == "" and old.resolved and old.segments == 0  # 0: not recorded
    assert store.record_attempt("j", AttemptOutcome("t", 1, 0.0, 0, 1, EpisodeStatus.OK, why="because", segments=3))
    assert [(o.why, o.segments) for o in store.attempts("j")] == [("", 0), ("because", 3)]
    store.close()
