"""Demonstrations for the SFT warm-start stage: oracle runs in TITO form, read from spool files.

A demonstration is an ordinary trajectory record (the oracle's solution run through the rollout
path); SFT trains on its loss-mask tokens. demos_path is one file of concatenated records or a
folder of such files (*.msgpack, read in name order).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from t1.trainer.batch import TrainSequence
from t1.trainer.validation import validate_trajectory
from t1.trajectory.serialization import iter_trajectories
from t1.trajectory.types import EpisodeStatus


def demo_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.glob("*.msgpack") if p.is_file())
        if files:
            return files
        raise FileNotFoundError(f"trainer.warm_start.demos_path: no *.msgpack files in {path}")
    raise FileNotFoundError(f"trainer.warm_start.demos_path: {path} does not exist")


class Demo(NamedTuple):
    """One segment of a demonstration and the task it solved."""

    task_id: str
    seq: TrainSequence


def load_demos(path: Path) -> list[Demo]:
    """Every segment of every non-infra-error demonstration, as SFT sequences."""
    seqs: list[Demo] = []
    for f in demo_files(path):
        with f.open("rb") as fh:
            for traj in iter_trajectories(fh):
                if traj.status == EpisodeStatus.INFRA_ERROR:
                    continue
                validate_trajectory(traj)
                for i, seg in enumerate(traj.segments):
                    n = seg.num_tokens
                    seqs.append(Demo(traj.task_id, TrainSequence(
                        trajectory_id=traj.id, group_id=traj.group_id, segment=i,
                        token_ids=np.asarray(seg.token_ids, dtype=np.int32),
                        behav_logp=np.asarray(seg.logprobs, dtype=np.float32),
                        loss_mask=seg.loss_mask.astype(bool), versions=np.asarray(seg.policy_versions, dtype=np.int32),
                        routing=seg.routing, rewards=np.zeros(n, dtype=np.float32),
                    )))
    if not seqs:
        raise ValueError(f"trainer.warm_start.demos_path: {path} holds no usable demonstration")
    return seqs


def ptx_demos(demos: list[Demo], skip_tasks: str | None) -> list[TrainSequence]:
    """The segments PPO-ptx trains on: every demonstration's, less those of tasks `skip_tasks` matches
    (rl.ptx_skip_tasks)."""
    if skip_tasks is None:
        return [d.seq for d in demos]
    pattern = re.compile(skip_tasks)
    kept = [d.seq for d in demos if not pattern.search(d.task_id)]
    if demos and not kept:
        raise ValueError(f"trainer.rl.ptx_skip_tasks {skip_tasks!r} matches every demonstration's task "
                         f"({len({d.task_id for d in demos})} tasks): PPO-ptx would have none left")
    return kept
