"""Results math: unbiased pass@k against brute-force enumeration, resolve rate without infra errors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from t1.evals.results import AttemptOutcome, pass_at_k, resolve_rate, summarize
from t1.trajectory.types import EpisodeStatus as S


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of k-subsets of n attempts (c successes) that contain at least one success."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_enumeration(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k))


def test_pass_at_k_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def _o(task: str, attempt: int, resolved: bool, status: S = S.OK, reward: float | None = None) -> AttemptOutcome:
    r = float(resolved) if reward is None else reward
    return AttemptOutcome(task, attempt, r, int(resolved), 1, status, resolved=resolved)


def test_infra_errors_are_counted_not_scored() -> None:
    outs = [_o("a", 0, True), _o("a", 1, False), _o("b", 0, False, S.INFRA_ERROR, reward=0.0),
            _o("b", 1, True, S.TIMEOUT)]
    assert resolve_rate(outs) == pytest.approx(2 / 3)
    s = summarize(outs, attempts_per_task=2)
    assert s.infra_errors == 1 and s.num_tasks == 2
    assert s.mean_reward == pytest.approx(2 / 3)
    # Task b has one scored attempt: it counts for pass@1 only.
    assert s.pass_at_k == {1: pytest.approx((0.5 + 1.0) / 2), 2: pytest.approx(1.0)}
    assert summarize([_o("a", 0, False, S.INFRA_ERROR)], attempts_per_task=1).pass_at_k == {}
    assert resolve_rate([]) == 0.0
