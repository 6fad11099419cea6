"""Find installer commands in shell text (bashlex), and check what they ask for against this host.

Used by `t1 tasks validate` to predict a needs_network report before running a
task: the Dockerfile's RUN lines and the test scripts are parsed, each simple
command that installs something (apt-get/apt install, pip/pip3/python -m pip/uv
pip install, uv add, uvx and uv run --with) becomes an Install, and so does each
command that downloads outside those (`npm ci`, `go mod download`, `cargo fetch`, a
curl or wget of a URL, piped into a shell or not: kind `offline`, whose one entry is
the sentence the stand-ins print when it fails offline), and `missing_on_host` asks the sandbox's own python3 (with the
sandbox PATH) through t1.tasks.offline_pkgs, the file the stand-ins run, which
of its packages are absent. Text bashlex cannot parse is split on ; && || | and
newlines instead.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bashlex

from t1.sandbox.isolation.bwrap import SANDBOX_PATH
from t1.tasks import offline_pkgs
from t1.tasks.toolchain import KNOWN_INSTALLERS


@dataclass(frozen=True, slots=True)
class Install:
    """One installer command: what kind, what it asks for (package names or a URL), and the command text."""

    kind: str  # apt | pip | offline
    packages: tuple[str, ...]
    command: str


def _commands(text: str) -> list[list[str]]:
    try:
        trees = bashlex.parse(text)
    except Exception:  # bashlex raises several error types on shell it does not know; fall back to splitting
        return _split_commands(text)
    out: list[list[str]] = []

    def walk(node: object) -> None:
        kind = getattr(node, "kind", "")
        if kind == "command":
            parts = getattr(node, "parts", None) or []
            out.append([p.word for p in parts if getattr(p, "kind", "") == "word"])
        for child in (getattr(node, "parts", None) or []) + (getattr(node, "list", None) or []):
            walk(child)
        inner = getattr(node, "command", None)
        if inner is not None and hasattr(inner, "kind"):
            walk(inner)

    for tree in trees:
        walk(tree)
    return out


def _split_commands(text: str) -> list[list[str]]:
    out = []
    for piece in re.split(r"&&|\|\||;|\||\n", text):
        try:
            words = shlex.split(piece, comments=True)
        except ValueError:
            words = piece.split()
        if words:
            out.append(words)
    return out


def _strip_prefix(words: list[str]) -> list[str]:
    while words and (words[0] in ("sudo", "env", "exec", "time", "command") or re.match(r"^\w+=", words[0])):
        words = words[1:]
    return words


RequirementFile = Callable[[str], Path | None]
"""Maps a requirement file as a command names it to its copy in the task folder (None: no copy to read)."""


def _requirement_files(args: list[str], resolve: RequirementFile | None) -> list[str]:
    """`-r FILE` pointed at the task folder's copy; a file with no copy there is dropped, not called missing
    (a RUN line may write it; the stand-in reads it in the sandbox at run time)."""
    if resolve is None:
        return args
    out, i = [], 0
    while i < len(args):
        if args[i] in ("-r", "--requirement") and i + 1 < len(args):
            host = resolve(args[i + 1])
            out += ["-r", str(host)] if host is not None else []
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


_URL = re.compile(r"^(?:https?|ftp)://")
_LOCAL = re.compile(r"^(?:https?|ftp)://(?:localhost|127\.|\[::1\])")


def _offline(tool: str, rest: list[str], text: str) -> Install | None:
    """A download outside apt/pip/uv, named as its stand-in names it when the sandbox is offline."""
    command = offline_pkgs.download_command([tool, *rest])
    if command:
        return Install("offline", (offline_pkgs.download_sentence(command),), text)
    url = next((w for w in rest if _URL.match(w)), None)
    if tool in ("curl", "wget") and url and not _LOCAL.match(url) and not any(k in url for k in KNOWN_INSTALLERS):
        return Install("offline", (f"{tool} could not download {url} (the sandbox is offline)",), text)
    return None


def _classify(words: list[str], resolve: RequirementFile | None = None) -> Install | None:
    words = _strip_prefix(words)
    if not words:
        return None
    tool, rest = Path(words[0]).name, words[1:]
    text = " ".join(words)
    offline = _offline(tool, rest, text)
    if offline is not None:
        return offline
    if tool in ("apt-get", "apt") and "install" in rest:
        return Install("apt", tuple(offline_pkgs.apt_packages(rest[rest.index("install") + 1:])), text)
    if re.fullmatch(r"python3?(\.\d+)?", tool) and rest[:2] == ["-m", "pip"]:
        tool, rest = "pip", rest[2:]
    if tool == "uv" and rest[:1] == ["pip"]:
        tool, rest = "pip", rest[1:]
    if re.fullmatch(r"pip3?(\.\d+)?", tool) and rest[:1] == ["install"]:
        return Install("pip", tuple(offline_pkgs.pip_requirements(_requirement_files(rest[1:], resolve))), text)
    if tool == "uv" and rest[:1] == ["add"]:
        return Install("pip", tuple(offline_pkgs.pip_requirements(_requirement_files(rest[1:], resolve))), text)
    if tool == "uv" and rest[:1] in (["run"], ["tool"]):
        return Install("pip", tuple(offline_pkgs.uv_with(rest)), text) if offline_pkgs.uv_with(rest) else None
    if tool == "uvx":
        tool_words = offline_pkgs._strip_uv_options(rest)
        wanted = offline_pkgs.uv_with(rest) + tool_words[:1]
        return Install("pip", tuple(wanted), text)
    return None


def find_installs(text: str, resolve: RequirementFile | None = None) -> list[Install]:
    """Every installer or download command in a shell script or RUN line, in order.

    With `resolve`, requirement files (`pip install -r FILE`) are read from the task folder's copy of FILE.
    """
    return [i for words in _commands(text) if (i := _classify(words, resolve)) is not None and i.packages]


def _ask(kind: str, names: tuple[str, ...]) -> list[str]:
    script = Path(offline_pkgs.__file__)
    result = subprocess.run(["python3", str(script), f"missing-{kind}", *names], capture_output=True, text=True,
                            env={"PATH": SANDBOX_PATH}, timeout=60, check=False)
    if result.returncode != 0:  # no python3 on the sandbox PATH: ask this interpreter
        result = subprocess.run([sys.executable, str(script), f"missing-{kind}", *names], capture_output=True,
                                text=True, timeout=60, check=False)
    return result.stdout.split()


def missing_on_host(install: Install) -> list[str]:
    """What of the install is absent here: package names, or the URL of a download the sandbox cannot make."""
    if install.kind == "offline":
        return list(install.packages)
    return _ask(install.kind, install.packages)
