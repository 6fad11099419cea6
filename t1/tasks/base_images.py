"""The base images a local sandbox stands in for, and what each one sets before the Dockerfile runs.

A local sandbox has no image store: the host's system is the base image. What
differs between base images and matters to a task is what the image itself
sets: its WORKDIR (the Terminal-Bench base images set /app, and most
Terminal-Bench 1 Dockerfiles rely on it), its USER and its ENV. Some images carry
content of their own that the task's tests depend on (SWE-bench's evaluation
images hold the repository under test in a conda environment; DevEval's holds the
test tools its run-tests.sh calls); the host cannot stand in for those, so their
entry has a `refusal` and a FROM naming one is a needs_image report. This table is
T1's own; docs/tasks.md lists it. An image that is not in the table is still
replayed on the host (with WORKDIR /, as a plain distribution image would be),
and `t1 tasks validate` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from t1.tasks.spec import Env


@dataclass(frozen=True, slots=True)
class BaseImage:
    """What one family of base images sets: matched by repository name (no tag or digest)."""

    repository: str  # exact repository, or a prefix ending in '/'
    workdir: str = "/"
    user: str | None = None
    env: Env = ()
    note: str = ""
    refusal: str = ""  # non-empty: the image's own content is what the task needs; a local sandbox refuses it


BASE_IMAGES: tuple[BaseImage, ...] = (  # first match wins: exact repositories before the prefixes they fall under
    BaseImage("ghcr.io/laude-institute/t-bench/deveval", workdir="/app", note="DevEval (Terminal-Bench adapter)",
              refusal="DevEval's image carries the test tools its run-tests.sh calls (pytest-cov, pytest-json-report, "
                      "googletest, ...), which the host does not stand in for"),
    BaseImage("swebench/", workdir="/testbed", note="SWE-bench evaluation images",
              refusal="a SWE-bench evaluation image holds the repository under test in /testbed with its own conda "
                      "environment, which the host does not stand in for"),
    BaseImage("ghcr.io/laude-institute/t-bench/", workdir="/app",
              note="Terminal-Bench base images (ubuntu-24-04, python-3-13, ...): WORKDIR /app, tmux and asciinema"),
    BaseImage("ubuntu", note="Ubuntu"),
    BaseImage("debian", note="Debian"),
    BaseImage("python", note="Python on Debian"),
    BaseImage("buildpack-deps", note="Debian with build tools"),
)


def repository(image: str) -> str:
    """The repository part of an image reference: no tag, no digest, no docker.io/library/ prefix."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    for prefix in ("docker.io/library/", "docker.io/", "library/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def lookup(image: str) -> BaseImage | None:
    """The table entry for an image reference, or None when T1's table does not know it."""
    repo = repository(image)
    for entry in BASE_IMAGES:
        if repo == entry.repository or (entry.repository.endswith("/") and repo.startswith(entry.repository)):
            return entry
    return None
