"""Prepare a sandbox for a task: refuse what cannot run here, replay the Dockerfile, upload files, check health.

`sandbox_request` tells the provider what the task needs (image, network,
resources). `provision` then makes the sandbox look like the task's container:
first it refuses, by name, what this provider cannot give (t1.tasks.needs.predict:
GPUs, MCP servers, compose services, unset env templates); on local sandboxes
the Dockerfile is replayed with container semantics (t1.tasks.image.dockerplan and
t1.tasks.image.dockerfile_replay, installer stand-ins on PATH when offline); on providers that
start the task's own image it is already applied (and where the provider built
that image from the Dockerfile, `BUILT_MARKER` says what the image sets). Environment files go into the
workdir, and the healthcheck must pass before the agent starts. The result
(workdir, env, user) is what every later shell of the episode starts from.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t1.sandbox.needs import NeedsImageError, raise_need
from t1.sandbox.types import BUILT_MARKER, SandboxRequest, SandboxTraits, Shell
from t1.tasks.image.dockerfile_replay import as_user, exports, replay
from t1.tasks.image.dockerplan import ReplayStep, build_plan
from t1.tasks.image.entrypoint import start_entrypoint
from t1.tasks.needs.predict import static_needs
from t1.tasks.needs.test_imports import uncollectable
from t1.tasks.spec import Env, Healthcheck, StepSpec, TaskSpec
from t1.tasks.toolchain import install_stand_ins, remove_stand_ins
from t1.tasks.transfer import SetupError, check, upload_dir_contents

__all__ = ["Provisioned", "as_user", "check_user", "enter_step", "provision", "run_healthcheck", "sandbox_request"]


@dataclass(frozen=True, slots=True)
class Provisioned:
    """How every shell of the episode must start: cwd, environment and user."""

    workdir: str
    env: Env
    user: str | None = None
    tests_files: tuple[ReplayStep, ...] = ()  # Dockerfile steps into /tests, placed by the verifier (run_verifier)
    build_context: Path | None = None  # where their sources are

    def prefix(self) -> str:
        """Shell text that enters the task's workdir and environment."""
        return f"{exports(self.env)}cd {shlex.quote(self.workdir)}; "


async def built_image(shell: Shell) -> dict[str, Any] | None:
    """What the sandbox's image sets, where the provider built it from the task's Dockerfile (`BUILT_MARKER`), else
    None."""
    result = await shell.run(f"cat {BUILT_MARKER} 2>/dev/null", timeout_s=30)
    if result.exit_code != 0 or not result.output.strip():
        return None
    return dict(json.loads(result.output))


def sandbox_request(spec: TaskSpec) -> SandboxRequest:
    env = spec.environment
    context = env.dockerfile.parent if env.dockerfile is not None and not env.docker_image else None
    return SandboxRequest(allow_network=env.allow_internet, docker_image=env.docker_image,
                          cpus=env.cpus, memory_mb=env.memory_mb, storage_mb=env.storage_mb, env=env.env,
                          build_context=context)


async def run_healthcheck(shell: Shell, hc: Healthcheck, prefix: str) -> None:
    """Docker HEALTHCHECK semantics: during start_period_sec failures do not count (checked every
    start_interval_sec); then `retries` consecutive failures, interval_sec apart, fail the setup."""
    loop = asyncio.get_running_loop()

    async def once() -> str:
        result = await shell.run(f"( {prefix}{hc.command} )", timeout_s=hc.timeout_sec)
        if result.exit_code == 0 and not result.timed_out:
            return ""
        return "timed out" if result.timed_out else f"exit code {result.exit_code}: {result.output[-300:].strip()}"

    grace_ends = loop.time() + hc.start_period_sec
    while loop.time() < grace_ends:
        if not await once():
            return
        await asyncio.sleep(max(0.0, min(hc.start_interval_sec, grace_ends - loop.time())))
    last = ""
    for attempt in range(hc.retries):
        last = await once()
        if not last:
            return
        if attempt + 1 < hc.retries:
            await asyncio.sleep(hc.interval_sec)
    raise SetupError(f"healthcheck {hc.command!r} failed {hc.retries} time(s): {last}")


async def provision(shell: Shell, spec: TaskSpec, traits: SandboxTraits) -> Provisioned:
    """Make the sandbox (its provider's `traits`) match the task's environment; returns how the agent's shells
    must start. Offline sandboxes, or a task that denies internet, get the installer stand-ins on PATH for RUN
    lines."""
    env = spec.environment
    replays = traits.no_images  # no image: the Dockerfile is replayed in the sandbox, whose tools are the host's
    for need in static_needs(spec, traits=traits):
        raise_need(need)
    if replays and (broken := uncollectable(spec)):  # the task's own test files: its error, before the agent acts
        raise SetupError(broken)
    offline = traits.offline or not env.allow_internet
    workdir: str | None = env.workdir
    docker_env: Env = ()
    user = spec.agent_user
    plan = None
    built = None if replays or env.dockerfile is None or env.docker_image else await built_image(shell)
    if built is not None:  # the provider built the Dockerfile into the sandbox's image: nothing to replay
        workdir, user = workdir or built.get("workdir") or None, user or built.get("user") or None
        docker_env = tuple((str(k), str(v)) for k, v in dict(built.get("env") or {}).items())
    elif env.dockerfile is not None and (replays or not env.docker_image):
        plan = build_plan(env.dockerfile)
        stand_ins = offline and bool(plan.run_lines())
        if stand_ins:
            await install_stand_ins(shell)
        # /tests is the verifier's: its COPY/ADD steps are placed by the verifier's shell with the tests
        await replay(shell, plan.without_tests_files(), env.dockerfile.parent, env.build_timeout_sec, offline=offline)
        if stand_ins:
            await remove_stand_ins(shell)
        workdir, docker_env, user = workdir or plan.workdir, plan.env, user or plan.user
    elif replays and env.docker_image and env.dockerfile is None:
        raise NeedsImageError(f"task {spec.id} runs in image {env.docker_image} and has no Dockerfile to replay "
                              "locally")
    workdir = workdir or "/app"
    await check(shell, f"mkdir -p {shlex.quote(workdir)}", f"create workdir {workdir}")
    if env.files_dir is not None:
        await upload_dir_contents(shell, env.files_dir, workdir, exclude=("docker-compose.yaml", "docker-compose.yml"))
    merged: dict[str, str] = dict(docker_env)
    merged.update(env.env)
    provisioned = Provisioned(workdir=workdir, env=tuple(merged.items()), user=user,
                              tests_files=plan.tests_files() if plan is not None else (),
                              build_context=env.dockerfile.parent if plan is not None and env.dockerfile else None)
    if plan is not None:
        await start_entrypoint(shell, plan)  # a plain ENTRYPOINT script, as the container's first process
    await check_user(shell, provisioned.user)
    if env.healthcheck is not None:
        await run_healthcheck(shell, env.healthcheck, provisioned.prefix())
    return provisioned


STEP_SETUP = "setup.sh"  # Harbor: steps/<name>/workdir/setup.sh runs from the workdir after the upload


async def enter_step(shell: Shell, step: StepSpec, provisioned: Provisioned) -> None:
    """Before a step of a multi-step task: its workdir files, its workdir/setup.sh, then its healthcheck."""
    if step.workdir_files is not None:
        await upload_dir_contents(shell, step.workdir_files, provisioned.workdir)
        if (step.workdir_files / STEP_SETUP).is_file():
            await check(shell, f"( {provisioned.prefix()}bash ./{STEP_SETUP} ) < /dev/null 2>&1",
                        f"step {step.name}: workdir/{STEP_SETUP}")
    if step.healthcheck is not None:
        await run_healthcheck(shell, step.healthcheck, provisioned.prefix())


async def check_user(shell: Shell, user: str | None) -> None:
    """A task user must exist, and the sandbox must be able to switch to it (or already be it)."""
    if user is None:
        return
    q = shlex.quote(user)
    result = await shell.run(f"id -u {q} >/dev/null 2>&1 || echo missing; [ \"$(id -un)\" = {q} ] && echo same; "
                             "[ \"$(id -u)\" = 0 ] && command -v runuser >/dev/null && echo can", 30)
    words = result.output.split()
    if "missing" in words:
        raise SetupError(f"task user {user!r} does not exist in the sandbox")
    if "same" not in words and "can" not in words:
        raise SetupError(f"task user {user!r}: the sandbox runs as another user and cannot switch")
