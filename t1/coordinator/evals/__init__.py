"""Eval jobs: every (task, attempt) of a job run once, each result recorded as it lands, resumed after a crash.

- eval_jobs.py: EvalJobs: jobs submitted, run with their concurrency, watched, cancelled, resumed after a crash
- job_store.py: JobStore: the eval jobs and every finished attempt in SQLite
- eval_request.py: EvalRequest (an eval job as asked), its SubmitEvalRequest form, and its checks against
  config limits (RequestError naming the field)
- service.py: CoordinatorService: the gRPC face of eval jobs and run status
- crash.py: a fatal signal's traceback in logs/crash.txt, so crashed eval jobs are not resumed into it
"""
