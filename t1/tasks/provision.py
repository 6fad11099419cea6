"""Prepare a sandbox for a task: replay the Dockerfile (local), upload environment files, check health.

`sandbox_request` tells the provider what the task needs (image, network,
resources). `provision` then makes the sandbox look like the task's container:
on local sandboxes the Dockerfile's FROM/WORKDIR/COPY/ADD/ENV/RUN steps are
replayed in the sandbox (anything else is a NeedsImageError); on providers that
start the task's own image the Dockerfile is already applied. Environment files
go into the workdir, and the healthcheck must pass before the agent starts. The
result (workdir, env, user) is what every later shell of the episode starts from.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from t1.sandbox.types import SandboxRequest, Shell
from t1.tasks.dockerfile import DockerStep, NeedsImageError, parse_dockerfile
from t1.tasks.spec import Env, Healthcheck, StepSpec, TaskSpec
from t1.tasks.transfer import (
    SetupError,
    check,
    path_kind,
    tar_entries,
    upload_archive,
    upload_dir_contents,
)

_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


@dataclass(frozen=True, slots=True)
class Provisioned:
    """How every shell of the episode must start: cwd, environment and user."""

    workdir: str
    env: Env
    user: str | None = None

    def prefix(self) -> str:
        """Shell text that enters the task's workdir and environment."""
        exports = "".join(f"export {k}={_dq(v)}; " for k, v in self.env)
        return f"{exports}cd {shlex.quote(self.workdir)}; "


def _dq(value: str) -> str:
    """Double-quote for the shell, leaving $VAR expansion on (Dockerfile ENV semantics)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


def sandbox_request(spec: TaskSpec) -> SandboxRequest:
    env = spec.environment
    return SandboxRequest(allow_network=env.allow_internet, docker_image=env.docker_image,
                          cpus=env.cpus, memory_mb=env.memory_mb, env=env.env)


def _check_compose(spec: TaskSpec) -> None:
    path = spec.environment.compose_file
    if path is None:
        return
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise NeedsImageError(f"{path}: unreadable compose file ({exc})") from None
    services = data.get("services") or {} if isinstance(data, dict) else {}
    if isinstance(services, dict) and len(services) > 1:
        raise NeedsImageError(f"{path}: {len(services)} services ({', '.join(services)}); "
                              "local sandboxes run one; this task needs images")


async def _copy(shell: Shell, step: DockerStep, context: Path, cwd: str, timeout: float) -> None:
    *sources, dest = step.args
    dest = posixpath.join(cwd, dest)
    matches: list[Path] = []
    for src in sources:
        found = sorted(context.glob(src)) if any(c in src for c in "*?[") else [context / src]
        found = [p for p in found if p.exists() and p.resolve().is_relative_to(context.resolve())]
        if not found:
            raise SetupError(f"line {step.line}: {step.keyword} source {src!r} not found in {context}")
        matches += found
    to_dir = dest.endswith("/") or len(matches) > 1 or await path_kind(shell, dest) == "dir"
    entries: list[tuple[Path, str]] = []
    for src_path in matches:
        if step.keyword == "ADD" and src_path.is_file() and src_path.name.endswith(_ARCHIVES):
            await upload_archive(shell, tar_entries([(src_path, src_path.name)]), "/tmp/.t1-add", "ADD archive")
            await check(shell, f"mkdir -p {shlex.quote(dest)} && tar -xf /tmp/.t1-add/{shlex.quote(src_path.name)} "
                        f"-C {shlex.quote(dest)} && rm -rf /tmp/.t1-add", f"line {step.line}: ADD", timeout)
        elif src_path.is_dir():
            entries += [(p, posixpath.join(dest, p.name).lstrip("/")) for p in sorted(src_path.iterdir())]
        else:
            target = posixpath.join(dest, src_path.name) if to_dir else dest
            entries.append((src_path, target.lstrip("/")))
    if entries:
        await upload_archive(shell, tar_entries(entries), "/", f"line {step.line}: {step.keyword}")


async def apply_dockerfile(shell: Shell, dockerfile: Path, timeout: float) -> tuple[str, Env]:
    """Replay a Dockerfile's steps in the sandbox; returns the final WORKDIR and ENV."""
    steps = parse_dockerfile(dockerfile)
    cwd, env = "/", {}
    for step in steps:
        if step.keyword == "WORKDIR":
            cwd = posixpath.join(cwd, step.args[0])
            await check(shell, f"mkdir -p {shlex.quote(cwd)}", f"line {step.line}: WORKDIR", timeout)
        elif step.keyword == "ENV":
            for k, v in zip(step.args[::2], step.args[1::2], strict=True):
                env[k] = v
        elif step.keyword in ("COPY", "ADD"):
            await _copy(shell, step, dockerfile.parent, cwd, timeout)
        elif step.keyword == "RUN":
            exports = "".join(f"export {k}={_dq(v)}; " for k, v in env.items())
            await check(shell, f"( {exports}cd {shlex.quote(cwd)} && sh -c {shlex.quote(step.args[0])} )",
                        f"{dockerfile.name} line {step.line}: RUN", timeout)
    return cwd, tuple(env.items())


async def run_healthcheck(shell: Shell, hc: Healthcheck, prefix: str) -> None:
    if hc.start_period_sec:
        await asyncio.sleep(hc.start_period_sec)
    last = ""
    for attempt in range(hc.retries):
        result = await shell.run(f"( {prefix}{hc.command} )", timeout_s=hc.timeout_sec)
        if result.exit_code == 0 and not result.timed_out:
            return
        last = "timed out" if result.timed_out else f"exit code {result.exit_code}: {result.output[-300:].strip()}"
        if attempt + 1 < hc.retries:
            await asyncio.sleep(hc.interval_sec)
    raise SetupError(f"healthcheck {hc.command!r} failed {hc.retries} time(s): {last}")


async def provision(shell: Shell, spec: TaskSpec, *, local: bool = True) -> Provisioned:
    """Make the sandbox match the task's environment; returns how the agent's shells must start."""
    env = spec.environment
    _check_compose(spec)
    workdir: str | None = env.workdir
    docker_env: tuple[tuple[str, str], ...] = ()
    if env.dockerfile is not None and (local or not env.docker_image):
        image_workdir, docker_env = await apply_dockerfile(shell, env.dockerfile, env.build_timeout_sec)
        workdir = workdir or (image_workdir if image_workdir != "/" else None)
    elif local and env.docker_image and env.dockerfile is None:
        raise NeedsImageError(f"task {spec.id} runs in image {env.docker_image} and has no Dockerfile to replay locally")
    workdir = workdir or "/app"
    await check(shell, f"mkdir -p {shlex.quote(workdir)}", f"create workdir {workdir}")
    if env.files_dir is not None:
        await upload_dir_contents(shell, env.files_dir, workdir, exclude=("docker-compose.yaml", "docker-compose.yml"))
    merged: dict[str, str] = dict(docker_env)
    merged.update(env.env)
    provisioned = Provisioned(workdir=workdir, env=tuple(merged.items()), user=spec.agent_user)
    await check_user(shell, provisioned.user)
    if env.healthcheck is not None:
        await run_healthcheck(shell, env.healthcheck, provisioned.prefix())
    return provisioned


async def enter_step(shell: Shell, step: StepSpec, provisioned: Provisioned) -> None:
    """Before a step of a multi-step task: its workdir files, then its healthcheck."""
    if step.workdir_files is not None:
        await upload_dir_contents(shell, step.workdir_files, provisioned.workdir)
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


def as_user(command: str, user: str | None) -> str:
    """Run `command` with bash as `user` (via runuser when the sandbox is root), or as is."""
    if user is None:
        return command
    q = shlex.quote(user)
    return (f"if [ \"$(id -un)\" = {q} ]; then bash -c {shlex.quote(command)}; "
            f"else runuser -u {q} -- bash -c {shlex.quote(command)}; fi")
