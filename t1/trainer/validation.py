"""Is a trajectory record consistent enough to train on: ids, per-token array shapes, turn spans,
the loss mask, behaviour logprobs, and routing that fits the trainer's model.

Pure checks that raise ValueError naming the segment and field; t1.trainer.admission adds what
only the model knows before a record is acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from t1.trajectory.types import EpisodeStatus, Trajectory


@dataclass(frozen=True, slots=True)
class RoutingSpec:
    """What the trainer's model expects of routing records."""

    num_layers: int
    top_k: int
    num_experts: int


def validate_trajectory(traj: Trajectory, routing: RoutingSpec | None = None) -> None:
    """Raise ValueError naming the problem when a record cannot be trained on."""
    if not traj.id:
        raise ValueError("trajectory id is empty")
    if not traj.group_id:
        raise ValueError(f"trajectory {traj.id}: group_id is empty")
    if traj.status == EpisodeStatus.INFRA_ERROR:
        return  # it only completes its group; its contents never reach a batch
    for i, seg in enumerate(traj.segments):
        n = seg.num_tokens
        where = f"trajectory {traj.id} segment {i}"
        for name in ("logprobs", "loss_mask", "policy_versions"):
            if getattr(seg, name).shape != (n,):
                raise ValueError(f"{where}: {name} has shape {getattr(seg, name).shape}, token_ids has {n} tokens")
        if seg.routing is not None and seg.routing.shape[0] != n:
            raise ValueError(f"{where}: routing has {seg.routing.shape[0]} rows for {n} tokens")
        if seg.routing is not None and routing is not None:
            _check_routing(seg.routing, routing, where)
        mask = seg.loss_mask.astype(bool)
        for span in seg.turns:
            if not 0 <= span.start <= span.end <= n:
                raise ValueError(f"{where}: turn span [{span.start}, {span.end}) is outside the {n} tokens")
            if span.reward != 0.0 and not mask[span.start:span.end].any():
                raise ValueError(f"{where}: turn [{span.start}, {span.end}) has a reward but no loss-mask token")
        if n and mask[0]:
            raise ValueError(f"{where}: loss_mask is set on position 0, which no model input predicts")
        if np.isnan(seg.logprobs[mask]).any():
            raise ValueError(f"{where}: a loss-mask token has no behaviour logprob (NaN)")


def _check_routing(arr: np.ndarray, spec: RoutingSpec, where: str) -> None:
    if arr.ndim != 3 or arr.shape[1:] != (spec.num_layers, spec.top_k):
        raise ValueError(f"{where}: routing shape {list(arr.shape)} does not fit the trainer's model "
                         f"([tokens, {spec.num_layers} MoE layers, top_k {spec.top_k}])")
    missing = (arr == np.iinfo(arr.dtype).max).all(axis=-1)
    present = arr[~missing]
    if present.size and int(present.max()) >= spec.num_experts:
        raise ValueError(f"{where}: routing names expert {int(present.max())}, the model has {spec.num_experts}")
