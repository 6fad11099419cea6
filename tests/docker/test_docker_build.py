"""`docker build` of a task's environment/Dockerfile by the private engine: cache, lock, reports.

The vendored real task `harbor/simple-task` builds `FROM ubuntu:24.04`; nothing can be pulled
here, so the locally made base image is tagged with that name on the private engine first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from private_dockerd import BASE_IMAGE, PrivateDockerd, docker_config
from test_docker_real_task import REAL, offline_copy, sets

from t1.config.sandbox import ShellConfig
from t1.sandbox.docker.docker_provider import DockerProvider
from t1.sandbox.needs import NeedsImageError
from t1.sandbox.types import SandboxRequest
from t1.tasks.formats.dataset import load_task
from t1.tasks.image.docker_build import (
    BuiltImage,
    EnvironmentBuilder,
    base_images,
    built_image,
    context_digest,
    env_tag,
)
from t1.tasks.provision import sandbox_request
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task

UBUNTU = "ubuntu:24.04"


@pytest.fixture
def ubuntu(dockerd: PrivateDockerd) -> Iterator[str]:
    """The base image under the FROM name simple-task uses (removed after: other tests expect it absent)."""
    with contextlib.closing(dockerd.client()) as client:
        client.images.get(BASE_IMAGE).tag(UBUNTU)
        try:
            yield UBUNTU
        finally:
            for image in client.images.list(filters={"label": "t1.environment"}):
                client.images.remove(image.id, force=True)
            client.images.remove(UBUNTU)


def env_images(dockerd: PrivateDockerd) -> list[str]:
    with contextlib.closing(dockerd.client()) as client:
        return sorted(tag for image in client.images.list(filters={"label": "t1.environment"}) for tag in image.tags)


def test_base_images_of_a_dockerfile(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG V=3.12\nFROM python:${V}-slim AS build\nRUN true\nFROM build AS again\n"
                          "FROM --platform=linux/amd64 debian:12\nFROM scratch\n")
    assert base_images(dockerfile) == ["python:3.12-slim", "debian:12"]


def test_a_dockerfile_task_asks_for_a_build_and_its_storage(tmp_path: Path) -> None:
    spec = load_task(REAL / "harbor" / "simple-task")
    request = sandbox_request(spec)
    assert request.build_context == REAL / "harbor" / "simple-task" / "environment" and request.docker_image is None
    assert (request.storage_mb, request.memory_mb, request.cpus) == (10240, 2048, 1)
    pinned = offline_copy(REAL / "harbor" / "simple-task", tmp_path, 'docker_image = "t1-pinned:1"\n')
    assert sandbox_request(load_task(pinned)).build_context is None  # a pinned image is never built


def test_what_a_built_image_sets_for_the_shells() -> None:
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
              "WorkingDir": "/srv", "User": ""}
    assert built_image("t1-env:x", config) == BuiltImage("t1-env:x", "/srv", (("LANG", "C.UTF-8"),), None)
    conda = built_image("t1-env:y", {"Env": ["PATH=/opt/conda/bin:/usr/bin", "A=1=2"], "User": "app"})
    assert conda.env == (("PATH", "/opt/conda/bin:/usr/bin:$PATH"), ("A", "1=2")) and conda.user == "app"


def test_digest_follows_every_file_of_the_context(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("1")
    first = context_digest(tmp_path)
    assert context_digest(tmp_path) == first
    (tmp_path / "data" / "a.txt").write_text("2")
    assert context_digest(tmp_path) != first
    (tmp_path / "data" / "a.txt").write_text("1")
    (tmp_path / "data" / "a.txt").chmod(0o755)
    assert context_digest(tmp_path) != first


def test_real_task_builds_once_oracle_resolves_untouched_does_not(dockerd: PrivateDockerd, ubuntu: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from t1.cli.main import main

    task = offline_copy(REAL / "harbor" / "simple-task", tmp_path)
    assert f"FROM {ubuntu}\n" in (task / "environment" / "Dockerfile").read_text()
    tag = env_tag(context_digest(task / "environment"))
    assert main(["tasks", "oracle", str(task), *sets(dockerd)]) == 0
    oracle = json.loads(capsys.readouterr().out)
    assert oracle["resolved"] and oracle["status"] == "ok", oracle
    assert env_images(dockerd) == [tag]
    with contextlib.closing(dockerd.client()) as client:
        built_at = client.images.get(tag).attrs["Created"]
    assert main(["tasks", "verify", str(task), *sets(dockerd)]) == 0
    untouched = json.loads(capsys.readouterr().out)
    assert not untouched["resolved"] and untouched["status"] == "ok", untouched
    with contextlib.closing(dockerd.client()) as client:
        assert client.images.get(tag).attrs["Created"] == built_at  # the second run used the cache
        assert not client.containers.list(all=True)


async def test_concurrent_sandboxes_of_one_task_build_once(
    dockerd: PrivateDockerd, ubuntu: str, tmp_path: Path
) -> None:
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {ubuntu}\nRUN echo built > /built.txt\nENV T1_MARK=from-image\n"
                                        "WORKDIR /srv\n")
    provider = DockerProvider(docker_config(dockerd), ShellConfig(), images=EnvironmentBuilder)
    try:
        boxes = await asyncio.gather(*(provider.create(SandboxRequest(build_context=context)) for _ in range(2)))
        assert provider.builder is not None and provider.builder.builds == 1
        for box in boxes:
            seen = await (await box.open_shell()).run("cat /built.txt /run/t1-environment.json")
            assert seen.output.startswith("built\n") and '"T1_MARK": "from-image"' in seen.output, seen.output
            assert '"workdir": "/srv"' in seen.output
    finally:
        await provider.close()


async def test_missing_from_image_is_needs_image(dockerd: PrivateDockerd, tmp_path: Path) -> None:
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM t1-absent-base:7\nRUN true\n")
    provider = DockerProvider(docker_config(dockerd), ShellConfig(), images=EnvironmentBuilder)
    try:
        with pytest.raises(NeedsImageError, match=r"FROM t1-absent-base:7, which is not on the Docker engine"):
            await provider.create(SandboxRequest(build_context=context))
    finally:
        await provider.close()


async def test_failed_build_is_a_setup_report_with_the_log_tail(dockerd: PrivateDockerd, ubuntu: str,
                                                                tmp_path: Path) -> None:
    task = offline_copy(REAL / "harbor" / "simple-task", tmp_path)
    (task / "environment" / "Dockerfile").write_text(f"FROM {ubuntu}\nRUN echo t1-broken-step && exit 3\n")
    provider = DockerProvider(docker_config(dockerd), ShellConfig(), images=EnvironmentBuilder)
    try:
        run = await run_task(provider, load_task(task), RunMode.ORACLE)
    finally:
        await provider.close()
    assert run.status is RunStatus.SETUP_FAILED and not run.resolved, run.as_json()
    assert run.detail.startswith("task simple-task: docker build "
                                 "of") and "returned a non-zero code: 3" in run.detail, run.detail
    assert "t1-broken-step" in run.setup_output
    shutil.rmtree(task)
