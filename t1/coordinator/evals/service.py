"""CoordinatorService: the gRPC face of eval jobs and run status; it adapts protos and delegates to EvalJobs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc

from t1.coordinator.evals.eval_jobs import EvalJobs, JobUpdate
from t1.coordinator.evals.eval_request import check_text, request_of
from t1.coordinator.evals.job_store import JobRecord, JobState
from t1.evals.results import AttemptOutcome, JobSummaryValues
from t1.rpc.errors import RequestError, rpc_errors
from t1.rpc.options import MB
from t1.rpc.server import ServiceBinding
from t1.v1 import coordinator_pb2 as pb
from t1.v1 import coordinator_pb2_grpc as pb_grpc

STATE_TO_PB = {
    JobState.QUEUED: pb.JOB_STATE_QUEUED,
    JobState.RUNNING: pb.JOB_STATE_RUNNING,
    JobState.SUCCEEDED: pb.JOB_STATE_SUCCEEDED,
    JobState.FAILED: pb.JOB_STATE_FAILED,
    JobState.CANCELLED: pb.JOB_STATE_CANCELLED,
}
PB_TO_STATE = {v: k for k, v in STATE_TO_PB.items()}


def attempt_to_pb(o: AttemptOutcome) -> pb.AttemptResult:
    return pb.AttemptResult(task_id=o.task_id, attempt=o.attempt, reward=o.reward, passed=o.passed, total=o.total,
                            status=o.status.value, turns=o.turns, tokens=o.tokens, duration_s=o.duration_s,
                            failure_mode=o.failure_mode, resolved=o.resolved, why=o.why,
                            failed_tests=[pb.FailedTest(name=n, message=m) for n, m in o.failed_tests],
                            verifier_output_tail=o.verifier_output_tail)


def summary_to_pb(s: JobSummaryValues) -> pb.JobSummary:
    return pb.JobSummary(resolve_rate=s.resolve_rate, mean_reward=s.mean_reward, pass_at_k=s.pass_at_k,
                         infra_errors=s.infra_errors, num_tasks=s.num_tasks)


class CoordinatorServicer(pb_grpc.CoordinatorServiceServicer):
    """Eval jobs from EvalJobs; run status from a callable the app provides."""

    def __init__(self, jobs: EvalJobs, run_status: Callable[[], pb.RunStatus]) -> None:
        self._jobs = jobs
        self._run_status = run_status

    def binding(self) -> ServiceBinding:
        return ServiceBinding("t1.v1.CoordinatorService", pb_grpc.add_CoordinatorServiceServicer_to_server, self,
                              max_request_bytes=self._jobs.limits.max_request_mb * MB)

    async def _job_pb(self, record: JobRecord, include_attempts: bool = False) -> pb.EvalJob:
        live = self._jobs.progress(record.job_id)
        finished = live[0] if live else await asyncio.to_thread(self._jobs.store.finished_count, record.job_id)
        msg = pb.EvalJob(
            job_id=record.job_id, state=STATE_TO_PB[record.state],
            request=pb.SubmitEvalRequest.FromString(record.request), total_attempts=record.total_attempts,
            finished_attempts=finished, running_attempts=self._jobs.running(record.job_id),
            summary=summary_to_pb(await self._jobs.summary(record)), created_unix=record.created,
            updated_unix=record.updated, error=record.error)
        if include_attempts:
            attempts = await asyncio.to_thread(self._jobs.store.attempts, record.job_id)
            msg.attempts.extend(attempt_to_pb(o) for o in attempts)
        return msg

    @rpc_errors
    async def SubmitEval(self, request: pb.SubmitEvalRequest, context: grpc.aio.ServicerContext) -> pb.EvalJob:
        return await self._job_pb(await self._jobs.submit(request_of(request)))

    @rpc_errors
    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.EvalJob:
        return await self._job_pb(await self._jobs.get(self._job_id(request.job_id)), request.include_attempts)

    @rpc_errors
    async def WatchJob(self, request: pb.WatchJobRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[pb.JobEvent]:
        async for update in self._jobs.watch(self._job_id(request.job_id)):
            yield _event_pb(update)

    @rpc_errors
    async def CancelJob(self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext) -> pb.EvalJob:
        return await self._job_pb(await self._jobs.cancel(self._job_id(request.job_id)))

    @rpc_errors
    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        limits = self._jobs.limits
        if not 0 <= request.limit <= limits.max_list_page_size:
            raise RequestError(f"limit: must be in [0, {limits.max_list_page_size}] (limits.max_list_page_size), "
                               f"got {request.limit}")
        check_text("page_token", request.page_token, limits.max_name_chars)
        states = set()
        for s in request.states:
            if s not in PB_TO_STATE:
                raise RequestError(f"states: unknown job state {s}")
            states.add(PB_TO_STATE[s])
        page = await asyncio.to_thread(self._jobs.store.list_jobs, states, request.limit or limits.list_page_size,
                                       request.page_token)
        return pb.ListJobsResponse(jobs=[await self._job_pb(r) for r in page.jobs], next_page_token=page.next_token)

    def _job_id(self, value: str) -> str:
        if not value:
            raise RequestError("job_id: required")
        check_text("job_id", value, self._jobs.limits.max_name_chars)
        return value

    @rpc_errors
    async def GetRunStatus(self, request: pb.GetRunStatusRequest, context: grpc.aio.ServicerContext
                           ) -> pb.RunStatus:
        return self._run_status()


def _event_pb(u: JobUpdate) -> pb.JobEvent:
    ev = pb.JobEvent(job_id=u.job.job_id, state=STATE_TO_PB[u.job.state], total_attempts=u.job.total_attempts,
                     finished_attempts=u.finished, running_attempts=u.running)
    if u.started is not None:
        ev.attempt_started.CopyFrom(pb.AttemptStarted(task_id=u.started[0], attempt=u.started[1]))
    elif u.outcome is not None:
        ev.attempt_finished.CopyFrom(attempt_to_pb(u.outcome))
    elif u.summary is not None:
        ev.job_finished.CopyFrom(summary_to_pb(u.summary))
    return ev
