"""From trajectories to training sequences: infra-error policy, staleness bound, reward placement.
Pure functions over values (micro-batches: t1.trainer.packing; record checks: t1.trainer.validation).

A training sequence is one segment. Per-position arrays have the segment's length N; position t
holds what belongs to token t (its behaviour logprob, its reward, later its value, advantage).
The model reads inputs token_ids[:-1] and predicts targets token_ids[1:], so position 0 is never
an action and the last token's routing row is never used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from t1.trainer.advantages import place_rewards
from t1.trajectory.types import EpisodeStatus, Trajectory, TurnSpan

InfraPolicy = Literal["drop_group", "drop_attempt"]


@dataclass(frozen=True, slots=True, eq=False)
class TrainSequence:
    """One segment ready for the trainer."""

    trajectory_id: str
    group_id: str
    segment: int
    token_ids: np.ndarray       # int32 [N]
    behav_logp: np.ndarray      # float32 [N], NaN off the loss mask
    loss_mask: np.ndarray       # bool [N], stale tokens already removed
    versions: np.ndarray        # int32 [N]
    routing: np.ndarray | None  # [N, layers, top_k]
    rewards: np.ndarray         # float32 [N]
    turn_ids: np.ndarray | None = None  # int32 [N]: the episode's generation (turn) each token was sampled in, -1: none

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What batching dropped, and how old the kept tokens are."""

    num_trajectories: int = 0
    num_sequences: int = 0
    num_action_tokens: int = 0
    dropped_stale_tokens: int = 0
    dropped_infra_trajectories: int = 0
    dropped_groups: int = 0
    policy_lag_mean: float = 0.0
    policy_lag_max: int = 0
    reward_mean: float = 0.0
    solve_rate: float = 0.0  # kept trajectories whose verifiers all passed
    group_ids: tuple[str, ...] = field(default=())


def apply_infra_policy(group: Sequence[Trajectory], policy: InfraPolicy) -> list[Trajectory]:
    """The attempts of a group that may enter a batch (infra_error ones never do)."""
    failed = [t for t in group if t.status == EpisodeStatus.INFRA_ERROR]
    if failed and policy == "drop_group":
        return []
    return [t for t in group if t.status != EpisodeStatus.INFRA_ERROR]


def stale_mask(versions: np.ndarray, loss_mask: np.ndarray, current_version: int, max_lag: int) -> np.ndarray:
    """True on loss tokens sampled more than max_lag versions before current_version."""
    return loss_mask & ((current_version - versions.astype(np.int64)) > max_lag)


def build_sequences(
    groups: Sequence[Sequence[Trajectory]], current_version: int, max_lag: int,
    infra_policy: InfraPolicy, process_rewards: bool,
) -> tuple[list[TrainSequence], BatchStats]:
    """Turn complete groups into training sequences; stale tokens leave the loss mask and are counted."""
    seqs: list[TrainSequence] = []
    dropped_stale = dropped_infra = dropped_groups = 0
    lags: list[np.ndarray] = []
    rewards: list[float] = []
    solved: list[bool] = []
    num_traj = 0
    for group in groups:
        kept = apply_infra_policy(group, infra_policy)
        dropped_infra += sum(t.status == EpisodeStatus.INFRA_ERROR for t in group)
        if not kept:
            dropped_groups += 1
            continue
        for traj in kept:
            num_traj += 1
            rewards.append(traj.reward)
            solved.append(0 < traj.verifier.total == traj.verifier.passed)
            masks = [s.loss_mask.astype(bool) for s in traj.segments]
            placed = place_rewards(masks, [s.turns for s in traj.segments], traj.reward, process_rewards)
            first_turn = 0
            for i, (seg, mask, rew) in enumerate(zip(traj.segments, masks, placed, strict=True)):
                stale = stale_mask(seg.policy_versions, mask, current_version, max_lag)
                dropped_stale += int(stale.sum())
                keep = mask & ~stale
                lags.append(current_version - seg.policy_versions[keep].astype(np.int64))
                seqs.append(TrainSequence(
                    trajectory_id=traj.id, group_id=traj.group_id, segment=i,
                    token_ids=np.asarray(seg.token_ids, dtype=np.int32),
                    behav_logp=np.asarray(seg.logprobs, dtype=np.float32),
                    loss_mask=keep, versions=np.asarray(seg.policy_versions, dtype=np.int32),
                    routing=seg.routing, rewards=rew, turn_ids=turn_ids(seg.turns, len(mask), first_turn),
                ))
                first_turn += len(seg.turns)
    all_lags = np.concatenate(lags) if lags else np.zeros(0, dtype=np.int64)
    stats = BatchStats(
        num_trajectories=num_traj, num_sequences=len(seqs),
        num_action_tokens=int(sum(int(s.loss_mask.sum()) for s in seqs)),
        dropped_stale_tokens=dropped_stale, dropped_infra_trajectories=dropped_infra,
        dropped_groups=dropped_groups,
        policy_lag_mean=float(all_lags.mean()) if all_lags.size else 0.0,
        policy_lag_max=int(all_lags.max()) if all_lags.size else 0,
        reward_mean=float(np.mean(rewards)) if rewards else 0.0,
        solve_rate=float(np.mean(solved)) if solved else 0.0,
        group_ids=tuple(dict.fromkeys(g[0].group_id for g in groups if g)),
    )
    return seqs, stats


def turn_ids(turns: Sequence[TurnSpan], length: int, first: int) -> np.ndarray:
    """int32 [length]: the episode-wide index of the turn (generation) each position was sampled in, the segment's
    turns numbered from `first`; -1 outside every turn."""
    out = np.full(length, -1, np.int32)
    for k, span in enumerate(turns):
        out[span.start:span.end] = first + k
    return out
