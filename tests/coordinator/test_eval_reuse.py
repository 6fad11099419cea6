"""A resumed training run reuses its own eval jobs: one that finished before the restart is not run again (its
summary, per-family rows included, is read back from the job store), one the restart resumed is waited for,
and one that failed is submitted afresh. Real SQLite job store, real eval job runner, a fresh EvalJobs per
"process"."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from test_eval_limits import CountingRunner

from t1.config.tasks import TasksConfig
from t1.coordinator.evals.crash import ExitKind, PreviousExit
from t1.coordinator.evals.eval_jobs import EvalJobs
from t1.coordinator.evals.job_store import JobState, JobStore
from t1.coordinator.run import stages
from t1.coordinator.tasksource import make_resolver
from t1.metrics.runlog import RunLog
from t1.v1 import coordinator_pb2 as pb


def _process(run_dir: Path, runner: CountingRunner) -> SimpleNamespace:
    """What `submit_eval` and `eval_result` use of a coordinator's parts, as a new process opens them."""
    store = JobStore(run_dir / "jobs.db")
    evals = EvalJobs(store, make_resolver(TasksConfig()), runner, 4)
    return SimpleNamespace(store=store, evals=evals, runlog=RunLog(run_dir / "run.jsonl"))


async def _close(parts: SimpleNamespace) -> None:
    await parts.evals.close()
    parts.store.close()


def _reused(run_dir: Path) -> list[dict]:
    lines = (run_dir / "run.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "eval_reused"]


async def test_a_finished_eval_is_reused_after_a_restart_with_its_family_rows(tmp_path: Path, task_root: Path) -> None:
    for toml in task_root.glob("*/task.toml"):  # families named by the tasks: read again from the tasks after a restart
        toml.write_text(toml.read_text().replace('[task]', '[metadata]\nfamily = "greek"\n[task]'))
    first_runner = CountingRunner()
    parts = _process(tmp_path, first_runner)
    record = await stages.submit_eval(parts, "base", str(task_root), 3)
    first = await stages.eval_result(parts, "base", str(task_root), record.job_id)
    await _close(parts)
    assert first_runner.runs == 9

    runner = CountingRunner()
    parts = _process(tmp_path, runner)
    again = await stages.submit_eval(parts, "base", str(task_root), 3)
    second = await stages.eval_result(parts, "base", str(task_root), again.job_id)
    await _close(parts)
    assert again.job_id == record.job_id and runner.runs == 0, "the finished eval ran again"
    assert second.as_dict() == first.as_dict() and list(first.by_family) == ["greek"], (first, second)
    assert [(r["label"], r["job_id"], r["state"]) for r in _reused(tmp_path)] == [("base", record.job_id, "succeeded")]


async def test_an_eval_the_restart_resumed_is_waited_for_and_a_failed_one_runs_afresh(tmp_path: Path,
                                                                                     task_root: Path) -> None:
    parts = _process(tmp_path, CountingRunner())
    running = parts.store.create_job("warm_start:" + str(task_root), _request(task_root, "warm_start"),
                                     ["task-0", "task-1", "task-2"], 2)
    parts.store.set_state(running.job_id, JobState.RUNNING)
    failed = parts.store.create_job("rl:" + str(task_root), _request(task_root, "rl"), ["task-0"], 2)
    parts.store.set_state(failed.job_id, JobState.FAILED, "the coordinator died twice while it ran")
    await _close(parts)

    runner = CountingRunner()
    parts = _process(tmp_path, runner)
    assert await parts.evals.resume(PreviousExit(ExitKind.KILLED)) == [running.job_id]
    warm = await stages.submit_eval(parts, "warm_start", str(task_root), 2)
    summary = await stages.eval_result(parts, "warm_start", str(task_root), warm.job_id)
    rl = await stages.submit_eval(parts, "rl", str(task_root), 2)
    await parts.evals.wait(rl.job_id)
    await _close(parts)
    assert warm.job_id == running.job_id and summary.state == "succeeded"
    assert rl.job_id != failed.job_id, "a failed eval was reused"
    assert runner.runs == 3 * 2 + 3 * 2, "the resumed job and the new one each ran all their attempts, once"


def _request(task_root: Path, label: str) -> bytes:
    return pb.SubmitEvalRequest(tasks=str(task_root), attempts=2, name=f"{label}:{task_root}").SerializeToString()
