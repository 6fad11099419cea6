"""The stages of a training run: warm-start demonstrations, an eval set, training, the report.

Each stage takes the parts it uses and returns what it produced; none of them writes to a shared
object. The order, and the run phase each one runs in, belong to the driver (app.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from t1.agent.formats import get_format
from t1.agent.scripted import ScriptedPolicy
from t1.coordinator.evals.eval_request import EvalRequest
from t1.coordinator.evals.job_store import JobRecord, JobState
from t1.coordinator.rollout.runner import EpisodeOptions, new_group_id
from t1.coordinator.rollout.scheduler import ResumeFn
from t1.coordinator.run.parts import Parts
from t1.coordinator.run.run_report import EvalsByLabel, RolloutTotals, RunReport, TrainerAtEnd
from t1.coordinator.run.run_state import TrainerSide
from t1.coordinator.run.sft_steer import CurvePoint, curve_records
from t1.coordinator.spool.journal_recovery import Unfinished
from t1.coordinator.tasksource import shard_tasks, training_stream
from t1.evals.stats import EvalSummary, eval_summary, family_lookup
from t1.metrics import registry as m
from t1.rpc.loop import wait_or_stop
from t1.tasks.spec import TaskSpec
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus
from t1.view.learning_png import PNG_NAME, write_learning_png

log = logging.getLogger(__name__)
# A job a resumed run finds under the same name: finished, or resumed by the restart and still running.
REUSABLE_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.QUEUED, JobState.RUNNING})

FIDELITY_KEYS = ("train_infer_logprob_abs_diff", "logprob_abs_diff", "tito_drift_tokens", "retokenize_mismatch_rate",
                 "routing_replay_coverage", "router_disagreement_rate", "approx_kl", "clip_fraction", "value_loss",
                 "explained_variance")


@dataclass(frozen=True, slots=True)
class TrainingEnd:
    trainer_done: bool  # the trainer finished (else a stop was requested or an episode task failed)
    abandoned: int      # episodes cancelled because they did not end within the grace period


async def write_demos(parts: Parts, tasks: list[TaskSpec], path: Path) -> int:
    """Oracle demonstrations for SFT: each training task's reference solution typed through the rollout path."""
    fmt = get_format(parts.cfg.rollout.agent_format)
    scripted = ScriptedPolicy(parts.runner.renderers[fmt.name],
                              lossy_share=parts.cfg.rollout.compaction.teacher_lossy_share,
                              notes=parts.cfg.rollout.compaction.teacher_notes)
    records: dict[str, bytes] = {}

    async def one(task: TaskSpec) -> None:
        async with parts.limiter:
            group = f"demo-{new_group_id(task)}"
            result = await parts.runner.run_episode(
                task, group, 0, EpisodeOptions(subdir="demos", generate=scripted.for_episode(task, fmt)))
            if result.status is not EpisodeStatus.INFRA_ERROR and result.report.resolved:
                records[task.id] = encode_trajectory(result.trajectory)

    async with asyncio.TaskGroup() as tg:
        for task in tasks:
            tg.create_task(one(task))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(records[k] for k in sorted(records)))  # in task order: SFT's batches follow the seed
    log.info("warm start: %d oracle demonstrations of %d tasks in %s", len(records), len(tasks), path)
    return len(records)


async def submit_eval(parts: Parts, label: str, set_name: str, attempts: int) -> JobRecord:
    """The eval job of one set (label: base | warm_start | rl, or sft-N for a validation eval during SFT).

    A resumed run reuses its own job of that name that finished, or that the restart resumed (queued or
    running), instead of evaluating again: the run's stages run again in order after a restart, and the
    policy an earlier stage evaluated (the base model, the warm start) is no longer the one the servers hold."""
    name = f"{label}:{set_name}"
    earlier = await asyncio.to_thread(parts.store.latest_named, name)
    if earlier is not None and earlier.state in REUSABLE_JOB_STATES:
        log.info("eval %s on %s: job %s of this run, %s before the restart, reused", label, set_name,
                 earlier.job_id, earlier.state.value)
        parts.runlog.write("eval_reused", label=label, set=set_name, job_id=earlier.job_id, state=earlier.state.value)
        return earlier
    record = await parts.evals.submit(EvalRequest(tasks=set_name, attempts=attempts, name=name))
    log.info("eval %s on %s: job %s (%d attempts)", label, set_name, record.job_id, record.total_attempts)
    return record


async def eval_result(parts: Parts, label: str, set_name: str, job_id: str) -> EvalSummary:
    """Wait for the job to end; its summary (also in the run log and the resolve-rate gauge): solve rate with
    its Wilson 95% interval over scored attempts, infra errors counted apart, and the same per task family."""
    await parts.evals.wait(job_id)
    record = await parts.evals.get(job_id)
    s = await parts.evals.summary(record)
    outcomes = await asyncio.to_thread(parts.store.attempts, job_id)
    families = family_lookup(await parts.evals.families(record))
    m.RESOLVE_RATE.labels(split=f"{label}:{set_name}").set(s.resolve_rate)
    summary = eval_summary(job_id, record.state.value, s, outcomes, families)
    parts.runlog.write("eval", label=label, set=set_name, **summary.as_dict())
    return summary


async def training_stage(parts: Parts, trainer: TrainerSide, tasks: list[TaskSpec]) -> TrainingEnd:
    """Groups of rollouts into the spool until the trainer is done or the scheduler is stopped (a stop
    request, a failed episode task); then the episodes in flight are drained."""
    sched = parts.scheduler

    async def attempt(task: TaskSpec, group_id: str, i: int) -> None:
        await parts.runner.train_episode(task, group_id, i, parts.spool)

    progress = trainer.poller.progress(parts.cfg.trainer.rl.groups_per_step)
    stream = training_stream(shard_tasks(tasks, parts.cfg.coordinator.shard), parts.cfg.seed)
    admit = asyncio.ensure_future(sched.run(stream, progress, attempt, resumed_groups(parts, tasks)))
    try:
        trainer_done = await wait_or_stop(trainer.poller.done.wait(), sched.stopped)
    finally:
        sched.stop()
        await admit
    # Trainer done: running episodes cannot be trained any more. A stop: they get the grace period.
    abandoned = await sched.drain(0.0 if trainer_done else parts.cfg.coordinator.shutdown_grace_s)
    if trainer_done and parts.journal is not None:  # (after a stop they are ended by the next start)
        await parts.journal.drained()
        await asyncio.to_thread(parts.journal.discard_training)
    return TrainingEnd(trainer_done, abandoned)


def resumed_groups(parts: Parts, tasks: list[TaskSpec]) -> dict[str, list[ResumeFn]]:
    """The episodes a dead coordinator left to resume, by group: each continues in its reattached sandbox."""
    by_id = {t.id: t for t in tasks}
    groups: dict[str, list[ResumeFn]] = {}
    for u in parts.recovered.unfinished:
        def member(u: Unfinished = u) -> Coroutine[Any, Any, object]:
            return parts.runner.resume_episode(u, by_id.get(u.task_id), parts.spool, parts.sandboxes.reattach)

        groups.setdefault(u.group_id, []).append(member)
    return groups


def write_report(parts: Parts, trainer: TrainerSide, evals: EvalsByLabel, sft_curve: Sequence[CurvePoint] = (),
                 sft_kept_step: int | None = None, finished: bool = True, planned_steps: int = 0) -> RunReport:
    """The run's report (evals by label, the SFT curve, trainer, fidelity, rollouts), written to
    <run_dir>/report.json, with the learning curves drawn beside the run log (both paths in the report).
    `finished` is False for a run stopped before its end: the report says so, with its planned steps."""
    poller, stats = trainer.poller, parts.runner.stats
    fidelity = {k: v for k, v in poller.last_metrics.items()
                if k.removeprefix("t1_").rsplit("/", 1)[-1] in FIDELITY_KEYS}
    # Measured here over every episode of the run: the sampler's ids against the exported trajectories.
    fidelity.update(t1_tito_drift_tokens=stats.drift_tokens, t1_retokenize_mismatch_rate=stats.retokenize_mismatch_rate,
                    t1_tito_template_mismatches=stats.template_mismatches)
    rollouts = RolloutTotals(
        episodes=stats.finished, turns=stats.turns, infra_errors=stats.infra_errors, segments=stats.segments,
        segments_with_drift=stats.drift_segments, resumed=stats.resumed,
        resume_turns_lost=stats.resume_turns_lost, resume_failed=stats.resume_failed,
        journal_recovered=parts.recovered.summary(), spool_pending=parts.spool.pending_count,
        policy_versions=tuple(sorted(stats.versions)), training=stats.training_tallies(),
        gateway_segments=dict(stats.gateway_segments))  # harness episodes: their gateway's segment starts, by cause
    png = _learning_curves(parts, sft_curve)
    path = parts.run_dir / "report.json"
    report = RunReport(name=parts.cfg.name, evals=evals, finished=finished, planned_steps=planned_steps,
                       sft_curve=tuple(sft_curve), sft_kept_step=sft_kept_step,
                       trainer=TrainerAtEnd(step=poller.last.step if poller.last else 0, stage=poller.stage_name,
                                            policy_version=trainer.weights.version),
                       fidelity=fidelity, rollouts=rollouts, curves_png="" if png is None else str(png),
                       report_path=str(path))
    try:
        path.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # a full disk: the report is still printed and in the run log's trackers
        log.error("the report could not be written to %s: %s", path, exc)
        report = replace(report, report_path="")
    parts.runlog.write("report", **report.to_json())
    return report


def _learning_curves(parts: Parts, sft_curve: Sequence[CurvePoint]) -> Path | None:
    """The learning-curve PNG beside the run log (the trainer's buffer is read when it is on this machine);
    None, with the reason logged, when it cannot be drawn: the report is written whatever happens here."""
    trainer_dir = parts.cfg.trainer.work_dir if not parts.cfg.trainer.endpoint else None
    log_path = parts.runlog.path
    try:
        return write_learning_png(log_path, trainer_dir, log_path.parent / PNG_NAME,
                                  f"{parts.cfg.name}: learning curves", curve_records(sft_curve))
    except Exception:  # a plotting failure must not cost the run its report
        log.exception("learning curves could not be drawn to %s", log_path.parent / PNG_NAME)
        return None
