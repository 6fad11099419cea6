"""Eval results as values, and the math over them: resolve rate, mean reward, unbiased pass@k.

A job's summary is computed in one place, `summary_of`, from one tally per task: the job store's
tallies (SQL sums over up to limits.max_attempts_per_job attempts, for ListJobs, GetJob and WatchJob,
with pass@k for k up to limits.max_pass_at_k) or the tallies of a list of outcomes (`summarize`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from math import comb

from t1.trajectory.types import EpisodeStatus


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """What one finished attempt of a task gave."""

    task_id: str
    attempt: int
    reward: float
    passed: int
    total: int
    status: EpisodeStatus
    turns: int = 0
    tokens: int = 0
    duration_s: float = 0.0
    failure_mode: str = ""
    resolved: bool = False
    why: str = ""  # one line: why it did not resolve ('' when it did)
    failed_tests: tuple[tuple[str, str], ...] = ()  # (test name, first line of its assertion)
    verifier_output_tail: str = ""
    segments: int = 0  # the trajectory's TITO segments (compactions + 1); 0: not recorded (an older job store)

    @property
    def is_infra_error(self) -> bool:
        return self.status is EpisodeStatus.INFRA_ERROR


@dataclass(frozen=True, slots=True)
class TaskTally:
    """What one task of a job has so far: scored attempts, resolved ones, their reward sum, infra errors."""

    task_id: str
    scored: int
    resolved: int
    reward_sum: float
    infra_errors: int


@dataclass(frozen=True, slots=True)
class JobSummaryValues:
    """Per-job aggregates; infra errors are counted, never scored."""

    resolve_rate: float
    mean_reward: float
    pass_at_k: dict[int, float] = field(default_factory=dict)
    infra_errors: int = 0
    num_tasks: int = 0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with n attempts of which c succeeded: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def tallies_of(outcomes: Iterable[AttemptOutcome]) -> list[TaskTally]:
    """One tally per task of `outcomes`, tasks in order of first appearance."""
    rows: dict[str, list[float]] = {}
    for o in outcomes:
        row = rows.setdefault(o.task_id, [0, 0, 0.0, 0])
        if o.is_infra_error:
            row[3] += 1
        else:
            row[0] += 1
            row[1] += o.resolved
            row[2] += o.reward
    return [TaskTally(task, int(r[0]), int(r[1]), r[2], int(r[3])) for task, r in rows.items()]


def resolve_rate(outcomes: Iterable[AttemptOutcome]) -> float:
    """Mean of binary rewards over attempts that were not infra errors (0.0 when there are none)."""
    return summary_of(tallies_of(outcomes), 1, 0).resolve_rate


def summary_of(tallies: Sequence[TaskTally], attempts_per_task: int, max_k: int) -> JobSummaryValues:
    """Resolve rate and mean reward over scored attempts; pass@k (k up to min(attempts_per_task, max_k)) over
    the tasks with >= k scored attempts; infra errors counted, never scored."""
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


def summarize(outcomes: Sequence[AttemptOutcome], attempts_per_task: int) -> JobSummaryValues:
    """The summary of a list of outcomes (every k up to attempts_per_task)."""
    return summary_of(tallies_of(outcomes), attempts_per_task, attempts_per_task)
