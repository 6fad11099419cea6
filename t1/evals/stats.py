"""The statistics of an eval's report: solve rate with a 95% Wilson score interval, per task family.

Pure functions over finished attempts (`AttemptOutcome`). Infra errors are counted apart and
excluded from every rate and mean: an attempt the machine broke says nothing about the policy.
The interval is the Wilson score interval over scored attempts (not the normal approximation:
it stays inside [0, 1] and is honest at 0 and at n successes, where a small eval often sits).
Attempts of one task are treated as independent draws, as pass@1 does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from t1.evals.results import AttemptOutcome, JobSummaryValues

Z95 = 1.959963984540054  # the two-sided 95% quantile of the standard normal
CI_METHOD = "wilson"
_SYNTH_ID = re.compile(r"^(?P<family>.+)-(?:train|eval|test|heldout|val|valid)-\d+$")


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0.0, 1.0) when n is 0 (nothing is known)."""
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at p = 0 or 1 the bound is exact in theory; keep float rounding from leaving [0, 1] or the point
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def task_family(task_id: str) -> str:
    """The family of a task id: the synthetic corpora name tasks <family>-<split>-<n>; other ids are their own."""
    m = _SYNTH_ID.match(task_id)
    return m.group("family") if m else task_id


@dataclass(frozen=True, slots=True)
class RateSummary:
    """What one row of the report says about a set of attempts."""

    solve_rate: float
    ci95: tuple[float, float]
    attempts: int        # scored attempts (infra errors excluded)
    resolved: int
    mean_reward: float
    infra_errors: int

    def as_dict(self) -> dict[str, Any]:
        return {"resolve_rate": self.solve_rate, "ci95": list(self.ci95), "attempts": self.attempts,
                "resolved": self.resolved, "mean_reward": self.mean_reward, "infra_errors": self.infra_errors}


def rate_summary(outcomes: Iterable[AttemptOutcome]) -> RateSummary:
    """Solve rate, its Wilson 95% interval and mean reward over scored attempts; infra errors counted apart."""
    scored, resolved, reward_sum, infra = 0, 0, 0.0, 0
    for o in outcomes:
        if o.is_infra_error:
            infra += 1
            continue
        scored += 1
        resolved += o.resolved
        reward_sum += o.reward
    rate = resolved / scored if scored else 0.0
    return RateSummary(rate, wilson_interval(resolved, scored), scored, resolved,
                       reward_sum / scored if scored else 0.0, infra)


def by_family(outcomes: Iterable[AttemptOutcome], family_of: Callable[[str], str]) -> dict[str, RateSummary]:
    """One summary per task family, families sorted by name."""
    groups: dict[str, list[AttemptOutcome]] = {}
    for o in outcomes:
        groups.setdefault(family_of(o.task_id), []).append(o)
    return {name: rate_summary(groups[name]) for name in sorted(groups)}


def family_lookup(families: Mapping[str, str]) -> Callable[[str], str]:
    """task id -> family: the task's own metadata where it names one, else the id's synthetic pattern."""
    return lambda task_id: families.get(task_id) or task_family(task_id)


def spread(values: Iterable[int]) -> dict[str, float]:
    """Median, 90th percentile (nearest rank), least and most of counts ({} when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return {}
    n, mid = len(ordered), len(ordered) // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"median": float(median), "p90": float(ordered[math.ceil(0.9 * n) - 1]), "min": float(ordered[0]),
            "max": float(ordered[-1])}


def episode_shape(outcomes: Iterable[AttemptOutcome]) -> dict[str, dict[str, float]]:
    """Turns and TITO segments per scored episode (`spread` of each); segments only where they were recorded."""
    scored = [o for o in outcomes if not o.is_infra_error]
    return {"turns": spread(o.turns for o in scored), "segments": spread(o.segments for o in scored if o.segments)}


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


@dataclass(frozen=True, slots=True)
class EvalSummary:
    """The one summary of an eval job a run reports: the job's numbers (resolve rate, mean reward, pass@k, infra
    errors, tasks), the solve rate with its Wilson 95% interval over scored attempts, the same per task family, and
    the turns and segments per episode."""

    job_id: str
    state: str
    job: JobSummaryValues
    overall: RateSummary
    by_family: dict[str, RateSummary]
    shape: dict[str, dict[str, float]] = field(default_factory=dict)  # episode_shape: turns and segments per episode

    def as_dict(self) -> dict[str, Any]:
        """The summary as report.json and the run log's `eval` records carry it."""
        return {"job_id": self.job_id, "resolve_rate": self.job.resolve_rate, "mean_reward": self.job.mean_reward,
                "pass_at_k": self.job.pass_at_k, "infra_errors": self.job.infra_errors,
                "num_tasks": self.job.num_tasks, "ci95": list(self.overall.ci95), "ci_method": CI_METHOD,
                "attempts": self.overall.attempts, "resolved": self.overall.resolved, "state": self.state,
                **self.shape,
                "by_family": {f: r.as_dict() for f, r in self.by_family.items()}}


def eval_summary(job_id: str, state: str, job: JobSummaryValues, outcomes: Iterable[AttemptOutcome],
                 family_of: Callable[[str], str]) -> EvalSummary:
    """The summary of a finished job from its numbers and its attempts (pure)."""
    outcomes = list(outcomes)
    return EvalSummary(job_id, state, job, rate_summary(outcomes), by_family(outcomes, family_of),
                       episode_shape(outcomes))
