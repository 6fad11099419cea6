"""A private Docker engine per test session, with the locally made base image.

Where the engine cannot run the tests skip and say why, except under T1_REQUIRE_DOCKER=1 (CI sets it):
there they fail, so a green CI means the docker provider's tests ran.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from private_dockerd import DockerdUnavailable, PrivateDockerd, docker_config

from t1.config.sandbox import ShellConfig
from t1.sandbox.docker.docker_provider import DockerProvider
from t1.tasks.image.docker_build import EnvironmentBuilder


@pytest.fixture(scope="session")
def dockerd() -> Iterator[PrivateDockerd]:
    engine = PrivateDockerd(Path(tempfile.mkdtemp(prefix="t1-dockerd-")))
    try:
        engine.start()
    except DockerdUnavailable as exc:
        if os.environ.get("T1_REQUIRE_DOCKER") == "1":
            pytest.fail(f"no private Docker engine, and T1_REQUIRE_DOCKER=1: {exc}")
        pytest.skip(f"no private Docker engine: {exc}")
    try:
        engine.import_base_image()
        yield engine
    finally:
        engine.stop()


@pytest.fixture
async def docker_provider(dockerd: PrivateDockerd) -> AsyncIterator[DockerProvider]:
    provider = DockerProvider(docker_config(dockerd, memory_mb=256, pids=64), ShellConfig(command_timeout_s=30),
                              images=EnvironmentBuilder)
    try:
        yield provider
    finally:
        await provider.close()
