"""A Dockerfile's ENTRYPOINT in a local sandbox: a plain script runs as the sandbox's first process.

A container runs its ENTRYPOINT with the command as its arguments; a start-up script
that prepares the container (writes /etc/hosts, starts a helper server, fixes
permissions) and ends by `exec "$@"` (or `exec gosu USER "$@"`) hands over to the
command. Harbor and Terminal-Bench give every container a command that keeps it alive
(`sleep infinity`), so in a local sandbox T1 runs such a script the same way, in the
background with `sleep infinity` as its command, as the USER the Dockerfile ends with,
after the replay and before the healthcheck and the agent. Any other ENTRYPOINT (one
whose file is not a script from the build context, or that does not end in `exec ...
"$@"`: a program that is the container) needs an image: NeedsImageError naming the line.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from t1.sandbox.needs import Need, NeedKind
from t1.sandbox.types import Shell
from t1.tasks.image.context_files import host_copy
from t1.tasks.image.dockerfile_replay import as_user, exports
from t1.tasks.image.dockerplan import DockerPlan
from t1.tasks.transfer import check

LOG = "/tmp/.t1-entrypoint.log"
_EXEC_ARGS = re.compile(r'^exec\s+(?:[^\s;&|]+\s+)*"\$@"\s*$')


def entrypoint_need(plan: DockerPlan, context: Path) -> Need | None:
    """None when the plan has no ENTRYPOINT or a plain script one; else the needs_image naming the line."""
    if not plan.entrypoint:
        return None
    program = plan.entrypoint[0]
    script = host_copy(plan, context, program, plan.workdir)
    if script is None:
        return Need(NeedKind.IMAGE, f"{plan.entrypoint_label}: {program} is not a script the build context puts "
                                    "there; it is the container's own program, so this task needs an image")
    lines = [ln.strip() for ln in script.read_text(encoding="utf-8", errors="replace").splitlines()]
    last = next((ln for ln in reversed(lines) if ln and not ln.startswith("#")), "")
    if not _EXEC_ARGS.match(last):
        return Need(NeedKind.IMAGE, f"{plan.entrypoint_label}: {script.name} does not end by exec-ing the "
                                    "container's command (exec \"$@\"), so it is the container's first process "
                                    "itself; this task needs an image")
    return None


async def start_entrypoint(shell: Shell, plan: DockerPlan) -> None:
    """Run the plain ENTRYPOINT script in the background with `sleep infinity` as its command (see module doc)."""
    if not plan.entrypoint:
        return
    argv = shlex.join([*plan.entrypoint, "sleep", "infinity"])
    inner = f"{exports(plan.env)}cd {shlex.quote(plan.workdir)} && exec {argv}"
    run = shlex.quote(as_user(inner, plan.user))
    # one second for the script's own start-up before the healthcheck (if any) and the agent
    await check(shell, f"( setsid nohup bash -c {run} > {LOG} 2>&1 < /dev/null & ) ; sleep 1",
                f"start {plan.entrypoint_label}")
