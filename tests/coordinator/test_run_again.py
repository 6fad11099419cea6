"""Running it again: a finished run is never silently re-reported; an unfinished one is resumed and says where
its trainer is; numbered runs (coordinator.runs_dir) start fresh in their own directory; the run dir lock
still refuses a second coordinator on one run. The first line printed says which."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from smoke_run import SMOKE_TIMEOUT, SmokeRun, small_config, start_coordinator

from t1.cli.coordinator import select_run
from t1.config import load_config
from t1.coordinator.evals.job_store import JobStore
from t1.coordinator.run.run_dirs import RunDirError, RunMode, choose, choose_fixed, first_line
from t1.trainer.buffer import StepRecord, TrajectoryBuffer


def _finished(run_dir: Path, stage: str = "done") -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "run.jsonl").write_text('{"event": "start"}\n')
    (run_dir / "report.json").write_text(json.dumps({"trainer": {"stage": stage, "step": 3}}))
    return run_dir


def _unfinished(run_dir: Path, steps: int) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "run.jsonl").write_text('{"event": "start"}\n')
    buffer = TrajectoryBuffer(run_dir / "trainer" / "buffer.sqlite")
    buffer.commit_steps([StepRecord(i, "sft", i, (), {}) for i in range(1, steps + 1)], {})
    buffer.close()
    return run_dir


def test_numbered_runs_fresh_after_a_finished_one_resume_an_unfinished_one(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = choose(runs, "local", RunMode.AUTO)
    assert first.fresh and first.path == runs / "local-1" and first_line(first, 8) == f"t1: fresh run in {runs}/local-1"
    _finished(runs / "local-1")
    _finished(runs / "other-7")  # another config's runs do not count
    second = choose(runs, "local", RunMode.AUTO)
    assert second.fresh and second.path == runs / "local-2"
    _unfinished(runs / "local-2", steps=3)
    again = choose(runs, "local", RunMode.AUTO)
    assert not again.fresh and again.path == runs / "local-2"
    assert first_line(again, 8) == f"t1: resuming {runs}/local-2 (trainer at step 3 of 8)"
    assert choose(runs, "local", RunMode.RESUME).path == runs / "local-2"
    forced = choose(runs, "local", RunMode.FRESH)
    assert forced.fresh and forced.path == runs / "local-3"
    remote = choose(runs, "local", RunMode.AUTO, local_trainer=False)
    assert first_line(remote, 8) == f"t1: resuming {runs}/local-2 (the trainer is not on this machine)"


def test_a_stopped_run_with_a_report_is_unfinished_and_an_empty_dir_is_reused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _finished(runs / "local-1", stage="ppo")  # a SIGTERM mid-training still writes a report
    assert not choose(runs, "local", RunMode.AUTO).fresh
    (runs / "local-2").mkdir()  # a start that failed before it ran anything
    reuse = choose(runs, "local", RunMode.AUTO)
    assert reuse.fresh and reuse.path == runs / "local-2"
    with pytest.raises(RunDirError, match="holds no run to resume"):
        choose(runs, "local", RunMode.RESUME)


def test_resume_is_refused_when_there_is_nothing_unfinished(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(RunDirError, match="no run named local"):
        choose(runs, "local", RunMode.RESUME)
    _finished(runs / "local-1")
    with pytest.raises(RunDirError, match="has finished"):
        choose(runs, "local", RunMode.RESUME)


def test_one_fixed_run_dir_resumes_or_refuses_but_never_reports_an_old_trainer(tmp_path: Path) -> None:
    assert choose_fixed(tmp_path / "new", None, RunMode.AUTO).fresh
    unfinished = _unfinished(tmp_path / "u", steps=2)
    resumed = choose_fixed(unfinished, unfinished / "trainer", RunMode.AUTO)
    assert not resumed.fresh and "trainer at step 2 of 5" in first_line(resumed, 5)
    with pytest.raises(RunDirError, match="--fresh"):
        choose_fixed(unfinished, None, RunMode.FRESH)
    finished = _finished(tmp_path / "f")
    for mode in RunMode:
        with pytest.raises(RunDirError, match="holds a finished run"):
            choose_fixed(finished, None, mode)


def test_numbered_runs_put_the_run_and_its_trainer_work_dir_inside(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "local", "coordinator": {"runs_dir": str(tmp_path / "runs")}}))
    _finished(tmp_path / "runs" / "local-1")
    choice, overrides = select_run(load_config(path), RunMode.AUTO)
    cfg = load_config(path, overrides)
    assert cfg.coordinator.run_dir == tmp_path / "runs" / "local-2" == choice.path
    assert cfg.trainer.work_dir == tmp_path / "runs" / "local-2" / "trainer"
    remote = load_config(path, ["trainer.endpoint=127.0.0.1:1"])
    assert select_run(remote, RunMode.AUTO)[1] == [f"coordinator.run_dir={tmp_path / 'runs' / 'local-2'}"]


def _coordinator(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "t1.cli.coordinator", "--config", str(config), *extra],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


@SMOKE_TIMEOUT
def test_a_second_start_of_the_finished_smoke_run_is_refused_and_says_why(smoke_run: SmokeRun) -> None:
    # The session's smoke run, started again as it was: the old way re-ran the evals and printed a report
    # as if it had trained. Now: exit 3 before anything starts, naming the finished run and the way out.
    assert smoke_run.rc == 0, smoke_run.log[-3000:]
    assert smoke_run.log.splitlines()[0] == f"t1: fresh run in {smoke_run.run_dir}"
    before = (smoke_run.run_dir / "run.jsonl").read_text()
    proc = _coordinator(smoke_run.root / "local.yaml")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert f"{smoke_run.run_dir} holds a finished run" in proc.stderr and "coordinator.runs_dir" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert (smoke_run.run_dir / "run.jsonl").read_text() == before, "nothing of the finished run was touched"


def test_real_starts_refuse_a_busy_or_finished_numbered_run(tmp_path: Path) -> None:
    cfg = small_config(tmp_path, tmp_path / "model")  # refused before a model is needed
    cfg["coordinator"]["runs_dir"] = str(tmp_path / "runs")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    _finished(tmp_path / "runs" / "local-small-1")
    proc = _coordinator(config, "--resume")
    assert proc.returncode == 3 and "has finished" in proc.stderr, proc.stderr[-2000:]
    _unfinished(tmp_path / "runs" / "local-small-2", steps=1)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from t1.workdir import DirLock; DirLock(Path(sys.argv[1]), 't1-coordinator').acquire();"
                               " print('held', flush=True); time.sleep(120)", str(tmp_path / "runs" / "local-small-2")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = _coordinator(config)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "local-small-2 is in use by t1-coordinator" in proc.stderr and proc.stdout == ""


@pytest.mark.slow  # a smoke-sized run stopped mid-training, then resumed to the end: about four minutes here
def test_a_stopped_numbered_run_resumes_to_the_end_and_the_next_start_is_fresh(tiny_model_dir: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="t1-run-again-"))
    root.chmod(0o711)  # sandbox users must traverse to their trees
    try:
        _stop_resume_and_start_again(root, tiny_model_dir)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _stop_resume_and_start_again(root: Path, tiny_model_dir: Path) -> None:
    # Enough PPO steps that the stop lands in the training stage on a quiet machine too (with 2 it ended first).
    cfg = small_config(root, tiny_model_dir, max_steps=8)
    cfg["coordinator"]["runs_dir"] = str(root / "runs")
    cfg["coordinator"]["eval"]["before_training"] = False
    run1 = root / "runs" / "local-small-1"
    proc, out = start_coordinator(root, cfg)
    try:
        deadline = time.monotonic() + 480
        while not ((run1 / "trainer" / "buffer.sqlite").is_file() and "t1: stage training" in
                   out.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")[-4000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        # A training run stopped before its end exits 128 + the signal (t1/coordinator/run/app.py).
        assert proc.wait(120) == 128 + signal.SIGTERM, out.read_text(errors="replace")[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.read_text().splitlines()[0] == f"t1: fresh run in {run1}"
    shutil.copy(out, root / "first.log")
    proc, out = start_coordinator(root, cfg)
    try:
        rc = proc.wait(600)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = out.read_text(errors="replace")
    assert rc == 0, log[-4000:]
    assert log.splitlines()[0].startswith(f"t1: resuming {run1} (trainer at step ")
    report = json.loads((run1 / "report.json").read_text())
    assert report["trainer"]["stage"] == "done" and report["trainer"]["step"] == 10, report["trainer"]
    assert not (root / "trainer").exists(), "the trainer worked inside the run"
    jobs = JobStore(run1 / "jobs.db")
    names = [j.name for j in jobs.list_jobs().jobs]
    jobs.close()
    assert sorted(names) == ["rl:heldout", "warm_start:heldout"], f"an eval ran again after the resume: {names}"
    assert '"event":"eval_reused","label":"warm_start"' in (run1 / "run.jsonl").read_text()
    third = _coordinator(root / "local.yaml", "--resume")
    assert third.returncode == 3 and "has finished" in third.stderr
    choice = choose(root / "runs", "local-small", RunMode.AUTO)
    assert choice.fresh and choice.path == root / "runs" / "local-small-2"
