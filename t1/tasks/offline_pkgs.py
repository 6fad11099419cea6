"""Offline stand-ins for apt-get, pip and uv: succeed when what they would install is present, else name it.

This file is shipped into offline sandboxes as `t1_offline.py` (t1.tasks.toolchain)
and run there by the sandbox's own python3, so it uses the standard library
only and runs on Python 3.8+. `t1 tasks validate` runs the very same file with
the sandbox's PATH to predict what a task's installer lines will miss. One rule
for setup (Dockerfile RUN lines) and for tests (test.sh, run-tests.sh):

- apt-get/apt: update, clean, autoremove, remove, purge are no-ops; install
  succeeds when every package is installed (dpkg) or is a command on PATH;
- pip/pip3/python -m pip/uv pip install, uv add, uvx --with, uv run --with:
  succeed when every distribution is installed for this python3 (requirement
  files are read; pytest-json-ctrf is provided by T1's own --ctrf plugin);
- anything missing prints `t1-needs-network: <kind> packages not on this host:
  <names>` on stderr and exits non-zero (apt: 100, pip/uv: 1).
"""

from __future__ import annotations

import os
import re
import shutil
import sys

MARKER = "t1-needs-network:"
# provided by T1's toolchain: its --ctrf plugin, the host's pytest (shipped when python3 lacks it), the shims
PROVIDED = {"pytest-json-ctrf", "pytest-ctrf", "pytest", "pluggy", "iniconfig", "packaging", "pip", "setuptools",
            "wheel", "uv"}
_APT_NOOPS = {"update", "upgrade", "dist-upgrade", "clean", "autoclean", "autoremove", "remove", "purge"}
_PIP_VALUE_OPTS = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c", "--constraint",
                   "-t", "--target", "--prefix", "--root", "--python", "-p", "--trusted-host", "--platform",
                   "--python-version", "--implementation", "--abi", "--cache-dir", "--src", "--upgrade-strategy",
                   "--progress-bar", "--log", "--timeout", "--retries", "--index", "--default-index"}
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")


def _dpkg_installed() -> set[str]:
    names: set[str] = set()
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as f:
            package = ""
            for line in f:
                if line.startswith("Package: "):
                    package = line.split(None, 1)[1].strip()
                elif line.startswith("Status: ") and line.rstrip().endswith(" installed") and package:
                    names.add(package)
    except OSError:
        pass
    return names


def apt_packages(args: list[str]) -> list[str]:
    """The package names of an `apt-get install` argument list (options, versions, releases dropped)."""
    out, skip = [], False
    for a in args:
        if skip or a.startswith("-") or a == "install":
            skip = a in ("-o", "-t", "-c", "-a", "--option", "--target-release", "--config-file")
            continue
        out.append(re.split(r"[=/]", a, maxsplit=1)[0].split(":", 1)[0])
    return out


def apt_missing(packages: list[str]) -> list[str]:
    installed = _dpkg_installed()
    return [p for p in packages if p not in installed and shutil.which(p) is None]


def _requirements_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
    except OSError:
        return ["-r " + path]
    out: list[str] = []
    for line in lines:
        if line.startswith(("-r ", "--requirement ")):
            out += _requirements_file(os.path.join(os.path.dirname(path), line.split(None, 1)[1]))
        elif line and not line.startswith("-"):
            out.append(line)
    return out


def pip_requirements(args: list[str]) -> list[str]:
    """Requirement specifiers of a `pip install` / `uv add` argument list (requirement files read)."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-r", "--requirement") and i + 1 < len(args):
            out += _requirements_file(args[i + 1])
            i += 2
            continue
        if a in _PIP_VALUE_OPTS:
            i += 2
            continue
        if not a.startswith("-") and a != "install":
            out.append(a)
        i += 1
    return out


def dist_name(requirement: str) -> str | None:
    """The distribution a requirement names; None for paths, URLs and VCS links (not checkable offline)."""
    req = requirement.strip().strip("'\"")
    if not req or "://" in req or req.startswith((".", "/", "git+")) or os.path.exists(req):
        return None
    m = _NAME.match(req)
    return m.group(1) if m else None


def pip_missing(requirements: list[str]) -> list[str]:
    from importlib import metadata

    missing = []
    for req in requirements:
        if req.startswith("-r "):
            missing.append(req)
            continue
        name = dist_name(req)
        if name is None or name.lower().replace("_", "-") in PROVIDED:
            continue
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def missing_sentence(kind: str, missing: list[str]) -> str:
    """What a stand-in says after MARKER, and what validate predicts: one sentence for both."""
    return f"{kind} packages not on this host: {' '.join(dict.fromkeys(missing))} (the sandbox is offline)"


DOWNLOADERS = {
    "npm": ("ci", "install", "i", "add", "update"),
    "yarn": ("install", "add"),
    "pnpm": ("install", "i", "add"),
    "go": ("mod download", "get", "install"),
    "cargo": ("fetch", "install"),
}
"""Package managers' subcommands that download (outside apt, pip and uv): `npm ci`, `go mod download`, ..."""


def download_command(words: list[str]) -> str:
    """`npm ci`, `go mod download`, ... when `words` (a command's words) download packages; else ''."""
    if not words or words[0] not in DOWNLOADERS:
        return ""
    args = [w for w in words[1:] if not w.startswith("-")]
    for sub in DOWNLOADERS[words[0]]:
        if args[: len(sub.split())] == sub.split():
            return f"{words[0]} {sub}"
    return ""


def download_sentence(command: str) -> str:
    """What the stand-in of a package manager says after MARKER when its download failed, and validate predicts."""
    return f"{command} could not download its packages (the sandbox is offline)"


def _fail(kind: str, missing: list[str], code: int) -> int:
    sys.stderr.write(f"{MARKER} {missing_sentence(kind, missing)}\n")
    return code


def apt_main(args: list[str]) -> int:
    command = next((a for a in args if not a.startswith("-")), "")
    if command in _APT_NOOPS or command != "install":
        return 0
    missing = apt_missing(apt_packages(args[args.index("install") + 1:]))
    if missing:
        return _fail("apt", missing, 100)
    print("t1 offline apt: every package is already installed")
    return 0


def pip_main(args: list[str]) -> int:
    if not args or args[0] != "install":
        return 0
    missing = pip_missing(pip_requirements(args[1:]))
    if missing:
        return _fail("pip", missing, 1)
    print("t1 offline pip: requirements already satisfied")
    return 0


def uv_with(args: list[str]) -> list[str]:
    """The packages a uv/uvx command line asks for (--with, --from, uv add, uvx TOOL)."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-w", "--with", "--from") and i + 1 < len(args):
            out += [r for r in args[i + 1].split(",") if r]
            i += 2
            continue
        if a.startswith(("--with=", "--from=")):
            out += [r for r in a.split("=", 1)[1].split(",") if r]
        i += 1
    return out


_UV_VALUE_OPTS = {"-w", "--with", "--from", "-p", "--python", "--with-requirements", "--project", "--directory",
                  "--index", "--index-url", "--extra-index-url", "--default-index"}


def _strip_uv_options(args: list[str]) -> list[str]:
    """The words after uv's own options (the tool and its arguments)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in _UV_VALUE_OPTS else 1
    return args[i:]


def uv_main(args: list[str], tool: bool) -> int:
    if tool:
        rest = _strip_uv_options(args)
        from_given = any(a == "--from" or a.startswith("--from=") for a in args)
        wanted = uv_with(args) + ([] if from_given or not rest else [rest[0]])
    elif args[:1] == ["pip"]:
        return pip_main(args[1:])
    elif args[:1] == ["add"]:
        wanted = pip_requirements(args[1:])
    elif args[:1] == ["venv"]:
        # made afresh, as uv makes it: nothing of what was there before (an `activate` the agent left) is kept
        target = next((a for a in args[1:] if not a.startswith("-")), ".venv")
        if os.path.lexists(target):
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
        os.makedirs(os.path.join(target, "bin"))
        open(os.path.join(target, "bin", "activate"), "x").close()
        return 0
    elif args[:1] in (["run"], ["tool"]):
        wanted = uv_with(args)
    else:
        return 0
    missing = pip_missing(wanted)
    return _fail("pip", missing, 1) if missing else 0


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: t1_offline.py apt|pip|uv|uvx|missing-apt|missing-pip ARGS...\n")
        return 2
    kind, args = argv[0], argv[1:]
    if kind == "missing-apt":
        print(" ".join(apt_missing(args)))
        return 0
    if kind == "missing-pip":
        print(" ".join(pip_missing(args)))
        return 0
    if kind == "download-failed":  # a package manager's download failed offline: say so (the stand-in runs it)
        command = download_command(args)
        if command:
            sys.stderr.write(f"{MARKER} {download_sentence(command)}\n")
        return 0
    handlers = {"apt": apt_main, "pip": pip_main}
    if kind in handlers:
        return handlers[kind](args)
    return uv_main(args, tool=kind == "uvx")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
