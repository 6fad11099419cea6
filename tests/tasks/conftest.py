"""Fixtures of the task tests: the fixture task folders and a real local sandbox provider (bubblewrap behind SSH)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """A sandbox root other uids can traverse (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="t1-task-sbx-", dir="/tmp"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def provider(sandbox_root: Path) -> AsyncIterator[LocalProvider]:
    prov = LocalProvider(LocalProviderConfig(root=sandbox_root), ShellConfig(command_timeout_s=120.0))
    yield prov
    await prov.close()
