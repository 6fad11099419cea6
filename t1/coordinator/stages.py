"""The stages of a training run: warm-start demonstrations, eval before, training, eval after, the report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from t1.agent.formats import get_format
from t1.agent.scripted import ScriptedPolicy
from t1.config.schema import T1Config
from t1.coordinator.parts import Parts
from t1.coordinator.rollout import new_group_id
from t1.coordinator.scheduler import Scheduler
from t1.coordinator.tasksource import training_stream
from t1.metrics import registry as m
from t1.tasks.spec import TaskSpec
from t1.trajectory.codec import encode_trajectory
from t1.trajectory.types import EpisodeStatus
from t1.v1 import coordinator_pb2 as cpb

log = logging.getLogger(__name__)

FIDELITY_KEYS = ("train_infer_logprob_abs_diff", "logprob_abs_diff", "tito_drift_tokens", "retokenize_mismatch_rate",
                 "routing_replay_coverage", "router_disagreement_rate", "approx_kl", "clip_fraction", "value_loss",
                 "explained_variance")


async def write_demos(parts: Parts, tasks: list[TaskSpec], path: Path) -> int:
    """Oracle demonstrations for SFT: each training task's reference solution typed through the rollout path."""
    fmt = get_format(parts.cfg.rollout.agent_format)
    scripted = ScriptedPolicy(parts.runner.renderers[fmt.name])
    records: list[bytes] = []

    async def one(task: TaskSpec) -> None:
        async with parts.limiter:
            group = f"demo-{new_group_id(task)}"
            scripted.plan(f"{group}-a0", task, fmt)
            result = await parts.runner.run_episode(task, group, 0, subdir="demos", generate=scripted)
            if result.status is not EpisodeStatus.INFRA_ERROR and result.report.resolved:
                records.append(encode_trajectory(result.trajectory))

    async with asyncio.TaskGroup() as tg:
        for task in tasks:
            tg.create_task(one(task))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(records))
    log.info("warm start: %d oracle demonstrations of %d tasks in %s", len(records), len(tasks), path)
    return len(records)


async def eval_stage(parts: Parts, label: str, set_names: list[str], attempts: int) -> dict[str, dict[str, Any]]:
    """One eval job per set, run to the end; returns per-set summaries."""
    out: dict[str, dict[str, Any]] = {}
    for name in set_names:
        parts.stage = f"eval-{label}"
        record = parts.evals.submit(cpb.SubmitEvalRequest(tasks=name, attempts=attempts, name=f"{label}:{name}"))
        log.info("eval %s on %s: job %s (%d attempts)", label, name, record.job_id, record.total_attempts)
        parts.eval_job = (f"eval {label}", record.job_id)
        await parts.evals.wait(record.job_id)
        parts.eval_job = None
        s = parts.evals.summary(parts.evals.get(record.job_id))
        m.RESOLVE_RATE.labels(split=f"{label}:{name}").set(s.resolve_rate)
        out[name] = {"job_id": record.job_id, "resolve_rate": s.resolve_rate, "mean_reward": s.mean_reward,
                     "pass_at_k": s.pass_at_k, "infra_errors": s.infra_errors, "num_tasks": s.num_tasks}
        parts.runlog.write("eval", label=label, set=name, **out[name])
    return out


async def training_stage(parts: Parts, cfg: T1Config, tasks: list[TaskSpec], stop: asyncio.Event) -> None:
    """Groups of rollouts into the spool until the trainer is done or a stop is requested."""
    assert parts.poller is not None and parts.weights is not None
    parts.stage = "training"
    rl = cfg.trainer.rl
    sched = Scheduler(training_stream(tasks, cfg.seed), cfg.rollout.group_size, parts.limiter, parts.spool,
                      parts.weights, rl.max_policy_lag, rl.groups_per_step, new_group_id)
    parts.scheduler = sched

    async def attempt(task: TaskSpec, group_id: str, i: int) -> None:
        await parts.runner.train_episode(task, group_id, i, parts.spool)

    episodes: set[asyncio.Task[None]] = set()
    async with asyncio.TaskGroup() as tg:
        admit = tg.create_task(sched.run(_Tracker(tg, episodes), attempt))  # type: ignore[arg-type]
        done = asyncio.ensure_future(parts.poller.done.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for f in (done, stopped):
            f.cancel()
        sched.stop()
        await admit
        # Trainer done: running episodes cannot be trained any more. A stop: they get the grace period.
        grace = 0.0 if parts.poller.done.is_set() else cfg.coordinator.shutdown_grace_s
        pending = {t for t in episodes if not t.done()}
        if pending:
            log.info("%d episodes in flight: waiting up to %.0fs", len(pending), grace)
            _, still = await asyncio.wait(pending, timeout=grace) if grace > 0 else (set(), pending)
            for t in still:
                t.cancel()
    parts.stage = "trained"


class _Tracker:
    """A TaskGroup facade for the scheduler that remembers the episode tasks it creates."""

    def __init__(self, tg: asyncio.TaskGroup, tasks: set[asyncio.Task[None]]) -> None:
        self._tg = tg
        self._tasks = tasks

    def create_task(self, coro, name: str | None = None) -> asyncio.Task[None]:
        task = self._tg.create_task(_quiet_cancel(coro), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


async def _quiet_cancel(coro) -> None:
    """An abandoned episode is cancelled; that must not cancel the whole TaskGroup."""
    with contextlib.suppress(asyncio.CancelledError):
        await coro


async def train_run(parts: Parts, stop: asyncio.Event, cfg: T1Config, sets: dict[str, list[TaskSpec]],
                    trainer_target: Awaitable[str]) -> dict[str, Any]:
    """The whole training run; returns the report (also written to <run_dir>/report.json)."""
    train_tasks = [t for name in cfg.tasks.train for t in sets[name]]
    attempts = cfg.coordinator.eval.attempts
    report: dict[str, Any] = {"name": cfg.name}
    if cfg.coordinator.eval.before_training and cfg.tasks.eval and not stop.is_set():
        report["before"] = await eval_stage(parts, "before", cfg.tasks.eval, attempts)
    parts.stage = "starting-trainer"
    parts.connect_trainer(await trainer_target)
    if not stop.is_set():
        await training_stage(parts, cfg, train_tasks, stop)
    if cfg.tasks.eval and not stop.is_set():
        report["after"] = await eval_stage(parts, "after", cfg.tasks.eval, attempts)
    assert parts.poller is not None
    report["trainer"] = {"step": parts.poller.last.step if parts.poller.last else 0, "stage": parts.poller.stage_name,
                         "policy_version": parts.weights.version if parts.weights else 0}
    report["fidelity"] = {k: v for k, v in parts.poller.last_metrics.items()
                          if k.removeprefix("t1_").rsplit("/", 1)[-1] in FIDELITY_KEYS}
    stats = parts.runner.stats
    # Measured here over every episode of the run: the sampler's ids against the exported trajectories.
    report["fidelity"]["t1_tito_drift_tokens"] = stats.drift_tokens
    report["fidelity"]["t1_retokenize_mismatch_rate"] = stats.retokenize_mismatch_rate
    report["rollouts"] = {"episodes": stats.finished, "turns": stats.turns, "infra_errors": stats.infra_errors,
                          "spool_pending": parts.spool.pending_count, "policy_versions": sorted(stats.versions)}
    (parts.run_dir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    parts.runlog.write("report", **report)
    parts.stage = "done"
    return report
