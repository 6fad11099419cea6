"""Parse a Dockerfile into steps a local sandbox can replay (FROM/WORKDIR/COPY/ADD/ENV/RUN only).

A local sandbox has no image builder: it stands in for the base image with the
host's read-only system and replays the remaining steps in the sandbox. Any
other instruction (USER, ARG, multi-stage COPY --from, ADD of a URL, ...) cannot be
replayed faithfully, so parsing raises NeedsImageError naming the line.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

LOCAL_INSTRUCTIONS = ("FROM", "WORKDIR", "COPY", "ADD", "ENV", "RUN")


class NeedsImageError(ValueError):
    """The task's environment cannot be built in a local sandbox: it needs a container image."""


@dataclass(frozen=True, slots=True)
class DockerStep:
    """One instruction: its keyword, its arguments (parsed per keyword) and its line number."""

    keyword: str
    args: tuple[str, ...]
    line: int


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines, buf, start = [], "", 0
    for no, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = no
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        lines.append((start, buf))
        buf = ""
    if buf:
        lines.append((start, buf))
    return lines


def _env_pairs(rest: str, where: str) -> tuple[str, ...]:
    parts = shlex.split(rest)
    if parts and "=" not in parts[0]:
        if len(parts) < 2:
            raise NeedsImageError(f"{where}: ENV needs KEY VALUE or KEY=VALUE")
        return (parts[0], rest.split(None, 1)[1].strip())
    out: list[str] = []
    for p in parts:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise NeedsImageError(f"{where}: ENV entry {p!r} is not KEY=VALUE")
        out += [key, value]
    return tuple(out)


def _copy_args(keyword: str, rest: str, where: str) -> tuple[str, ...]:
    parts = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    flags = [p for p in parts if p.startswith("--")]
    for flag in flags:
        if flag.startswith(("--from", "--link", "--parents", "--exclude")):
            raise NeedsImageError(f"{where}: {keyword} {flag} needs an image build")
    paths = [p for p in parts if not p.startswith("--")]
    if len(paths) < 2:
        raise NeedsImageError(f"{where}: {keyword} needs at least one source and a destination")
    if keyword == "ADD" and any("://" in p for p in paths[:-1]):
        raise NeedsImageError(f"{where}: ADD of a URL needs an image build (sandboxes are offline)")
    return tuple(paths)


def parse_dockerfile(path: Path) -> list[DockerStep]:
    """The steps of a local-replayable Dockerfile, or NeedsImageError naming the offending line."""
    steps: list[DockerStep] = []
    for line, text in _logical_lines(path.read_text(encoding="utf-8")):
        keyword, _, rest = text.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        where = f"{path}:{line}"
        if keyword not in LOCAL_INSTRUCTIONS:
            raise NeedsImageError(
                f"{where}: instruction {keyword} cannot be replayed in a local sandbox "
                f"(only {'/'.join(LOCAL_INSTRUCTIONS)}); this task needs an image")
        if keyword == "FROM":
            if any(s.keyword == "FROM" for s in steps):
                raise NeedsImageError(f"{where}: multi-stage build needs an image")
            args: tuple[str, ...] = (rest.split()[0],) if rest else ("scratch",)
        elif keyword == "ENV":
            args = _env_pairs(rest, where)
        elif keyword in ("COPY", "ADD"):
            args = _copy_args(keyword, rest, where)
        elif keyword == "RUN":
            if rest.startswith("["):
                args = (shlex.join(json.loads(rest)),)
            else:
                if rest.startswith("--"):
                    raise NeedsImageError(f"{where}: RUN flags need an image build")
                args = (rest,)
        else:  # WORKDIR
            args = (rest,)
        steps.append(DockerStep(keyword, args, line))
    return steps
