"""Issue 22: `coordinator.shard` deals the training tasks to coordinators deterministically, disjoint and
covering, and group ids carry the shard (globally unique across coordinators)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from coordproc import write_harbor_task

from t1.config.coordinator import ShardConfig
from t1.config.loader import ConfigError, validate
from t1.coordinator.rollout.runner import new_group_id
from t1.coordinator.tasksource import shard_tasks
from t1.tasks.formats.dataset import load_task


@pytest.fixture
def tasks(tmp_path: Path) -> list:
    base = load_task(write_harbor_task(tmp_path / "tasks", "t", "w"))
    return [dataclasses.replace(base, id=f"task-{i:02d}") for i in range(11)]


def test_shards_are_disjoint_cover_every_task_and_do_not_change(tasks: list) -> None:
    parts = [shard_tasks(tasks, ShardConfig(index=i, count=3)) for i in range(3)]
    ids = [[t.id for t in p] for p in parts]
    assert sorted(i for p in ids for i in p) == sorted(t.id for t in tasks), "every task in exactly one shard"
    assert sorted(len(p) for p in ids) == [3, 4, 4]
    again = [[t.id for t in shard_tasks(list(reversed(tasks)), ShardConfig(index=i, count=3))] for i in range(3)]
    assert again == ids, "the same partition whatever order the set was read in (a restart, another pod)"
    assert [t.id for t in shard_tasks(tasks, ShardConfig())] == [t.id for t in tasks]
    with pytest.raises(ValueError, match=r"count is 12 but tasks\.train has only 11"):
        shard_tasks(tasks, ShardConfig(index=0, count=12))


def test_group_ids_name_their_shard(tasks: list) -> None:
    gid = new_group_id(tasks[0], ShardConfig(index=1, count=2))
    assert gid.startswith("task-00-s1-") and gid != new_group_id(tasks[0], ShardConfig(index=1, count=2))
    assert "-s0-" not in new_group_id(tasks[0], ShardConfig())


def test_a_shard_index_outside_the_count_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as err:
        validate({"coordinator": {"shard": {"index": 2, "count": 2}}})
    assert "coordinator.shard" in str(err.value) and "index 2 must be below count 2" in str(err.value)
