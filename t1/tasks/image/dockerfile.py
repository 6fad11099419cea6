"""Parse a Dockerfile into instructions: continuation lines, heredocs, JSON forms and --flags.

This is the syntax half (text in, DockerStep values out, no meaning attached);
`t1.tasks.image.dockerplan` gives the steps their meaning (ARG/ENV expansion, WORKDIR,
USER, SHELL) and decides what a local sandbox can replay. dockerfile-parse was
tried and not used: it splits BuildKit heredoc bodies (`RUN <<EOF ... EOF`) into
phantom instructions, and real benchmark Dockerfiles use heredocs.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from t1.sandbox.needs import NeedsImageError

__all__ = ["DockerStep", "Heredoc", "NeedsImageError", "parse_dockerfile", "parse_dockerfile_text"]

_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_HEREDOC_KEYWORDS = ("RUN", "COPY", "ADD")


@dataclass(frozen=True, slots=True)
class Heredoc:
    """One here-document: its delimiter and body (tabs stripped for <<-)."""

    delimiter: str
    body: str


@dataclass(frozen=True, slots=True)
class DockerStep:
    """One instruction: keyword, --flags, arguments (JSON form already decoded), heredocs and line number.

    `args` is the list of words for COPY/ADD/ARG/ENV/FROM/USER/SHELL (JSON or shell-split), and a single
    string (the shell text as written) for RUN, CMD and ENTRYPOINT in shell form.
    """

    keyword: str
    args: tuple[str, ...]
    line: int
    flags: tuple[tuple[str, str], ...] = ()
    heredocs: tuple[Heredoc, ...] = ()
    json_form: bool = False
    text: str = ""

    def flag(self, name: str) -> str | None:
        return dict(self.flags).get(name)


def _join_lines(text: str) -> list[tuple[int, str, list[str]]]:
    """Logical instructions: (first line number, joined text, the raw lines that follow for heredocs)."""
    raw = text.splitlines()
    out: list[tuple[int, str, list[str]]] = []
    i, n = 0, len(raw)
    while i < n:
        stripped = raw[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        start, buf = i + 1, ""
        while i < n:
            part = raw[i].strip()
            i += 1
            if buf and (not part or part.startswith("#")):
                continue
            if part.endswith("\\"):
                buf += part[:-1] + " "
                continue
            buf += part
            break
        keyword = buf.split(None, 1)[0].upper()
        bodies: list[str] = []
        if keyword in _HEREDOC_KEYWORDS:
            for strip_tabs, _, delim in _HEREDOC.findall(buf):
                lines: list[str] = []
                while i < n and (raw[i].lstrip("\t") if strip_tabs else raw[i]) != delim:
                    lines.append(raw[i].lstrip("\t") if strip_tabs else raw[i])
                    i += 1
                if i >= n:
                    raise NeedsImageError(f"line {start}: heredoc <<{delim} is never closed")
                i += 1
                bodies.append("\n".join(lines) + "\n")
        out.append((start, buf, bodies))
    return out


def _split_flags(rest: str) -> tuple[tuple[tuple[str, str], ...], str]:
    flags: list[tuple[str, str]] = []
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        name, _, value = word[2:].partition("=")
        flags.append((name, value))
        rest = rest.lstrip()
    return tuple(flags), rest


def _words(rest: str, where: str) -> tuple[tuple[str, ...], bool]:
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value), True
    try:
        return tuple(shlex.split(rest, posix=True)), False
    except ValueError as exc:
        raise NeedsImageError(f"{where}: cannot split {rest[:60]!r} ({exc})") from None


def parse_dockerfile_text(text: str, name: str = "Dockerfile") -> list[DockerStep]:
    """The instructions of a Dockerfile's text, in order (see DockerStep)."""
    steps: list[DockerStep] = []
    for line, joined, bodies in _join_lines(text):
        keyword, _, rest = joined.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        where = f"{name}:{line}"
        flags, rest = _split_flags(rest)
        heredocs = tuple(Heredoc(d, b) for (_, _, d), b in zip(_HEREDOC.findall(rest), bodies, strict=True))
        if keyword in ("RUN", "CMD", "ENTRYPOINT"):
            args, json_form = _words(rest, where) if rest.startswith("[") else ((rest,), False)
            if not json_form:  # shell form: the text as written (a leading `[[` is shell, not JSON)
                args = (rest,)
        elif keyword == "ENV":
            args, json_form = (rest,), False  # KEY=VALUE pairs or the legacy `KEY VALUE`: split by dockerplan
        else:
            args, json_form = _words(rest, where)
        steps.append(DockerStep(keyword, args, line, flags, heredocs, json_form, joined))
    return steps


def parse_dockerfile(path: Path) -> list[DockerStep]:
    """The instructions of a Dockerfile on disk (see parse_dockerfile_text)."""
    return parse_dockerfile_text(path.read_text(encoding="utf-8"), str(path))
