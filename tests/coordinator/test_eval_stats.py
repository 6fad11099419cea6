"""The report's statistics: Wilson 95% intervals, infra errors excluded from rates, per-family rows."""

from __future__ import annotations

import math

import pytest

from t1.evals.results import AttemptOutcome
from t1.evals.stats import (
    by_family,
    episode_shape,
    family_lookup,
    intervals_overlap,
    rate_summary,
    spread,
    task_family,
    wilson_interval,
)
from t1.trajectory.types import EpisodeStatus


def _o(task: str, resolved: bool, reward: float | None = None, infra: bool = False, attempt: int = 0) -> AttemptOutcome:
    status = EpisodeStatus.INFRA_ERROR if infra else EpisodeStatus.OK
    return AttemptOutcome(task, attempt, reward if reward is not None else float(resolved), 0, 1, status,
                          resolved=resolved and not infra)


@pytest.mark.parametrize(("k", "n", "lo", "hi"), [
    (0, 10, 0.0, 0.27753),      # reference values of the Wilson score interval, z = 1.96
    (5, 10, 0.23659, 0.76341),
    (10, 10, 0.72247, 1.0),
    (81, 263, 0.25529, 0.36621),
    (1, 1, 0.20654, 1.0),
])
def test_wilson_interval_matches_reference_values(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=5e-5)
    assert got[0] <= k / n <= got[1]


def test_wilson_interval_narrows_with_attempts_and_rejects_nonsense() -> None:
    widths = [hi - lo for lo, hi in (wilson_interval(n // 4, n) for n in (8, 40, 200, 1000))]
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.06
    assert wilson_interval(0, 0) == (0.0, 1.0)  # nothing measured: nothing known
    for k, n in ((3, 2), (-1, 5)):
        with pytest.raises(ValueError, match="0 <= successes <= n"):
            wilson_interval(k, n)


def test_rate_summary_excludes_infra_errors_from_rate_reward_and_attempts() -> None:
    outcomes = [_o("a", True), _o("a", False, 0.5), _o("b", True), _o("b", False, infra=True),
                _o("b", True, infra=True)]  # an infra error that claims success counts for nothing
    s = rate_summary(outcomes)
    assert (s.attempts, s.resolved, s.infra_errors) == (3, 2, 2)
    assert s.solve_rate == pytest.approx(2 / 3) and s.mean_reward == pytest.approx(2.5 / 3)
    assert s.ci95 == wilson_interval(2, 3)
    d = s.as_dict()
    assert d["resolve_rate"] == s.solve_rate and d["ci95"] == list(s.ci95) and d["attempts"] == 3


def test_rate_summary_of_only_infra_errors_is_empty_not_a_zero_division() -> None:
    s = rate_summary([_o("a", False, infra=True)])
    assert (s.attempts, s.solve_rate, s.mean_reward, s.infra_errors, s.ci95) == (0, 0.0, 0.0, 1, (0.0, 1.0))


def test_by_family_groups_by_metadata_then_by_the_synthetic_id_pattern() -> None:
    outcomes = [_o("count-lines-eval-7", True), _o("count-lines-eval-9", False), _o("grep-val-eval-3", True),
                _o("hello-world", False), _o("custom-42", True)]
    fam = family_lookup({"custom-42": "from-metadata", "hello-world": ""})
    rows = by_family(outcomes, fam)
    assert list(rows) == ["count-lines", "from-metadata", "grep-val", "hello-world"]
    assert rows["count-lines"].attempts == 2 and rows["count-lines"].solve_rate == 0.5
    assert sum(r.attempts for r in rows.values()) == rate_summary(outcomes).attempts
    assert task_family("sqlite-train-2000008") == "sqlite" and task_family("x-heldout-1") == "x"
    assert task_family("plain") == "plain"


def test_intervals_overlap() -> None:
    assert intervals_overlap((0.1, 0.3), (0.3, 0.5)) and not intervals_overlap((0.1, 0.29), (0.3, 0.5))
    assert intervals_overlap((0.2, 0.4), (0.25, 0.3))
    assert not math.isnan(wilson_interval(200, 200)[0])


def test_eval_summary_is_one_value_with_the_reports_layout() -> None:
    """3 scored attempts of two families (2 resolved, rewards 1, 1, 0.5) and one infra error, by hand."""
    from t1.evals.results import summarize
    from t1.evals.stats import eval_summary

    outcomes = [_o("files-eval-1", True), _o("files-eval-1", True, attempt=1), _o("logs-eval-2", False, reward=0.5),
                _o("logs-eval-2", False, infra=True, attempt=1)]
    s = eval_summary("job-1", "succeeded", summarize(outcomes, 2), outcomes, task_family)
    d = s.as_dict()
    assert list(d) == ["job_id", "resolve_rate", "mean_reward", "pass_at_k", "infra_errors", "num_tasks", "ci95",
                       "ci_method", "attempts", "resolved", "state", "turns", "segments", "by_family"]
    assert (d["job_id"], d["state"], d["ci_method"], d["attempts"], d["resolved"]) == (
        "job-1",
        "succeeded",
        "wilson",
        3,
        2,
    )
    assert d["resolve_rate"] == pytest.approx(2 / 3) and d["mean_reward"] == pytest.approx(2.5 / 3)
    assert d["pass_at_k"] == pytest.approx({1: 0.5, 2: 1.0})  # files: 2 of 2; logs: 0 of 1 (no k=2 row)
    assert (d["infra_errors"], d["num_tasks"]) == (1, 2)
    assert d["ci95"] == pytest.approx(list(wilson_interval(2, 3)))
    assert d["by_family"]["files"]["resolve_rate"] == 1.0 and d["by_family"]["logs"]["infra_errors"] == 1
    assert d["by_family"]["logs"]["attempts"] == 1 and d["by_family"]["logs"]["mean_reward"] == 0.5


def test_spread_is_median_nearest_rank_p90_min_and_max() -> None:
    # 10 values sorted 1..10: median (5 + 6) / 2, p90 the 9th (ceil(0.9 * 10)); 3 values: the middle and the last
    assert spread([10, 1, 9, 2, 8, 3, 7, 4, 6, 5]) == {"median": 5.5, "p90": 9.0, "min": 1.0, "max": 10.0}
    assert spread([4, 30, 12]) == {"median": 12.0, "p90": 30.0, "min": 4.0, "max": 30.0}
    assert spread([]) == {}


def test_episode_shape_counts_scored_episodes_and_recorded_segments_only() -> None:
    from dataclasses import replace

    outcomes = [replace(_o("a-eval-1", True), turns=20, segments=5),
                replace(_o("a-eval-2", False), turns=13, segments=3),
                replace(_o("a-eval-3", False, infra=True), turns=2, segments=1),  # an infra error: not counted
                replace(_o("a-eval-4", True), turns=30)]  # segments 0: an older store's row, not recorded
    shape = episode_shape(outcomes)
    assert shape["turns"] == {"median": 20.0, "p90": 30.0, "min": 13.0, "max": 30.0}
    assert shape["segments"] == {"median": 4.0, "p90": 5.0, "min": 3.0, "max": 5.0}
