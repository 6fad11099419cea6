"""A job's summary from its per-task tallies: the same numbers as `results.summarize`, without attempt rows.

ListJobs, GetJob and WatchJob report summaries of jobs that may hold up to
limits.max_attempts_per_job attempts; the store hands back one tally per task, and pass@k
is computed for k up to a small bound only (limits.max_pass_at_k).
"""

from __future__ import annotations

from collections.abc import Sequence

from t1.coordinator.jobs import TaskTally
from t1.evals.results import JobSummaryValues, pass_at_k


def summary_of(tallies: Sequence[TaskTally], attempts_per_task: int, max_k: int) -> JobSummaryValues:
    """resolve rate and mean reward over scored attempts; pass@k per task with >= k scored attempts."""
    scored = sum(t.scored for t in tallies)
    pass_k: dict[int, float] = {}
    for k in range(1, min(attempts_per_task, max_k) + 1):
        values = [pass_at_k(t.scored, t.resolved, k) for t in tallies if t.scored >= k]
        if values:
            pass_k[k] = sum(values) / len(values)
    return JobSummaryValues(
        resolve_rate=sum(t.resolved for t in tallies) / scored if scored else 0.0,
        mean_reward=sum(t.reward_sum for t in tallies) / scored if scored else 0.0,
        pass_at_k=pass_k,
        infra_errors=sum(t.infra_errors for t in tallies),
        num_tasks=len(tallies),
    )
