"""`docker build` of a task's environment by the engine, cached by the environment's digest.

A task with `environment/Dockerfile` and no `docker_image` runs in the image its Dockerfile
builds, as under Harbor. The image is tagged `t1-env:<digest>`, the digest of every file of the
build context (paths, modes, contents), so 4,000 attempts of one task build once and an edited
environment builds anew. Concurrent attempts of one task wait on a per-digest lock and reuse what
the first built. Offline by design: the engine never pulls (`pull=False`); every FROM image must
be on the engine already, else a `needs_image` report names it before anything is built. A build
that fails is a `SetupError` naming the context and the end of the build log.

What the built image sets (WORKDIR, ENV, USER) is handed to T1's provisioning in a small file in
the container, `BUILT_MARKER` (`t1.tasks.provision` reads it and does not replay the Dockerfile).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from t1.sandbox.isolation.bwrap import SANDBOX_PATH
from t1.sandbox.needs import NeedsImageError
from t1.tasks.image.dockerfile import parse_dockerfile
from t1.tasks.image.dockerplan import expand
from t1.tasks.transfer import SetupError, one_line_cause

ENV_REPOSITORY = "t1-env"
LOG_TAIL_CHARS = 2000


def context_digest(context: Path) -> str:
    """sha256 over the build context's files: relative path, mode and contents, in path order (blocking)."""
    h = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if not p.is_dir() or p.is_symlink()):
        rel = path.relative_to(context).as_posix()
        st = path.lstat()
        h.update(f"{rel}\0{st.st_mode:o}\0".encode())
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def env_tag(digest: str) -> str:
    return f"{ENV_REPOSITORY}:{digest[:32]}"


def base_images(dockerfile: Path) -> list[str]:
    """The images a Dockerfile's FROM lines name (ARG defaults expanded; stage names and scratch left out)."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    for step in parse_dockerfile(dockerfile):
        if step.keyword == "ARG" and not images:
            for word in step.args:
                name, _, default = word.partition("=")
                args[name] = default
        elif step.keyword == "FROM" and step.args:
            image = expand(step.args[0], args)
            if len(step.args) >= 3 and step.args[1].upper() == "AS":
                stages.add(step.args[2].lower())
            if image.lower() not in stages and image != "scratch" and image not in images:
                images.append(image)
    return images


@dataclass(frozen=True, slots=True)
class BuiltImage:
    """An environment image and what its config sets for the task's shells."""

    tag: str
    workdir: str | None
    env: tuple[tuple[str, str], ...]
    user: str | None

    def marker(self) -> bytes:
        """BUILT_MARKER's contents: JSON of what the image sets (the provider writes it into the container)."""
        return json.dumps(
            {"image": self.tag, "workdir": self.workdir, "env": dict(self.env), "user": self.user}
        ).encode()


def built_image(tag: str, config: dict[str, Any]) -> BuiltImage:
    """What an image's config (`Config` of its inspect attributes) sets (pure)."""
    env: list[tuple[str, str]] = []
    for key, _, value in (item.partition("=") for item in config.get("Env") or ()):
        if key == "PATH":  # already expanded by the build: the session's PATH (T1's toolchain in it) is kept after it
            if value != SANDBOX_PATH:
                env.append((key, f"{value}:$PATH"))
        else:
            env.append((key, value))
    return BuiltImage(tag, config.get("WorkingDir") or None, tuple(env), config.get("User") or None)


class EnvironmentBuilder:
    """Builds environment images on one engine, each digest once at a time (per-digest locks)."""

    def __init__(self, client: docker.DockerClient, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._locks: dict[str, asyncio.Lock] = {}
        self.builds = 0
        """How many builds this builder ran (cache hits not counted)."""

    async def image(self, context: Path, network: str) -> BuiltImage:
        """The image of the environment at `context` (a folder with a Dockerfile), built if the engine lacks it."""
        digest = await asyncio.to_thread(context_digest, context)
        tag = env_tag(digest)
        async with self._locks.setdefault(digest, asyncio.Lock()):
            config = await asyncio.to_thread(self._config, tag)
            if config is None:
                await asyncio.to_thread(self._build, context, tag, network)
                config = await asyncio.to_thread(self._config, tag)
                assert config is not None, tag
        return built_image(tag, config)

    def _config(self, tag: str) -> dict[str, Any] | None:
        try:
            return dict(self.client.images.get(tag).attrs.get("Config") or {})
        except docker.errors.ImageNotFound:
            return None

    def _build(self, context: Path, tag: str, network: str) -> None:
        for image in base_images(context / "Dockerfile"):
            try:
                self.client.images.get(image)
            except docker.errors.ImageNotFound:
                raise NeedsImageError(f"the Dockerfile in {context} builds FROM {image}, which is not on the Docker "
                                      "engine (environment builds never pull)") from None
        self.builds += 1
        try:
            self.client.images.build(path=str(context), tag=tag, pull=False, rm=True, forcerm=True,
                                     network_mode=network, timeout=int(self.timeout_s),
                                     labels={"t1.environment": tag})
        except docker.errors.BuildError as exc:
            log_text = "".join(str(chunk.get("stream") or chunk.get("error") or "") for chunk in exc.build_log)
            tail = log_text[-LOG_TAIL_CHARS:]
            cause = str(exc.msg).strip() or one_line_cause(tail)
            raise SetupError(f"docker build of {context} failed: {cause}", output_tail=tail) from None
        except docker.errors.APIError as exc:
            raise SetupError(f"docker build of {context} failed: {exc.explanation or exc}") from None
