"""Where tasks come from: named sets or folders for eval jobs, and an endless shuffled stream for training."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from t1.config.tasks import TasksConfig
from t1.tasks.dataset import load_dataset, load_named_set
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
