"""Where a file the built environment holds came from in the task folder: a Dockerfile's COPY/ADD lines, read back.

`t1 tasks validate` reads a task's installer lines without building anything. A
line such as `pip install -r requirements.txt` names a file inside the
container (relative to the directory the line runs in); the packages it asks
for are only known from the copy of that file in the build context. This module
maps a container path back to that copy through the plan's COPY and ADD steps
(the last step that wrote the path wins, as in the image), with Docker's rules
for a source directory (its contents land in the destination) and a destination
ending in `/` (files keep their names). A path no COPY wrote (a RUN line made
it, or nothing did) has no copy here: None.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from t1.tasks.image.dockerplan import DockerPlan, ReplayStep


def _from_step(step: ReplayStep, context: Path, target: str) -> Path | None:
    *sources, dest = step.args
    into_dir = dest.endswith("/") or len(sources) > 1
    dest = dest.rstrip("/") or "/"
    for source in reversed(sources):
        src = (context / source).resolve()
        if not src.is_relative_to(context.resolve()) or not src.exists():
            continue
        if src.is_dir():  # the directory's contents go into dest
            rel = posixpath.relpath(target, dest)
            if not rel.startswith(".."):
                host = src / rel
                if host.is_file():
                    return host
        elif (posixpath.join(dest, src.name) if into_dir else dest) == target:
            return src
    return None


def host_copy(plan: DockerPlan, context: Path, path: str, cwd: str) -> Path | None:
    """The build-context file that a COPY/ADD step put at `path` (relative to `cwd` when not absolute), or None."""
    target = posixpath.normpath(posixpath.join(cwd, path))
    for step in reversed(plan.steps):
        if step.action in ("COPY", "ADD"):
            found = _from_step(step, context, target)
            if found is not None:
                return found
    return None
