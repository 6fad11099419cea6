"""A full disk under the run dir, for real: the run dir on a 6 MiB tmpfs mounted for the test, filled to the last
block while an eval job runs. The coordinator keeps serving, its run status names what cannot be written, no
finished attempt is lost, and once space is back the job ends with every attempt stored."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from chaos import wait_until
from coordproc import CoordinatorProcess, eval_config, write_harbor_task

from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc

TASKS, ATTEMPTS = 3, 2


@pytest.fixture()
def tiny_disk() -> Iterator[Path]:
    """A 6 MiB tmpfs of its own (needs root, as the test machines run)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = Path(tempfile.mkdtemp(prefix="t1-full-disk-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0711", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk takes no more; returns it."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):  # down to the last bytes a smaller write can still take
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    with pytest.raises(OSError) as err:
        (disk / "probe").write_bytes(b"x" * 4096)
    assert err.value.errno == errno.ENOSPC
    return filler


def test_a_full_disk_under_the_run_dir_degrades_and_loses_nothing(tmp_path: Path, tiny_model_dir: Path,
                                                                   tiny_disk: Path) -> None:
    sandbox_root = Path(tempfile.mkdtemp(prefix="t1-full-disk-sb-"))
    sandbox_root.chmod(0o711)
    tasks = tmp_path / "tasks"
    for i in range(TASKS):
        write_harbor_task(tasks, f"t{i}", f"w{i}", solve_delay_s=2.0)
    cfg = eval_config(tmp_path, tiny_model_dir, sandbox_root)
    cfg["coordinator"]["run_dir"] = str(tiny_disk / "run")
    # The per-turn journal degrades on its own terms (it holds turns and episodes wait for the disk): off here,
    # so that attempts finish into the full disk and the files under test meet it.
    cfg["coordinator"]["journal"] = {"enabled": False}
    coord = CoordinatorProcess(tmp_path, cfg)
    try:
        address = coord.start()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.CoordinatorServiceStub(channel)
            job = stub.SubmitEval(pb.SubmitEvalRequest(tasks=str(tasks), attempts=ATTEMPTS, concurrency=2), timeout=30)
            wait_until(lambda: stub.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=10).state
                       == pb.JOB_STATE_RUNNING, 60, "the job to run")
            filler = fill(tiny_disk)
            # Attempts finish into a full disk: their transcripts, the run log's records and the job rows fail.
            try:
                wait_until(lambda: any("eval job database" in e for e in
                                       stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=10).write_errors), 120,
                           "the run status to name the eval job database")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {coord.log_text()[-3000:]}") from None
            status = stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=10)
            assert all("No space left on device" in e or "full" in e for e in status.write_errors), status
            assert coord.proc is not None and coord.proc.poll() is None, "the coordinator goes on"
            assert stub.GetJob(pb.GetJobRequest(job_id=job.job_id), timeout=10).state == pb.JOB_STATE_RUNNING
            filler.unlink()  # space is back: the held outcomes are written, the job goes on to its end
            events = list(stub.WatchJob(pb.WatchJobRequest(job_id=job.job_id), timeout=300))
            final = stub.GetJob(pb.GetJobRequest(job_id=job.job_id, include_attempts=True), timeout=30)
            wait_until(lambda: not stub.GetRunStatus(pb.GetRunStatusRequest(), timeout=10).write_errors, 60,
                       "the write errors to clear")
        assert events[-1].state == pb.JOB_STATE_SUCCEEDED, coord.log_text()[-3000:]
        keys = sorted((a.task_id, a.attempt) for a in final.attempts)
        assert keys == sorted((f"t{i}", a) for i in range(TASKS) for a in range(ATTEMPTS)), "nothing lost"
        assert coord.terminate() == 0, coord.log_text()[-3000:]
    finally:
        coord.cleanup()
        shutil.rmtree(sandbox_root, ignore_errors=True)
    log = coord.log_text()
    assert "Traceback" not in log, log[-3000:]
    assert "cannot be written" in log
    lines = (tiny_disk / "run" / "run.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines][-1] == "stop"  # every line whole, and written again
