"""Fixtures of the coordinator tests: small Harbor task folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from coordproc import write_harbor_task


@pytest.fixture()
def task_root(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    for i, word in enumerate(["alpha", "beta", "gamma"]):
        write_harbor_task(root, f"task-{i}", word)
    return root
