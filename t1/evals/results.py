"""Eval results as values, and the math over them: resolve rate, mean reward, unbiased pass@k."""

from __future__ import annotations

from collections import defaultdict
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

    @property
    def is_infra_error(self) -> bool:
        return self.status is EpisodeStatus.INFRA_ERROR


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


def resolve_rate(outcomes: Iterable[AttemptOutcome]) -> float:
    """Mean of binary rewards over attempts that were not infra errors (0.0 when there are none)."""
    scored = [o for o in outcomes if not o.is_infra_error]
    return sum(o.resolved for o in scored) / len(scored) if scored else 0.0


def mean_reward(outcomes: Iterable[AttemptOutcome]) -> float:
    scored = [o.reward for o in outcomes if not o.is_infra_error]
    return sum(scored) / len(scored) if scored else 0.0


def job_pass_at_k(outcomes: Iterable[AttemptOutcome], max_k: int) -> dict[int, float]:
    """Mean over tasks of pass@k, k = 1..max_k; a task counts for k only if it has >= k scored attempts."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    for o in outcomes:
        if not o.is_infra_error:
            per_task[o.task_id].append(o.resolved)
    result: dict[int, float] = {}
    for k in range(1, max_k + 1):
        values = [pass_at_k(len(r), sum(r), k) for r in per_task.values() if len(r) >= k]
        if values:
            result[k] = sum(values) / len(values)
    return result


def summarize(outcomes: Sequence[AttemptOutcome], attempts_per_task: int) -> JobSummaryValues:
    return JobSummaryValues(
        resolve_rate=resolve_rate(outcomes),
        mean_reward=mean_reward(outcomes),
        pass_at_k=job_pass_at_k(outcomes, attempts_per_task),
        infra_errors=sum(o.is_infra_error for o in outcomes),
        num_tasks=len({o.task_id for o in outcomes}),
    )
