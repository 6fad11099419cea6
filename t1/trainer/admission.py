"""What the trainer admits: a trajectory checked against the model it will train, before it is acknowledged.

`validate_trajectory` (t1/trainer/validation.py) checks a record's own consistency; this adds what
only the model knows and what a hostile or broken sampler could send: token ids inside the
embedding table, behaviour logprobs finite and <= 0, policy versions that exist, rewards finite
and bounded, routing ids below the expert count. A record refused here gets ACK_STATUS_REJECTED
with the reason and never reaches the buffer, so it can never crash a step after a restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from t1.trainer.validation import RoutingSpec, validate_trajectory
from t1.trajectory.types import EpisodeStatus, Trajectory

# float32 log-softmax of the most likely token can round a hair above 0.
LOGPROB_SLACK = 1e-4


@dataclass(frozen=True, slots=True)
class ModelBounds:
    """What the trainer's model can take: its embedding rows, its MoE routing shape, the reward bound."""

    vocab_size: int
    routing: RoutingSpec | None = None
    max_abs_reward: float = 1e6


def _check_reward(value: float, bound: float, where: str) -> None:
    if not math.isfinite(value) or abs(value) > bound:
        raise ValueError(f"{where}: reward {value} is not finite or exceeds {bound:g} in magnitude "
                         "(limits.max_abs_reward)")


def check_admissible(traj: Trajectory, bounds: ModelBounds) -> None:
    """Raise ValueError naming the first field the model cannot train on."""
    validate_trajectory(traj, bounds.routing)
    _check_reward(traj.reward, bounds.max_abs_reward, f"trajectory {traj.id}")
    if traj.status == EpisodeStatus.INFRA_ERROR:
        return  # only completes its group; its contents never reach a batch
    for i, seg in enumerate(traj.segments):
        where = f"trajectory {traj.id} segment {i}"
        ids = seg.token_ids
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= bounds.vocab_size):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise ValueError(f"{where}: token id {bad} is outside the model's vocabulary [0, {bounds.vocab_size})")
        lp = seg.logprobs[~np.isnan(seg.logprobs)]
        if lp.size and (not np.isfinite(lp).all() or float(lp.max()) > LOGPROB_SLACK):
            worst = lp[~np.isfinite(lp)][0] if not np.isfinite(lp).all() else float(lp.max())
            raise ValueError(f"{where}: behaviour logprob {worst} is not a log-probability (finite and <= 0)")
        mask = seg.loss_mask.astype(bool)
        if mask.any() and int(seg.policy_versions[mask].min()) < 0:
            raise ValueError(f"{where}: a loss-mask token has policy version "
                             f"{int(seg.policy_versions[mask].min())} (must be >= 0)")
        for span in seg.turns:
            _check_reward(span.reward, bounds.max_abs_reward, f"{where} turn [{span.start}, {span.end})")
