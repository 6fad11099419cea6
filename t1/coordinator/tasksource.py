"""Where tasks come from: named sets or folders for eval jobs, and an endless shuffled stream for training.

With several coordinators (`coordinator.shard`), each trains on its own part of the training
tasks: `shard_tasks` deals the tasks, ordered by a hash of their ids, round-robin to the shards,
so the parts are disjoint, cover every task, differ in size by at most one, and are the same on
every restart and on every coordinator (nothing to coordinate). A group is launched by the one
coordinator owning its task, so groups never straddle coordinators.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from t1.config.coordinator import ShardConfig
from t1.config.tasks import TasksConfig
from t1.tasks.formats.dataset import load_dataset, load_named_set
from t1.tasks.spec import TaskSpec


def make_resolver(cfg: TasksConfig):  # -> TaskResolver
    """`resolve(tasks, task_ids)`: a name in tasks.sets or a folder path; unknown ids are an error."""

    def resolve(tasks: str, task_ids: Sequence[str]) -> list[TaskSpec]:
        specs = load_named_set(cfg, tasks) if tasks in cfg.sets else load_dataset([Path(tasks)])
        if not task_ids:
            return specs
        by_id = {s.id: s for s in specs}
        missing = [t for t in task_ids if t not in by_id]
        if missing:
            raise KeyError(f"task ids not in {tasks!r}: {', '.join(missing)}")
        return [by_id[t] for t in task_ids]

    return resolve


def training_stream(tasks: Sequence[TaskSpec], seed: int) -> Iterator[TaskSpec]:
    """Epochs over the training tasks, each in a fresh seeded order."""
    if not tasks:
        raise ValueError("no training tasks: tasks.train names no set with tasks in it")
    rng = random.Random(seed)
    while True:
        order = list(tasks)
        rng.shuffle(order)
        yield from order


def shard_tasks(tasks: Sequence[TaskSpec], shard: ShardConfig) -> list[TaskSpec]:
    """The training tasks shard `shard.index` of `shard.count` owns (pure; see the module docstring)."""
    if shard.count == 1:
        return list(tasks)
    if len(tasks) < shard.count:
        raise ValueError(f"coordinator.shard.count is {shard.count} but tasks.train has only {len(tasks)} tasks: "
                         "every shard needs at least one")
    ordered = sorted(tasks, key=lambda t: (hashlib.sha256(t.id.encode()).digest(), t.id))
    return ordered[shard.index::shard.count]
