"""Run a Dockerfile's replay plan (t1.tasks.image.dockerplan) inside a sandbox, as `docker build` would.

Every RUN line runs in its WORKDIR with its ARG/ENV, as its USER, through its
SHELL. On offline sandboxes the installer stand-ins (t1.tasks.toolchain) come
first on PATH, so `apt-get install curl` succeeds when curl is on the host and
`pip install coq-jupyter` stops with a NeedsNetworkError naming the package. A
RUN line that fails for any other reason is a SetupError that names the
Dockerfile line and gives a one-line cause, with the output tail kept apart.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import replace
from pathlib import Path

from t1.sandbox.needs import NeedsNetworkError
from t1.sandbox.types import Shell
from t1.tasks.image.dockerplan import DockerPlan, ReplayStep
from t1.tasks.toolchain import STAND_INS_DIR, needs_network_lines, toolchain_prefix
from t1.tasks.transfer import (
    SetupError,
    check,
    one_line_cause,
    path_kind,
    tar_entries,
    upload_archive,
)

_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_STAGE = "/tmp/.t1-add"


def exports(env: tuple[tuple[str, str], ...]) -> str:
    """Shell text exporting each variable, with $VAR expansion left on (Dockerfile ENV semantics)."""
    return "".join(f"export {k}={_dq(v)}; " for k, v in env)


def _dq(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


def as_user(command: str, user: str | None) -> str:
    """Run `command` with bash as `user` (via runuser when the sandbox is root), or as is."""
    if user is None or user in ("root", "0"):
        return command
    q = shlex.quote(user)
    return (f"if [ \"$(id -un)\" = {q} ] || [ \"$(id -u)\" = {q} ]; then bash -c {shlex.quote(command)}; "
            f"else runuser -u {q} -- bash -c {shlex.quote(command)}; fi")


async def _own(shell: Shell, step: ReplayStep, targets: list[str], timeout: float) -> None:
    quoted = " ".join(shlex.quote(t) for t in targets)
    if step.chown and targets:
        await check(shell, f"chown -R {shlex.quote(step.chown)} {quoted}", f"{step.label()} (--chown)", timeout)
    if step.chmod and targets:
        await check(shell, f"chmod -R {shlex.quote(step.chmod)} {quoted}", f"{step.label()} (--chmod)", timeout)


async def _copy(shell: Shell, step: ReplayStep, context: Path, timeout: float) -> None:
    *sources, dest = step.args
    matches: list[Path] = []
    for src in sources:
        found = sorted(context.glob(src)) if any(c in src for c in "*?[") else [context / src]
        found = [p for p in found if p.exists() and p.resolve().is_relative_to(context.resolve())]
        if not found:
            raise SetupError(f"{step.label()}: source {src!r} not found in {context}")
        matches += found
    to_dir = dest.endswith("/") or len(matches) > 1 or await path_kind(shell, dest) == "dir"
    entries: list[tuple[Path, str]] = []
    targets: list[str] = []
    for src_path in matches:
        if step.action == "ADD" and src_path.is_file() and src_path.name.endswith(_ARCHIVES):
            await upload_archive(shell, tar_entries([(src_path, src_path.name)]), _STAGE, "ADD archive")
            members = await check(shell, f"tar -tf {_STAGE}/{shlex.quote(src_path.name)} | cut -d/ -f1 | sort -u",
                                  step.label(), timeout)
            await check(shell, f"mkdir -p {shlex.quote(dest)} && tar -xf {_STAGE}/{shlex.quote(src_path.name)} "
                        f"-C {shlex.quote(dest)} && rm -rf {_STAGE}", step.label(), timeout)
            targets += [posixpath.join(dest, m) for m in members.output.split() if m not in (".", "")]
        elif src_path.is_dir():
            for child in sorted(src_path.iterdir()):
                entries.append((child, posixpath.join(dest, child.name).lstrip("/")))
                targets.append(posixpath.join(dest, child.name))
        else:
            target = posixpath.join(dest, src_path.name) if to_dir else dest
            entries.append((src_path, target.lstrip("/")))
            targets.append(target)
    if entries:
        await upload_archive(shell, tar_entries(entries), "/", step.label())
    await _own(shell, step, targets, timeout)


async def _write(shell: Shell, step: ReplayStep, timeout: float) -> None:
    dest, content = step.args
    await check(shell, f"mkdir -p {shlex.quote(posixpath.dirname(dest) or '/')}", step.label(), timeout)
    await shell.write_file(dest, content.encode(), 0o644)
    await _own(shell, step, [dest], timeout)


async def _run(shell: Shell, step: ReplayStep, offline: bool, timeout: float) -> None:
    inner = f"{exports(step.env)}{toolchain_prefix(STAND_INS_DIR) if offline else ''}cd {shlex.quote(step.cwd)} && " \
            f"{shlex.join([*step.shell, step.args[0]])}"
    result = await shell.run(f"( {as_user(inner, step.user)} ) < /dev/null 2>&1", timeout_s=timeout)
    if result.timed_out:
        raise SetupError(f"{step.label()}: timed out after {timeout:.0f}s", output_tail=result.output[-2000:])
    if result.exit_code == 0:
        return
    needs = needs_network_lines(result.output)
    if needs:
        raise NeedsNetworkError(f"{step.label()}: {'; '.join(needs)}")
    raise SetupError(f"{step.label()}: exit code {result.exit_code}: {one_line_cause(result.output)}",
                     output_tail=result.output[-2000:])


async def replay(shell: Shell, plan: DockerPlan, context: Path, timeout: float, *, offline: bool) -> None:
    """Apply every step of the plan in the sandbox, in order."""
    for step in plan.steps:
        if step.action == "WORKDIR":
            await check(shell, f"mkdir -p {shlex.quote(step.args[0])}", step.label(), timeout)
            if step.user:
                await check(shell, f"chown {shlex.quote(step.user)} {shlex.quote(step.args[0])}", step.label(), timeout)
        elif step.action in ("COPY", "ADD"):
            await _copy(shell, step, context, timeout)
        elif step.action == "WRITE":
            await _write(shell, step, timeout)
        else:
            await _run(shell, step, offline, timeout)


async def place_tests_files(shell: Shell, steps: tuple[ReplayStep, ...], context: Path, timeout: float) -> None:
    """Replay the plan's COPY/ADD/heredoc steps into /tests (`DockerPlan.tests_files`) through the verifier's shell.

    /tests belongs to the verifier (a uid of its own on local sandboxes), so the setup shell cannot write
    there and the agent never can: its files are the verifier's, placed when the tests are (--chown is
    moot: the verifier owns them)."""
    for step in steps:
        step = replace(step, chown=None)
        if step.action == "WRITE":
            await _write(shell, step, timeout)
        else:
            await _copy(shell, step, context, timeout)
