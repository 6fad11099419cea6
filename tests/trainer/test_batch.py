"""Batching: infra-error policy, staleness bound, micro-batches; the durable buffer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trainer_synth import segment, trajectory

from t1.trainer.batch import build_sequences
from t1.trainer.buffer import StepRecord, TrajectoryBuffer
from t1.trajectory.types import EpisodeStatus


def _group(name: str, infra: bool = False) -> list:
    ok = trajectory(f"{name}-0", name, [segment([5, 6, 7, 8], 2)], reward=1.0)
    other = trajectory(f"{name}-1", name, [segment([5, 6, 9, 9], 2)], reward=0.0,
                       status=EpisodeStatus.INFRA_ERROR if infra else EpisodeStatus.OK)
    return [ok, other]


def test_infra_error_attempts_never_enter_a_batch() -> None:
    groups = [_group("a", infra=True), _group("b")]
    seqs, stats = build_sequences(groups, 0, 4, "drop_attempt", process_rewards=False)
    assert [s.trajectory_id for s in seqs] == ["a-0", "b-0", "b-1"]
    assert stats.dropped_infra_trajectories == 1 and stats.dropped_groups == 0
    seqs, stats = build_sequences(groups, 0, 4, "drop_group", process_rewards=False)
    assert [s.trajectory_id for s in seqs] == ["b-0", "b-1"]
    assert stats.dropped_groups == 1


def test_tokens_older_than_max_policy_lag_are_dropped_and_counted() -> None:
    seg = segment([1, 2, 3, 4, 5], 2)
    seg.policy_versions[2:] = [2, 3, 5]   # lags 3, 2, 0 at current version 5
    traj = trajectory("t", "g", [seg], reward=1.0)
    seqs, stats = build_sequences([[traj]], current_version=5, max_lag=2, infra_policy="drop_attempt",
                                  process_rewards=False)
    np.testing.assert_array_equal(seqs[0].loss_mask, [False, False, False, True, True])
    assert stats.dropped_stale_tokens == 1
    assert stats.policy_lag_mean == pytest.approx(1.0) and stats.policy_lag_max == 2
    np.testing.assert_array_equal(seqs[0].rewards, [0, 0, 0, 0, 1])


def test_buffer_is_durable_idempotent_and_consumes_only_on_commit(tmp_path: Path) -> None:
    db = tmp_path / "buffer.sqlite"
    buf = TrajectoryBuffer(db)
    assert buf.add("a", "g1", b"x") and buf.add("b", "g1", b"y") and buf.add("c", "g2", b"z")
    assert not buf.add("a", "g1", b"x")
    assert [g for g, _ in buf.complete_groups(2, 10)] == ["g1"]
    assert buf.counts(2) == {"accepted": 3, "pending": 3, "groups": 1, "quarantined": 0}
    buf.close()
    buf = TrajectoryBuffer(db)  # reopen: everything acknowledged is still there
    groups = buf.complete_groups(2, 10)
    assert groups == [("g1", [("a", b"x"), ("b", b"y")])]
    buf.commit_steps([StepRecord(1, "ppo", 1, ("a", "b"), {"loss": 0.5})], {"step": 1})
    assert buf.complete_groups(2, 10) == []
    assert not buf.add("a", "g1", b"x")  # trained ids stay known
    assert buf.meta() == {"step": 1}
    assert buf.steps()[0].trajectory_ids == ("a", "b")
    assert buf.counts(1) == {"accepted": 3, "pending": 1, "groups": 1, "quarantined": 0}
    buf.close()


def test_solve_rate_counts_kept_trajectories_whose_verifiers_all_passed() -> None:
    from dataclasses import replace

    from t1.trajectory.types import VerifierSummary

    solved, partial, infra = _group("s", infra=True)[0], *_group("p", infra=True)
    groups = [[replace(solved, verifier=VerifierSummary(2, 2)), replace(partial, verifier=VerifierSummary(1, 2))],
              [replace(infra, verifier=VerifierSummary(2, 2))]]  # an infra error is never scored
    _, stats = build_sequences(groups, 0, 4, "drop_attempt", process_rewards=False)
    assert stats.solve_rate == 0.5
