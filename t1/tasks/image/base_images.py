"""The base images a local sandbox stands in for, and what each one sets before the Dockerfile runs.

A local sandbox has no image store: the host's system is the base image. What
differs between base images and matters to a task is what the image itself
sets: its WORKDIR (the Terminal-Bench base images set /app, and most
Terminal-Bench 1 Dockerfiles rely on it), its USER and its ENV. Some images carry
content of their own that the task's tests depend on (SWE-bench's evaluation
images hold the repository under test in a conda environment; DevEval's holds the
test tools its run-tests.sh calls); the host cannot stand in for those, so their
entry has a `refusal` and a FROM naming one is a needs_image report. A language
image (golang, node, eclipse-temurin, r-base, dotnet, ...) is its toolchain: the host
stands in for it only where that toolchain is really there, on the system PATH a
sandbox starts with, and T1 checks it (`missing_toolchain`); otherwise the FROM is a
needs_image report naming the image and the missing commands. An image that is not
in the table at all (alpine, with its musl userland and `apk`; an organisation's own
image) is a needs_image report too: the host is not that image. This table is T1's
own; docs/tasks.md lists it. The docker provider uses the image itself (when its
engine has it) and does not consult this table.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from t1.tasks.spec import Env

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where a stand-in's toolchain must be: the PATH a Debian image's shell starts with (not T1's own venv); also
the PATH of an image that sets none (the engine's default)."""


@dataclass(frozen=True, slots=True)
class BaseImage:
    """What one family of base images sets: matched by repository name (no tag or digest)."""

    repository: str  # exact repository, or a prefix ending in '/'
    workdir: str = "/"
    user: str | None = None
    env: Env = ()
    note: str = ""
    refusal: str = ""  # non-empty: the image's own content is what the task needs; a local sandbox refuses it
    toolchain: tuple[str, ...] = ()  # commands the image exists to provide: the host stands in only if it has them


PYTHON_PATH = "/usr/local/bin:" + SYSTEM_PATH
"""The official python images' `ENV PATH /usr/local/bin:$PATH`."""
BASE_ENV: Env = (("PATH", SYSTEM_PATH),)
"""What every image's environment has: PATH (the default here). HOME is not in it: the engine sets HOME when a
container starts (the sandbox's shells have it), so a Dockerfile's `${HOME}` expands to nothing, as in `docker
build`."""
_UTF8: Env = (("LANG", "C.UTF-8"),)
PYTHON_GPG_KEYS = {
    "3.8": "E3FF2839C048B25C084DEBE9B26995E310250568",
    "3.9": "E3FF2839C048B25C084DEBE9B26995E310250568",
    "3.10": "A035C8C19219BA821ECEA86B64E628F8D684696D",
    "3.11": "A035C8C19219BA821ECEA86B64E628F8D684696D",
    "3.12": "7169605F62C751356D054A26A821E680E5FA6305",
    "3.13": "7169605F62C751356D054A26A821E680E5FA6305",
}
"""The release manager's key each official python image sets as GPG_KEY, by minor version (3.14's set none)."""

BASE_IMAGES: tuple[BaseImage, ...] = (  # first match wins: exact repositories before the prefixes they fall under
    BaseImage("ghcr.io/laude-institute/t-bench/deveval", workdir="/app", note="DevEval (Terminal-Bench adapter)",
              refusal="DevEval's image carries the test tools its run-tests.sh calls (pytest-cov, pytest-json-report, "
                      "googletest, ...), which the host does not stand in for"),
    BaseImage("swebench/", workdir="/testbed", note="SWE-bench evaluation images",
              refusal="a SWE-bench evaluation image holds the repository under test in /testbed with its own conda "
                      "environment, which the host does not stand in for"),
    BaseImage("ghcr.io/laude-institute/t-bench/python-3-13", workdir="/app", env=(("PATH", PYTHON_PATH), *_UTF8),
              note="Terminal-Bench's Python 3.13 image: WORKDIR /app, tmux and asciinema, python:3.13's environment"),
    BaseImage("ghcr.io/laude-institute/t-bench/", workdir="/app", env=_UTF8,
              note="Terminal-Bench base images (ubuntu-24-04, ...): WORKDIR /app, tmux and asciinema"),
    BaseImage("ubuntu", note="Ubuntu"),
    BaseImage("debian", note="Debian"),
    BaseImage("python", env=(("PATH", PYTHON_PATH), *_UTF8), note="Python on Debian (PYTHON_VERSION and GPG_KEY "
                                                                  "from the tag: `python_env`)"),
    BaseImage("buildpack-deps", note="Debian with build tools"),
    BaseImage("golang", workdir="/go", note="Go on Debian", toolchain=("go",)),
    BaseImage("node", note="Node.js on Debian", toolchain=("node", "npm")),
    BaseImage("eclipse-temurin", note="a Java JDK", toolchain=("java", "javac")),
    BaseImage("openjdk", note="a Java JDK", toolchain=("java", "javac")),
    BaseImage("amazoncorretto", note="a Java JDK", toolchain=("java", "javac")),
    BaseImage("maven", note="a Java JDK with Maven", toolchain=("java", "javac", "mvn")),
    BaseImage("gradle", note="a Java JDK with Gradle", toolchain=("java", "javac", "gradle")),
    BaseImage("rust", note="Rust on Debian", toolchain=("cargo", "rustc")),
    BaseImage("gcc", note="GCC on Debian", toolchain=("gcc", "g++")),
    BaseImage("r-base", note="R on Debian", toolchain=("R", "Rscript")),
    BaseImage("rocker/", note="R (Rocker images)", toolchain=("R", "Rscript")),
    BaseImage("mcr.microsoft.com/dotnet/", note=".NET", toolchain=("dotnet",)),
    BaseImage("ruby", note="Ruby on Debian", toolchain=("ruby", "gem")),
    BaseImage("php", note="PHP on Debian", toolchain=("php",)),
    BaseImage("perl", note="Perl on Debian", toolchain=("perl", "cpanm")),
    BaseImage("julia", note="Julia on Debian", toolchain=("julia",)),
    BaseImage("swift", note="Swift on Ubuntu", toolchain=("swift",)),
    BaseImage("haskell", note="GHC on Debian", toolchain=("ghc", "cabal")),
    BaseImage("alpine", note="Alpine Linux",
              refusal="Alpine's userland (musl libc, busybox, the apk package manager) is not the host's Debian one"),
)

NOT_IN_TABLE = ("not in T1's base-image table (docs/tasks.md), so the host cannot stand in for it")


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


def _tag(image: str) -> str:
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def lookup(image: str) -> BaseImage | None:
    """The table entry for an image reference, or None when T1's table does not know it.

    A variant built on Alpine (`python:3.12-alpine`, `golang:alpine3.20`) is Alpine, whatever its repository.
    """
    repo = "alpine" if "alpine" in _tag(image) else repository(image)
    for entry in BASE_IMAGES:
        if repo == entry.repository or (entry.repository.endswith("/") and repo.startswith(entry.repository)):
            return entry
    return None


def missing_toolchain(entry: BaseImage, path: str = SYSTEM_PATH) -> list[str]:
    """The commands of the image's toolchain that the host lacks on the system PATH (empty: it stands in)."""
    return [cmd for cmd in entry.toolchain if shutil.which(cmd, path=path) is None]


def stand_in_refusal(image: str) -> str:
    """Why the host cannot stand in for `image` (empty when it can): refused, unknown, or its toolchain missing."""
    entry = lookup(image)
    if entry is None:
        return NOT_IN_TABLE
    if entry.refusal:
        return entry.refusal
    missing = missing_toolchain(entry)
    if missing:
        return (f"the image provides {', '.join(entry.toolchain)}, and this host has no {', '.join(missing)} "
                f"on the system PATH ({SYSTEM_PATH})")
    return ""


def python_env(image: str) -> Env:
    """PYTHON_VERSION and GPG_KEY as an official python image of `image`'s tag sets them (pure).

    The version is the tag's (`python:3.13-slim` gives 3.13; the image itself names the patch release,
    which the tag does not say); no version in the tag, nothing.
    """
    tag = image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    version = re.match(r"\d+\.\d+(?:\.\d+)?", tag)
    if version is None:
        return ()
    minor = ".".join(version.group(0).split(".")[:2])
    key = PYTHON_GPG_KEYS.get(minor)
    signed: Env = (("GPG_KEY", key),) if key else ()
    return (*signed, ("PYTHON_VERSION", version.group(0)))


def image_env(image: str) -> Env:
    """The environment a container of `image` starts with, as T1 stands in for it (pure; docs/tasks.md's table).

    Every image: PATH (`BASE_ENV`); then what the table's entry sets; images outside the table get
    the engine's defaults only.
    """
    entry = lookup(image)
    env = dict(BASE_ENV)
    if entry is not None:
        env.update(dict(entry.env))
        if entry.repository in ("python", "ghcr.io/laude-institute/t-bench/python-3-13"):
            env.update(dict(python_env(image if entry.repository == "python" else "python:3.13")))
    return tuple(env.items())
