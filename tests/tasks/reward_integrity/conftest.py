"""The reward-integrity tests' provider: a local one (tests/docker/test_docker_reward_integrity.py gives a docker
one)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from tasks.reward_integrity.attacks import HARBOR_BASE


@pytest.fixture(params=[pytest.param(True, id="overlay"), pytest.param(False, id="readonly", marks=pytest.mark.slow)])
async def provider(request: pytest.FixtureRequest, sandbox_root: Path) -> AsyncIterator[LocalProvider]:
    """The local provider with the copy-on-write root (the default) and, in the slow suite, the read-only root."""
    prov = LocalProvider(
        LocalProviderConfig(root=sandbox_root, overlay=request.param), ShellConfig(command_timeout_s=120.0)
    )
    yield prov
    await prov.close()


@pytest.fixture
def harbor_base() -> str:
    """The base image of the Harbor attack tasks (the docker suite gives its own engine's)."""
    return HARBOR_BASE
