"""The t1-coordinator process from outside: eval jobs over the generated stubs, the CLI, SIGTERM, kill -9, crashes.

The policy is the scripted one (each task's reference solution typed as tool calls through the
real episode path), so per-task results must equal the oracle runner's on the same tasks.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from chaos import processes_under, wait_until
from coordproc import CoordinatorProcess, eval_config, write_harbor_task

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.isolation.holders import tree_processes
from t1.sandbox.local.local_provider import LocalProvider
from t1.tasks.formats.dataset import load_dataset
from t1.tasks.verify.oracle import RunMode, run_tasks
from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc


@pytest.fixture()
def sandbox_root() -> Iterator[Path]:
    """The sandbox root of a test; after it, no process of its sandboxes may be left (kill -9 included)."""
    path = Path(tempfile.mkdtemp(prefix="t1-coord-test-"))
    path.chmod(0o711)
    yield path
    try:
        wait_until(lambda: not processes_under(path), 5, f"the processes left under {path}: {processes_under(path)}")
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _oracle_resolved(tasks_dir: Path, sandbox_root: Path) -> dict[str, bool]:
    async def go() -> dict[str, bool]:
        provider = LocalProvider(LocalProviderConfig(root=sandbox_root / "oracle"), ShellConfig())
        try:
            runs = await run_tasks(provider, load_dataset([tasks_dir]), RunMode.ORACLE, concurrency=2)
        finally:
            await provider.close()
        return {r.task: r.resolved for r in runs}

    return asyncio.run(go())


def test_eval_job_from_another_process_matches_oracle(tmp_path: Path, tiny_model_dir: Path, sandbox_root: Path) -> None:
    tasks = tmp_path / "tasks"
    write_harbor_task(tasks, "solvable", "alpha")
    write_harbor_task(tasks, "broken-solution", "beta", answer="gamma")  # its oracle fails its own tests
    coord = CoordinatorProcess(tmp_path, eval_config(tmp_path, tiny_model_dir, sandbox_root))
    try:
        address = coord.start()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.CoordinatorServiceStub(channel)
            job = stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(tasks), attempts=2, name="acceptance"), timeout=30)
            events = list(stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), timeout=300))
            assert events[-1].WhichOneof("event") == "job_finished"
            full = stub.GetJob(pb.GetJobRequest(job_id=job.job_id, include_attempts=True), timeout=30)
        got = {}
        for a in full.attempts:
            assert a.status == "ok" and a.turns == 2, (a, coord.log_text()[-3000:])
            got.setdefault(a.task_id, set()).add(a.resolved)
        expected = _oracle_resolved(tasks, sandbox_root)
        assert expected == {"solvable": True, "broken-solution": False}
        assert got == {t: {r} for t, r in expected.items()}
        assert full.summary.resolve_rate == pytest.approx(0.5)

        # The same through the CLI.
        cli = subprocess.run([sys.executable, "-m", "t1.cli.main", "eval", "submit", "--tasks", str(tasks),
                              "--attempts", "1", "--wait", "--address", address],
                             capture_output=True, text=True, timeout=300)
        assert cli.returncode == 0, cli.stderr
        assert "resolve rate 0.500" in cli.stdout
        assert coord.terminate() == 0
        assert '"event":"stop"' in (coord.run_dir / "run.jsonl").read_text()
    finally:
        coord.cleanup()


def _argv0(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:  # gone meanwhile
        return b""


def _holders(root: Path) -> list[int]:
    """The running holders (each sandbox's PID 1) of the trees under root."""
    return [pid for pid in tree_processes(root) if _argv0(pid) == b"/bin/bash"]


def _finished(db: Path, job_id: str) -> set[tuple[str, int]]:
    with sqlite3.connect(db) as con:
        return {(r[0], r[1]) for r in con.execute("SELECT task_id, attempt FROM attempts WHERE job_id = ?", (job_id,))}


def test_kill_9_mid_job_then_restart_reruns_nothing_finished(tmp_path: Path, tiny_model_dir: Path,
                                                             sandbox_root: Path) -> None:
    tasks = tmp_path / "tasks"
    for i in range(3):
        write_harbor_task(tasks, f"slow-{i}", f"w{i}", solve_delay_s=1.5)
    coord = CoordinatorProcess(tmp_path, eval_config(tmp_path, tiny_model_dir, sandbox_root))
    db = coord.run_dir / "jobs.db"
    try:
        address = coord.start()
        with grpc.insecure_channel(address) as channel:
            job = pb_grpc.CoordinatorServiceStub(channel).SubmitEval(
                pb.SubmitEvalRequest(tasks=str(tasks), attempts=2, concurrency=2), timeout=30)
        deadline = time.monotonic() + 120
        while len(_finished(db, job.job_id)) < 2:
            assert time.monotonic() < deadline, coord.log_text()[-2000:]
            time.sleep(0.2)
        wait_until(lambda: bool(tree_processes(sandbox_root / "trees")), 60, "sandboxes live when the coordinator dies")
        holders = _holders(sandbox_root / "trees")
        coord.kill9()
        # The sandboxes outlive the coordinator (they live in the run's sandbox service); the restart attaches to
        # the service and destroys those it does not resume (all of them: eval attempts rerun).
        time.sleep(1)
        assert set(holders) <= set(_holders(sandbox_root / "trees")), "the sandboxes outlived the killed coordinator"
        left = tree_processes(sandbox_root / "trees")
        before = _finished(db, job.job_id)
        assert 2 <= len(before) < 6

        address = coord.start()
        assert not set(left) & set(tree_processes(sandbox_root / "trees")), "the restart swept what the dead run left"
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.CoordinatorServiceStub(channel)
            events = list(stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), timeout=300))
            final = stub.GetJob(pb.GetJobRequest(job_id=job.job_id, include_attempts=True), timeout=30)
        assert events[-1].state == pb.JOB_STATE_SUCCEEDED
        keys = [(a.task_id, a.attempt) for a in final.attempts]
        assert sorted(keys) == sorted({(f"slow-{i}", a) for i in range(3) for a in range(2)}), "nothing lost"
        assert all(a.resolved for a in final.attempts)
        # Each run of an attempt leaves its own transcript: finished ones ran exactly once.
        tx = coord.run_dir / "transcripts" / "eval" / job.job_id
        for task_id, attempt in before:
            runs = list((tx / task_id).glob(f"*-a{attempt}-*.md"))
            assert len(runs) == 1, (task_id, attempt, runs)
        assert coord.terminate() == 0
    finally:
        coord.cleanup()


def test_a_job_that_crashed_the_process_is_failed_not_resumed(tmp_path: Path, tiny_model_dir: Path,
                                                               sandbox_root: Path) -> None:
    """A fatal signal (a native library aborting on an allocation a hostile reply asked for) while a job runs: the
    next start marks that job FAILED naming the crash instead of resuming it into the same crash; a queued job
    and a later job run as usual."""
    tasks = tmp_path / "tasks"
    for i in range(2):
        write_harbor_task(tasks, f"slow-{i}", f"w{i}", solve_delay_s=3.0)
    coord = CoordinatorProcess(tmp_path, eval_config(tmp_path, tiny_model_dir, sandbox_root))
    try:
        address = coord.start()
        with grpc.insecure_channel(address) as channel:
            job = pb_grpc.CoordinatorServiceStub(channel).SubmitEval(
                pb.SubmitEvalRequest(tasks=str(tasks), attempts=1, concurrency=2), timeout=30)
        wait_until(lambda: bool(tree_processes(sandbox_root / "trees")), 60, "the job's attempts to run")
        assert coord.proc is not None
        coord.proc.send_signal(signal.SIGABRT)
        assert coord.proc.wait(30) == -signal.SIGABRT
        assert "Fatal Python error: Aborted" in (coord.run_dir / "logs" / "crash.txt").read_text()

        address = coord.start()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.CoordinatorServiceStub(channel)
            failed = stub.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=30)
            assert failed.state == pb.JOB_STATE_FAILED
            assert "the coordinator crashed while this job ran; not resumed" in failed.error
            assert "Fatal Python error: Aborted" in failed.error
            again = stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(tasks), attempts=1, concurrency=2), timeout=30)
            events = list(stub.WatchJob(pb.WatchJobRequest(job_id=again.job_id), timeout=300))
        assert events[-1].state == pb.JOB_STATE_SUCCEEDED
        assert coord.terminate() == 0
        assert not (coord.run_dir / "logs" / "crash.txt").exists(), "a clean stop leaves no crash report"
    finally:
        coord.cleanup()


def _resumes(db: Path, job_id: str) -> tuple[int, int]:
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT resumes, unclean_resumes FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    return int(row[0]), int(row[1])


def _job(address: str, job_id: str) -> pb.Job:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.CoordinatorServiceStub(channel).GetJob(pb.GetJobRequest(job_id=job_id), timeout=30)


def _submit(address: str, tasks: Path) -> str:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.CoordinatorServiceStub(channel).SubmitEval(
            pb.SubmitEvalRequest(tasks=str(tasks), attempts=1, concurrency=2), timeout=30).job_id


@pytest.mark.slow
def test_a_job_running_at_two_sigkills_is_failed_and_a_clean_stop_still_resumes(
        tmp_path: Path, tiny_model_dir: Path, sandbox_root: Path) -> None:
    """A job whose attempts kill the coordinator without a word (kill -9, the OOM killer): the first such death
    resumes it (an operator's kill -9 fails nothing), the next marks it FAILED naming why; a job interrupted by a
    clean stop (SIGTERM) still resumes and finishes."""
    hangs, quick = tmp_path / "hangs", tmp_path / "quick"
    for i in range(2):
        write_harbor_task(hangs, f"hang-{i}", f"h{i}", solve_delay_s=120.0)
    write_harbor_task(quick, "quick", "q", solve_delay_s=4.0)
    coord = CoordinatorProcess(tmp_path, eval_config(tmp_path, tiny_model_dir, sandbox_root))
    db, marker = coord.run_dir / "jobs.db", coord.run_dir / "logs" / "crash.txt"
    live = lambda: bool(tree_processes(sandbox_root / "trees"))  # noqa: E731
    try:
        job = _submit(coord.start(), hangs)
        wait_until(live, 60, "the job's attempts to run")
        coord.kill9()  # an operator's kill -9, or the OOM killer: no traceback, the marker left empty
        assert marker.read_text() == ""

        address = coord.start()
        assert _job(address, job).state == pb.JOB_STATE_RUNNING, coord.log_text()[-2000:]
        assert _resumes(db, job) == (1, 1)
        wait_until(live, 60, "the resumed job's attempts to run")
        coord.kill9()

        address = coord.start()
        failed = _job(address, job)
        assert failed.state == pb.JOB_STATE_FAILED, coord.log_text()[-2000:]
        assert "died without a traceback" in failed.error and "2 times" in failed.error, failed.error
        assert "coordinator.eval.max_unclean_resumes" in failed.error, failed.error
        assert _resumes(db, job) == (1, 1)

        again = _submit(address, quick)
        wait_until(live, 60, "the second job's attempt to run")
        assert coord.terminate() == 0  # a clean stop: the marker goes, the running job resumes
        assert not marker.exists()
        address = coord.start()
        with grpc.insecure_channel(address) as channel:
            events = list(
                pb_grpc.CoordinatorServiceStub(channel).WatchJob(pb.WatchJobRequest(job_id=again), timeout=300)
            )
        assert events[-1].state == pb.JOB_STATE_SUCCEEDED
        assert _resumes(db, again) == (1, 0)
        assert _job(address, job).state == pb.JOB_STATE_FAILED  # not resumed by a later start either
        assert coord.terminate() == 0
    finally:
        coord.cleanup()
