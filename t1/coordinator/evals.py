"""Eval jobs: run every (task, attempt) of a job once, record each result as it lands, resume after a crash.

A job is submitted (validated, its task list resolved and frozen in the store), then runs
as one asyncio task: a bounded number of attempts at a time, each through the
`AttemptRunner` seam (the real one drives an episode; tests may plug a scripted one).
Watchers get an event per started and finished attempt and a final summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from t1.coordinator.jobs import JobRecord, JobState, JobStore
from t1.coordinator.results import AttemptOutcome, JobSummaryValues, summarize
from t1.rpc.errors import NotFound, RequestError
from t1.tasks.spec import TaskSpec
from t1.trajectory.types import EpisodeStatus
from t1.v1 import coordinator_pb2 as pb

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EvalAttempt:
    """One attempt to run: the task and the job's settings that shape the episode."""

    job_id: str
    task: TaskSpec
    attempt: int
    agent_format: str = ""            # "" means the config's default
    timeout_multiplier: float = 1.0
    inference_endpoints: tuple[str, ...] = ()
    model_version: int = 0


class AttemptRunner(Protocol):
    """Runs one attempt to the end and says how it went; infra failures are outcomes, not exceptions."""

    async def __call__(self, attempt: EvalAttempt) -> AttemptOutcome: ...


TaskResolver = Callable[[str, Sequence[str]], list[TaskSpec]]


@dataclass(frozen=True, slots=True)
class JobUpdate:
    """One progress event of a job (exactly one of the optional fields is set, or none for a snapshot)."""

    job: JobRecord
    running: int
    finished: int
    started: tuple[str, int] | None = None
    outcome: AttemptOutcome | None = None
    summary: JobSummaryValues | None = None


@dataclass(slots=True)
class _Live:
    record: JobRecord
    tasks: dict[str, TaskSpec]
    running: int = 0
    task: asyncio.Task[None] | None = None
    watchers: set[asyncio.Queue[JobUpdate]] = field(default_factory=set)


_FORMATS = {pb.AGENT_FORMAT_UNSPECIFIED: "", pb.AGENT_FORMAT_TOOL_CALLS: "tool_calls",
            pb.AGENT_FORMAT_TERMINUS2: "terminus2"}


class EvalJobs:
    """Owns the running eval jobs; `close()` cancels them (their finished attempts are already stored)."""

    def __init__(self, store: JobStore, resolve: TaskResolver, runner: AttemptRunner, default_concurrency: int,
                 limiter: asyncio.Semaphore | None = None) -> None:
        self.store = store
        self._resolve = resolve
        self._runner = runner
        self._default_concurrency = default_concurrency
        self._limiter = limiter
        self._live: dict[str, _Live] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    def submit(self, req: pb.SubmitEvalRequest) -> JobRecord:
        """Validate, resolve tasks, store, and start; bad requests raise RequestError naming the field."""
        if not req.tasks:
            raise RequestError("tasks: required (a task folder or a name in tasks.sets)")
        if req.attempts < 1:
            raise RequestError(f"attempts: must be >= 1, got {req.attempts}")
        if req.concurrency < 0:
            raise RequestError(f"concurrency: must be >= 0, got {req.concurrency}")
        if req.timeout_multiplier < 0:
            raise RequestError(f"timeout_multiplier: must be >= 0, got {req.timeout_multiplier}")
        if req.agent_format not in _FORMATS:
            raise RequestError(f"agent_format: unknown value {req.agent_format}")
        try:
            tasks = self._resolve(req.tasks, list(req.task_ids))
        except (KeyError, ValueError, OSError) as exc:
            raise RequestError(f"tasks: {exc}") from None
        if not tasks:
            raise RequestError(f"tasks: {req.tasks!r} has no tasks")
        record = self.store.create_job(req.name, req.SerializeToString(), [t.id for t in tasks], req.attempts)
        self._start(record, tasks)
        log.info("eval job %s: %d tasks x %d attempts from %s", record.job_id, len(tasks), req.attempts, req.tasks)
        return record

    def resume(self) -> list[str]:
        """Restart every job left queued or running by an earlier process; returns their ids."""
        resumed = []
        for record in self.store.unfinished():
            req = pb.SubmitEvalRequest.FromString(record.request)
            try:
                tasks = self._resolve(req.tasks, list(record.task_ids))
            except (KeyError, ValueError, OSError) as exc:
                self.store.set_state(record.job_id, JobState.FAILED, f"cannot reload tasks on resume: {exc}")
                continue
            self._start(record, tasks)
            resumed.append(record.job_id)
        if resumed:
            log.info("resumed eval jobs: %s", ", ".join(resumed))
        return resumed

    def _start(self, record: JobRecord, tasks: list[TaskSpec]) -> None:
        live = _Live(record, {t.id: t for t in tasks})
        self._live[record.job_id] = live
        live.task = asyncio.get_running_loop().create_task(self._run(live), name=f"eval-{record.job_id}")

    def cancel(self, job_id: str) -> JobRecord:
        record = self.get(job_id)
        live = self._live.get(job_id)
        if not record.state.terminal:
            self.store.set_state(job_id, JobState.CANCELLED)
            if live is not None and live.task is not None:
                live.task.cancel()
        return self.get(job_id)

    async def close(self) -> None:
        tasks = [lv.task for lv in self._live.values() if lv.task is not None and not lv.task.done()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def wait(self, job_id: str) -> None:
        live = self._live.get(job_id)
        if live is not None and live.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(live.task)

    # -- queries -----------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord:
        record = self.store.get(job_id)
        if record is None:
            raise NotFound(f"job_id: no job {job_id!r}")
        return record

    def running(self, job_id: str) -> int:
        live = self._live.get(job_id)
        return live.running if live else 0

    def summary(self, record: JobRecord) -> JobSummaryValues:
        return summarize(self.store.attempts(record.job_id), record.attempts_per_task)

    async def watch(self, job_id: str) -> AsyncIterator[JobUpdate]:
        """A snapshot, then every update until the job is in a terminal state."""
        record = self.get(job_id)
        finished = len(self.store.finished_keys(job_id))
        live = self._live.get(job_id)
        yield JobUpdate(record, self.running(job_id), finished)
        if record.state.terminal or live is None:
            if record.state.terminal:
                yield JobUpdate(record, 0, finished, summary=self.summary(record))
            return
        q: asyncio.Queue[JobUpdate] = asyncio.Queue()
        live.watchers.add(q)
        try:
            while True:
                update = await q.get()
                yield update
                if update.job.state.terminal:
                    return
        finally:
            live.watchers.discard(q)

    def _emit(self, live: _Live, **kw: object) -> None:
        record = self.store.get(live.record.job_id) or live.record
        update = JobUpdate(record, live.running, len(self.store.finished_keys(record.job_id)), **kw)  # type: ignore[arg-type]
        for q in live.watchers:
            q.put_nowait(update)

    # -- running -----------------------------------------------------------------------------

    async def _run(self, live: _Live) -> None:
        record = live.record
        req = pb.SubmitEvalRequest.FromString(record.request)
        done = self.store.finished_keys(record.job_id)
        todo = [(tid, a) for tid in record.task_ids for a in range(record.attempts_per_task) if (tid, a) not in done]
        self.store.set_state(record.job_id, JobState.RUNNING)
        sem = asyncio.Semaphore(req.concurrency or self._default_concurrency)
        try:
            async with asyncio.TaskGroup() as tg:
                for tid, attempt in todo:
                    spec = EvalAttempt(record.job_id, live.tasks[tid], attempt, _FORMATS[req.agent_format],
                                       req.timeout_multiplier or 1.0, tuple(req.inference_endpoints), req.model_version)
                    tg.create_task(self._attempt(live, sem, spec))
        except asyncio.CancelledError:
            if not (self.store.get(record.job_id) or record).state.terminal:
                raise  # shutdown: the job stays running in the store and resumes next time
            self._emit(live)
            raise
        except BaseExceptionGroup as eg:  # a bug in the attempt path, not an infra failure
            log.error("eval job %s failed", record.job_id, exc_info=eg)
            self.store.set_state(record.job_id, JobState.FAILED, f"{eg.exceptions[0]!r}")
            self._emit(live)
            return
        self.store.set_state(record.job_id, JobState.SUCCEEDED)
        final = self.get(record.job_id)
        summary = self.summary(final)
        log.info("eval job %s done: resolve rate %.3f over %d tasks (%d infra errors)", record.job_id,
                 summary.resolve_rate, summary.num_tasks, summary.infra_errors)
        self._emit(live, summary=summary)

    async def _attempt(self, live: _Live, sem: asyncio.Semaphore, spec: EvalAttempt) -> None:
        async with sem, (self._limiter or contextlib.nullcontext()):
            live.running += 1
            self._emit(live, started=(spec.task.id, spec.attempt))
            t0 = time.monotonic()
            try:
                outcome = await self._runner(spec)
            except Exception as exc:  # one broken attempt must not sink the job: record it as infra
                log.exception("attempt %s/%d of job %s crashed", spec.task.id, spec.attempt, spec.job_id)
                outcome = AttemptOutcome(spec.task.id, spec.attempt, 0.0, 0, 0, EpisodeStatus.INFRA_ERROR,
                                         duration_s=time.monotonic() - t0, failure_mode=f"crash: {exc!r}"[:500])
            finally:
                live.running -= 1
            self.store.record_attempt(spec.job_id, outcome)
            self._emit(live, outcome=outcome)
