"""Chaos, short version (issue 19): kill -9 a real t1-coordinator (with its real t1-inference child) at seeded
points of an eval job, restart it each time: every finished attempt survives and never runs again, a
second coordinator on the same run dir is refused, and no process or sandbox tree is left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from chaos import finished_attempts, kill_points, processes_under, wait_until
from coordproc import CoordinatorProcess, eval_config, write_harbor_task

from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc

NUM_TASKS, ATTEMPTS = 3, 2


@pytest.fixture()
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="t1-chaos-eval-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(root: Path, model_dir: Path, kills: int) -> dict:
    # The job is resumed after each kill -9: allowed as many unclean resumes as the test kills (default 1).
    cfg = eval_config(root, model_dir, root, eval={"concurrency": 2, "max_unclean_resumes": kills})
    cfg["rollout"] = {"policy": "model", "max_turns": 1, "max_context_tokens": 2048, "sampling": {"max_tokens": 8}}
    cfg["inference"] = {"model": {"path": str(model_dir)}, "pool": {"num_local_servers": 1}}
    return cfg


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _trees(root: Path) -> list[str]:
    trees = root / "trees"
    return sorted(p.name for p in trees.iterdir() if p.name.startswith("sb-")) if trees.is_dir() else []


@pytest.mark.parametrize(("seed", "num_kills"), [
    (0, 1),
    pytest.param(1, 2, marks=pytest.mark.slow),
    pytest.param(2, 2, marks=pytest.mark.slow),
])
def test_coordinator_kill_9_mid_eval_loses_nothing_and_leaves_nothing(root: Path, tiny_model_dir: Path,
                                                                      seed: int, num_kills: int) -> None:
    tasks = root / "tasks"
    for i in range(NUM_TASKS):
        write_harbor_task(tasks, f"t{i}", f"w{i}")
    coord = CoordinatorProcess(root, _config(root, tiny_model_dir, num_kills))
    db = coord.run_dir / "jobs.db"
    total = NUM_TASKS * ATTEMPTS
    kills = kill_points(seed, num_kills, 1, total - 2)
    try:
        address = coord.start(timeout_s=240)
        with grpc.insecure_channel(address) as ch:
            job = pb_grpc.CoordinatorServiceStub(ch).SubmitEval(
                pb.SubmitEvalRequest(tasks=str(tasks), attempts=ATTEMPTS, concurrency=2), timeout=30)
        second = subprocess.run([sys.executable, "-m", "t1.cli.coordinator", "--config", str(coord.config_path)],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 3 and "is in use by t1-coordinator" in second.stderr, second.stderr[-2000:]
        survived: set[tuple[str, int]] = set()
        for point in kills:
            wait_until(lambda p=point: len(finished_attempts(db, job.job_id)) >= p, 240, f"{point} attempts")
            assert coord.proc is not None
            service = {pid for pid, cmd in processes_under(root) if "t1.sandbox.local.service" in cmd}
            children = [pid for pid in _children(coord.proc.pid) if pid not in service]
            coord.kill9()
            survived = finished_attempts(db, job.job_id)
            left = _trees(root)
            # Its child services exit; its sandboxes outlive it in the run's sandbox service, which the restart
            # attaches to, destroying the sandboxes it does not resume (all of them: eval attempts rerun).
            wait_until(lambda c=children: not [p for p in c if _alive(p)], 30, "the killed coordinator's children to "
                                                                               "exit")
            stuck = {p for p, _ in processes_under(root)} - service
            assert children, "the coordinator had a child inference server"
            coord.start(timeout_s=240)
            assert not stuck & {p for p, _ in processes_under(root)}, "the restart swept what the dead run left"
            assert finished_attempts(db, job.job_id) >= survived
            assert not set(left) & set(_trees(root)), "the restart swept the trees the killed run left"
        with grpc.insecure_channel(coord.address) as ch:
            stub = pb_grpc.CoordinatorServiceStub(ch)
            events = list(stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), timeout=300))
            final = stub.GetJob(pb.GetJobRequest(job_id=job.job_id, include_attempts=True), timeout=30)
        assert events[-1].state == pb.JOB_STATE_SUCCEEDED, coord.log_text()[-3000:]
        keys = sorted((a.task_id, a.attempt) for a in final.attempts)
        assert keys == sorted((f"t{i}", a) for i in range(NUM_TASKS) for a in range(ATTEMPTS)), "nothing lost"
        runs = coord.run_dir / "transcripts" / "eval" / job.job_id
        for task_id, attempt in survived:  # each run leaves a transcript: finished attempts ran once
            assert len(list((runs / task_id).glob(f"*-a{attempt}-*.md"))) == 1, (task_id, attempt)
        assert coord.terminate() == 0
    finally:
        coord.cleanup()
    assert not processes_under(root), "no process left behind"
    assert _trees(root) == [], "no sandbox tree left behind"
