"""Eval jobs: run every (task, attempt) of a job once, record each result as it lands, resume after a crash.

A job is submitted (checked against config limits, its task list resolved and frozen in the
store), then runs as one asyncio task: `concurrency` workers take (task, attempt) pairs from a
lazy iterator, so a job holds as many pending attempts in memory as it runs, whatever its size.
Each attempt goes through the `AttemptRunner` seam (the real one drives an episode; tests may
plug a scripted one). Watchers get an event per started and finished attempt and a summary.

Every store call runs on a worker thread; the event loop never waits on SQLite. A job that
cannot be loaded on resume (its request does not parse, exceeds the limits, or its tasks are
gone) is marked FAILED with the reason instead of being run into a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from google.protobuf.message import DecodeError

from t1.config.inference import OpenAIEndpointConfig
from t1.config.limits import RequestLimits
from t1.coordinator.evals.crash import CLEAN_EXIT, ExitKind, PreviousExit
from t1.coordinator.evals.eval_request import (
    EvalRequest,
    agent_format_of,
    check_job_size,
    check_submit,
    check_tasks,
    openai_endpoint,
    request_bytes,
    stored_request,
)
from t1.coordinator.evals.job_store import JobRecord, JobState, JobStore
from t1.evals.results import AttemptOutcome, JobSummaryValues, summary_of
from t1.metrics.write_faults import WriteFaults
from t1.rpc.errors import NotFound, RequestError, ResourceExhausted
from t1.tasks.spec import TaskSpec
from t1.trajectory.types import EpisodeStatus
from t1.workdir import StorageError

log = logging.getLogger(__name__)
T = TypeVar("T")
DB_FAULT = "eval job database"
MB = 1 << 20
STORE_RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class EvalAttempt:
    """One attempt to run: the task and the job's settings that shape the episode."""

    job_id: str
    task: TaskSpec
    attempt: int
    agent_format: str = ""            # "" means the config's default
    timeout_multiplier: float = 1.0
    inference_endpoints: tuple[str, ...] = ()
    openai: OpenAIEndpointConfig | None = None  # an OpenAI-compatible server instead of the endpoints


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
    finished: int = 0
    running: int = 0
    resolved: int = 0  # of the attempts finished by this process (the progress view's solve rate so far)
    scored: int = 0
    task: asyncio.Task[None] | None = None
    watchers: set[asyncio.Queue[JobUpdate]] = field(default_factory=set)
    families: dict[str, str] = field(default_factory=dict)  # task id -> family, kept when the tasks are let go


class EvalJobs:
    """Owns the running eval jobs; `close()` cancels them (their finished attempts are already stored)."""

    def __init__(self, store: JobStore, resolve: TaskResolver, runner: AttemptRunner, default_concurrency: int,
                 limiter: asyncio.Semaphore | None = None, limits: RequestLimits | None = None,
                 faults: WriteFaults | None = None) -> None:
        self.store = store
        self.faults = faults or WriteFaults()
        self.limits = limits or RequestLimits()
        self._resolve = resolve
        self._runner = runner
        self._default_concurrency = default_concurrency
        self._limiter = limiter
        self._live: dict[str, _Live] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def submit(self, req: EvalRequest) -> JobRecord:
        """Check, resolve tasks, store, and start; bad requests raise RequestError naming the field, a job past
        the bounds on what the coordinator holds ResourceExhausted naming the bound."""
        check_submit(req, self.limits)
        active = sum(1 for live in self._live.values() if live.task is not None and not live.task.done())
        if active >= self.limits.max_active_jobs:
            raise ResourceExhausted(f"{active} eval jobs are queued or running, the most limits.max_active_jobs "
                                    "allows: submit again when one has ended")
        stored = await asyncio.to_thread(self.store.size_bytes)
        if stored > self.limits.max_jobs_db_mb * MB:
            raise ResourceExhausted(f"the eval job database {self.store.path} holds {stored // MB} MB, over "
                                    f"limits.max_jobs_db_mb ({self.limits.max_jobs_db_mb}): move it aside (its jobs "
                                    "are then no longer listed) or raise the bound")
        try:
            tasks = await asyncio.to_thread(self._resolve, req.tasks, list(req.task_ids))
        except (KeyError, ValueError, OSError) as exc:
            raise RequestError(f"tasks: {exc}") from None
        if not tasks:
            raise RequestError(f"tasks: {req.tasks!r} has no tasks")
        check_job_size(len(tasks), req.attempts, self.limits)
        check_tasks(tasks, self.limits)
        record = await asyncio.to_thread(self.store.create_job, req.name, request_bytes(req),
                                         [t.id for t in tasks], req.attempts)
        self._start(record, tasks, finished=0)
        log.info("eval job %s: %d tasks x %d attempts from %s", record.job_id, len(tasks), req.attempts, req.tasks)
        return record

    async def resume(self, previous: PreviousExit = CLEAN_EXIT, max_unclean_resumes: int = 1) -> list[str]:
        """Restart every job left queued or running by an earlier process; returns their ids.

        `previous`: how that process ended (`t1.coordinator.evals.crash`). A job it was running when it died of a fatal
        signal is marked FAILED naming the crash; one running when it died without a word (kill -9, the OOM
        killer) is resumed, at most `max_unclean_resumes` times, then FAILED: a job whose attempts kill the
        process cannot do it again on every restart, and an operator's kill -9 fails nothing the first time."""
        resumed = []
        for record in await asyncio.to_thread(self.store.unfinished):
            ran = record.state is JobState.RUNNING and previous.unclean
            reason = _not_resumed(record, previous, max_unclean_resumes) if ran else ""
            if not reason:
                try:
                    tasks = await asyncio.to_thread(self._reload, record)
                except (DecodeError, KeyError, ValueError, OSError) as exc:
                    reason = f"cannot resume: {exc}"
            if reason:
                log.error("eval job %s: %s; marked failed", record.job_id, reason[:1000])
                await asyncio.to_thread(self.store.set_state, record.job_id, JobState.FAILED, reason[:1000])
                continue
            record = await asyncio.to_thread(self.store.count_resume, record.job_id, ran)
            log.info("eval job %s: resume %d (%d after a coordinator that died while it ran)", record.job_id,
                     record.resumes, record.unclean_resumes)
            self._start(record, tasks, await asyncio.to_thread(self.store.finished_count, record.job_id))
            resumed.append(record.job_id)
        if resumed:
            log.info("resumed eval jobs: %s", ", ".join(resumed))
        return resumed

    def _reload(self, record: JobRecord) -> list[TaskSpec]:
        """The job's tasks again, after the same checks a new submission gets (limits may have changed)."""
        req = stored_request(record.request)
        check_submit(req, self.limits)
        check_job_size(len(record.task_ids), record.attempts_per_task, self.limits)
        tasks = self._resolve(req.tasks, list(record.task_ids))
        check_tasks(tasks, self.limits)
        return tasks

    def _start(self, record: JobRecord, tasks: list[TaskSpec], finished: int) -> None:
        live = _Live(record, {t.id: t for t in tasks}, finished)
        self._live[record.job_id] = live
        live.task = asyncio.get_running_loop().create_task(self._run(live), name=f"eval-{record.job_id}")

    async def cancel(self, job_id: str) -> JobRecord:
        record = await self.get(job_id)
        live = self._live.get(job_id)
        if not record.state.terminal:
            await self._set_state(job_id, JobState.CANCELLED)
            if live is not None and live.task is not None:
                live.task.cancel()
        return await self.get(job_id)

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

    async def get(self, job_id: str) -> JobRecord:
        record = await asyncio.to_thread(self.store.get, job_id)
        if record is None:
            raise NotFound(f"job_id: no job {job_id!r}")
        return record

    def running(self, job_id: str) -> int:
        live = self._live.get(job_id)
        return live.running if live else 0

    def progress(self, job_id: str) -> tuple[int, int] | None:
        """(finished, total) attempts of a job this process runs, from memory; None for others."""
        live = self._live.get(job_id)
        return None if live is None else (live.finished, live.record.total_attempts)

    def solved_so_far(self, job_id: str) -> tuple[int, int]:
        """(resolved, scored) attempts this process finished of a job: infra errors are not scored."""
        live = self._live.get(job_id)
        return (0, 0) if live is None else (live.resolved, live.scored)

    async def families(self, record: JobRecord) -> dict[str, str]:
        """The task families of a job, by task id: from memory for a job this process ran, else from its
        tasks resolved again (a finished job a resumed run reuses); empty when they no longer resolve."""
        live = self._live.get(record.job_id)
        if live is not None:
            return live.families or {tid: t.metadata.family for tid, t in live.tasks.items()}
        try:
            tasks = await asyncio.to_thread(self._reload, record)
        except (RequestError, DecodeError, KeyError, ValueError, OSError) as exc:
            log.warning("eval job %s: its task families are not in the summary (%s)", record.job_id, exc)
            return {}
        return {t.id: t.metadata.family for t in tasks}

    async def summary(self, record: JobRecord) -> JobSummaryValues:
        tallies = await asyncio.to_thread(self.store.tallies, record.job_id)
        return summary_of(tallies, record.attempts_per_task, self.limits.max_pass_at_k)

    async def watch(self, job_id: str) -> AsyncIterator[JobUpdate]:
        """A snapshot, then every update until the job is in a terminal state."""
        record = await self.get(job_id)
        live = self._live.get(job_id)
        finished = live.finished if live else await asyncio.to_thread(self.store.finished_count, job_id)
        yield JobUpdate(record, self.running(job_id), finished)
        if record.state.terminal or live is None:
            if record.state.terminal:
                yield JobUpdate(record, 0, finished, summary=await self.summary(record))
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

    def _emit(self, live: _Live, *, started: tuple[str, int] | None = None, outcome: AttemptOutcome | None = None,
              summary: JobSummaryValues | None = None) -> None:
        update = JobUpdate(live.record, live.running, live.finished, started, outcome, summary)
        for q in live.watchers:
            q.put_nowait(update)

    async def _stored(self, write: Callable[..., T], *args: Any) -> T:
        """`write(*args)` on the job store, retried every STORE_RETRY_S while the database cannot be written (a
        full disk): the attempt's outcome waits in memory, and the worker that holds it starts no new attempt
        meanwhile. The run status shows the error (WriteFaults) until a write succeeds."""
        while True:
            try:
                result = await asyncio.to_thread(write, *args)
            except StorageError as exc:
                self.faults.failed(DB_FAULT, exc)
                await asyncio.sleep(STORE_RETRY_S)
                continue
            self.faults.recovered(DB_FAULT)
            return result

    async def _set_state(self, job_id: str, state: JobState, error: str = "") -> None:
        await self._stored(self.store.set_state, job_id, state, error)
        live = self._live.get(job_id)
        if live is not None:
            live.record = replace(live.record, state=state, error=error, updated=time.time())

    # -- running -----------------------------------------------------------------------------

    async def _run(self, live: _Live) -> None:
        try:
            await self._run_attempts(live)
        finally:  # an ended job keeps only its tasks' families: a coordinator serving many jobs holds no old tasks
            live.families = {tid: t.metadata.family for tid, t in live.tasks.items()}
            live.tasks = {}

    async def _run_attempts(self, live: _Live) -> None:
        record = live.record
        req = stored_request(record.request)
        done = await asyncio.to_thread(self.store.finished_keys, record.job_id)
        todo = self._todo(live, req, done)
        await self._set_state(record.job_id, JobState.RUNNING)
        workers = min(req.concurrency or self._default_concurrency, record.total_attempts - len(done))
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(max(workers, 0)):
                    tg.create_task(self._worker(live, todo))
        except asyncio.CancelledError:
            if not live.record.state.terminal:
                raise  # shutdown: the job stays running in the store and resumes next time
            self._emit(live)
            raise
        except BaseExceptionGroup as eg:  # a bug in the attempt path, not an infra failure
            log.error("eval job %s failed", record.job_id, exc_info=eg)
            await self._set_state(record.job_id, JobState.FAILED, f"{eg.exceptions[0]!r}"[:1000])
            self._emit(live)
            return
        await self._set_state(record.job_id, JobState.SUCCEEDED)
        summary = await self.summary(live.record)
        log.info("eval job %s done: resolve rate %.3f over %d tasks (%d infra errors)", record.job_id,
                 summary.resolve_rate, summary.num_tasks, summary.infra_errors)
        self._emit(live, summary=summary)

    def _todo(self, live: _Live, req: EvalRequest, done: set[tuple[str, int]]) -> Iterator[EvalAttempt]:
        """The job's unfinished attempts, made one at a time as workers ask for them."""
        r = live.record
        endpoint = openai_endpoint(req)
        fmt = agent_format_of(req, endpoint)
        for tid in r.task_ids:
            for a in range(r.attempts_per_task):
                if (tid, a) not in done:
                    yield EvalAttempt(r.job_id, live.tasks[tid], a, fmt, req.timeout_multiplier or 1.0,
                                      req.inference_endpoints, openai=endpoint)

    async def _worker(self, live: _Live, todo: Iterator[EvalAttempt]) -> None:
        for spec in todo:  # workers share one iterator: each attempt is taken once
            await self._attempt(live, spec)

    async def _attempt(self, live: _Live, spec: EvalAttempt) -> None:
        async with self._limiter or contextlib.nullcontext():
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
            if await self._stored(self.store.record_attempt, spec.job_id, outcome):
                live.finished += 1
                live.scored += not outcome.is_infra_error
                live.resolved += outcome.resolved and not outcome.is_infra_error
            self._emit(live, outcome=outcome)


def _not_resumed(record: JobRecord, previous: PreviousExit, max_unclean_resumes: int) -> str:
    """Why a job that was running when the coordinator died is not resumed ("" when it is)."""
    if previous.kind is ExitKind.CRASHED:
        return f"the coordinator crashed while this job ran; not resumed: {previous.traceback}"
    if record.unclean_resumes >= max_unclean_resumes:
        return (f"the coordinator died without a traceback (SIGKILL: an operator or the OOM killer) while this job "
                f"ran, {record.unclean_resumes + 1} times; a job is resumed after such a death at most "
                f"{max_unclean_resumes} times (coordinator.eval.max_unclean_resumes); not resumed again")
    return ""
