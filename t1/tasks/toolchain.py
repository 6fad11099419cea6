"""The installer stand-ins for offline sandboxes, for setup and tests alike: pytest, pip, uv, apt, curl.

Benchmark Dockerfiles and test scripts install their tools from the internet
(`apt-get install -y curl`, `pip install pandas`, `curl -LsSf
https://astral.sh/uv/install.sh | sh`, `uvx --with pytest pytest ...`). Offline
sandboxes cannot, so before a Dockerfile's RUN lines (under STAND_INS_DIR) and before the verifier T1
uploads, under TOOLCHAIN_DIR:
- site/: t1_offline.py (t1.tasks.offline_pkgs: the one rule for what counts as
  installed), the host's pytest and its pure-Python dependencies (only if the
  sandbox's python3 cannot import pytest already), a shadow `pip` module, and a
  small pytest plugin that honours `--ctrf FILE` (pytest-json-ctrf's option);
- bin/: stand-ins for apt-get, apt, pip, pip3, uv, uvx, pytest, python, curl and
  wget, and wrappers of npm, yarn, pnpm, go and cargo (the real tool; a failed download
  says the sandbox is offline). They succeed offline when what they would install is already present and
  otherwise name what is missing after NEEDS_NETWORK_MARKER (a setup line that
  prints it is a needs_network report, not a setup failure). Known installer
  scripts fetched with curl or wget (uv, pip, poetry) are replaced by a script that
  installs nothing and leaves what the real one leaves in ~/.local/bin (uv's: env,
  uv and uvx, which run the offline uv); any other download runs the real tool and, when it cannot connect,
  says the sandbox is offline. Each use is logged, and the report lists them.
"""

from __future__ import annotations

import compileall
import importlib.metadata as md
import io
import shutil
import tarfile
import tempfile
from functools import cache
from pathlib import Path

from t1.sandbox.types import Shell
from t1.sandbox.verifier.verifier_env import AGENT_PYTHONPATH, TRUSTED_TOP
from t1.tasks import offline_pkgs
from t1.tasks.transfer import check, upload_archive

TOOLCHAIN_DIR = "/tmp/.t1-verifier"
"""The verifier's toolchain: a folder only the verifier's uid can reach (t1.sandbox.verifier.verifier_role)."""
STAND_INS_DIR = "/tmp/.t1-setup"
"""The agent-side stand-ins of setup and reference solutions (the agent's uid cannot enter TOOLCHAIN_DIR)."""
SHIM_LOG = f"{TOOLCHAIN_DIR}/shims.log"
NEEDS_NETWORK_MARKER = offline_pkgs.MARKER
PYTEST_DISTS = ("pytest", "pluggy", "iniconfig", "packaging")  # pygments: only for colour on a tty
KNOWN_INSTALLERS = ("astral.sh/uv", "get-pip.py", "install.python-poetry", "python-poetry.org/install")

_LOG = f'echo "$(basename "$0") $*" >> {SHIM_LOG} 2>/dev/null'
_OFFLINE = f"python3 {TOOLCHAIN_DIR}/site/t1_offline.py"
_REAL_PATH = f'PATH="${{PATH#{TOOLCHAIN_DIR}/bin:}}"'
# pytest runs with site/ first on its path even where a test script set PYTHONPATH itself (DevEval's
# run-tests.sh does `export PYTHONPATH=$(pwd)`), or the pytest shipped into site/ is not found
_SITE_FIRST = f'PYTHONPATH="{TOOLCHAIN_DIR}/site${{PYTHONPATH:+:$PYTHONPATH}}"'
_APT = f"""#!/bin/bash
{_LOG}
exec {_OFFLINE} apt "$@"
"""
_PIP = f"""#!/bin/bash
{_LOG}
case "$1" in
  install) exec {_OFFLINE} pip "$@";;
  --version|-V) echo "pip (t1 offline stand-in)"; exit 0;;
  list|freeze|show|check) {_REAL_PATH} exec python3 -I -m pip "$@";;
  *) exit 0;;
esac
"""
PYTEST_MAIN = f"python3 -I {TOOLCHAIN_DIR}/site/t1_pytest.py"
"""How T1 starts pytest (its own verifier and the pytest, python -m pytest, uv and uvx stand-ins): see
`_PYTEST_RUNNER`."""
_PYTEST_RUNNER = f'''"""T1's pytest: plugins from the system's and T1's dirs only; the agent's dirs last on sys.path.

Started with `python3 -I`: no working directory, PYTHONPATH or user site at start-up. This folder and the
trusted PYTHONPATH entries come first; the pytest11 entry points of the distributions found there are the
plugins (autoload off, so no distribution in the working directory or another agent dir registers one);
then the working directory and the other PYTHONPATH entries are appended, so tests import the agent's
modules, which can neither run at start-up nor stand in for pytest or a module of the system.
"""
import importlib.metadata, os, posixpath, sys

TRUSTED_TOP = {TRUSTED_TOP!r}
HERE = os.path.dirname(os.path.abspath(__file__))


def trusted(path):
    norm = posixpath.normpath(path)
    return path.startswith("/") and "/../" not in path + "/" and (
        norm.split("/")[1] in TRUSTED_TOP or norm == "/tests" or norm.startswith("/tests/")
        or norm == HERE or norm.startswith(posixpath.dirname(HERE) + "/"))


env_path = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
sys.path[0:0] = [HERE] + [p for p in env_path if trusted(p) and p != HERE]
plugins = {{}}
for dist in importlib.metadata.distributions(path=list(sys.path)):
    for ep in dist.entry_points:
        if ep.group == "pytest11":
            plugins.setdefault(ep.name, ep)
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
loaded = [ep.load() for ep in plugins.values()]
agent = [os.getcwd(), *[p for p in env_path if not trusted(p)], *os.environ.get("{AGENT_PYTHONPATH}", "").split(":")]
sys.path += [p for p in dict.fromkeys(agent) if p and p not in sys.path]
import pytest  # noqa: E402

sys.argv[0] = "pytest"
sys.exit(pytest.main(sys.argv[1:], plugins=loaded))
'''
_UV = f"""#!/bin/bash
{_LOG}
strip_opts() {{ while [ $# -gt 0 ]; do case "$1" in
  -p|--python|-w|--with|--from|--with-requirements|--project|--directory|--index|--index-url) shift 2;;
  --*=*|-q|--quiet|--no-project|--isolated|--frozen|--locked|--no-sync|-v|--active) shift;;
  *) break;; esac; done; printf '%s\\0' "$@"; }}
run_tool() {{ if [ "$1" = pytest ] || [ "$1" = py.test ]; then shift; {_SITE_FIRST} exec {PYTEST_MAIN} "$@"; fi
  if [ "$1" = python ] || [ "$1" = python3 ]; then shift; exec python3 "$@"; fi; exec "$@"; }}
name=$(basename "$0")
if [ "$name" = uvx ]; then {_OFFLINE} uvx "$@" || exit 1
  mapfile -d '' args < <(strip_opts "$@"); run_tool "${{args[@]}}"; fi
case "$1" in
  run) {_OFFLINE} uv "$@" || exit 1; shift; mapfile -d '' args < <(strip_opts "$@"); run_tool "${{args[@]}}";;
  tool) shift; [ "$1" = run ] && shift; {_OFFLINE} uvx "$@" || exit 1
        mapfile -d '' args < <(strip_opts "$@"); run_tool "${{args[@]}}";;
  pip|add|venv) exec {_OFFLINE} uv "$@";;
  --version|version) echo "uv (t1 offline stand-in)";;
  *) exit 0;;
esac
"""
_PYTEST = f"""#!/bin/bash
{_LOG}
{_SITE_FIRST} exec {PYTEST_MAIN} "$@"
"""
_PYTHON3 = f"""#!/bin/bash
if [ "$1" = -m ] && {{ [ "$2" = pytest ] || [ "$2" = py.test ]; }}; then shift 2; {_SITE_FIRST} exec {PYTEST_MAIN} "$@"; fi
IFS=: read -ra dirs <<< "$PATH"
for d in "${{dirs[@]}}"; do [ "$d" != {TOOLCHAIN_DIR}/bin ] && [ -x "$d/python3" ] && exec "$d/python3" "$@"; done
exec /usr/bin/python3 "$@"
"""  # noqa: E501
_PYTHON = """#!/bin/bash
exec python3 "$@"
"""
def _left_tool(name: str) -> str:
    """What an installer stand-in leaves at ~/.local/bin/NAME: the offline stand-in of NAME, wherever T1 put it,
    as the real installer leaves its binary there (`cp ~/.local/bin/uv /usr/local/bin/` works). The verifier's
    copy first: only the verifier's uid can create that folder, where the agent could plant setup's."""
    return (f"#!/bin/sh\nfor d in {TOOLCHAIN_DIR}/bin {STAND_INS_DIR}/bin; do "
            f'[ -x "$d/{name}" ] && exec "$d/{name}" "$@"; done\n'
            f'echo "{name}: t1 offline stand-in, not available in this shell" >&2; exit 127\n')


def _installer_script(leaves: tuple[str, ...]) -> str:
    """The script a known installer's URL yields offline: $HOME/.local/bin/env and the tools the installer leaves."""
    tools = "".join(f"cat > \"$HOME/.local/bin/{name}\" <<'T1_TOOL'\n{_left_tool(name)}T1_TOOL\n"
                    f"chmod 755 \"$HOME/.local/bin/{name}\"\n" for name in leaves)
    return ('mkdir -p "$HOME/.local/bin" 2>/dev/null; : > "$HOME/.local/bin/env" 2>/dev/null\n'
            f"{tools}echo \"t1 offline stand-in: installer skipped\"\n")


INSTALLER_LEAVES = {"astral.sh/uv": ("uv", "uvx")}
"""What a known installer leaves in ~/.local/bin besides `env` (uv's installer: the uv and uvx binaries)."""


_GIT = f"""#!/bin/bash
# The verifier's git: the system's, with every program the repository's configuration names turned off.
IFS=: read -ra dirs <<< "$PATH"
real=
for d in "${{dirs[@]}}"; do [ "$d" != {TOOLCHAIN_DIR}/bin ] && [ -x "$d/git" ] && {{ real="$d/git"; break; }}; done
[ -n "$real" ] || {{ echo "git: command not found" >&2; exit 127; }}
opts=()
while IFS= read -r -d '' key; do
  name=${{key##*.}}; name=${{name,,}}
  case "${{key,,}}" in pager.*) opts+=(-c "$key=false"); continue;; alias.*) opts+=(-c "$key=status"); continue;; esac
  case "$name" in
    textconv|clean|smudge|pager) opts+=(-c "$key=cat");;
    editor) opts+=(-c "$key=:");;
    fsmonitor) opts+=(-c "$key=false");;
    hookspath) opts+=(-c "$key=/dev/null");;
    uploadpack) opts+=(-c "$key=git-upload-pack");;
    receivepack) opts+=(-c "$key=git-receive-pack");;
    required) opts+=(-c "$key=false");;
    *cmd|*command|*program|driver|helper|process|askpass|*proxy|external|difffilter|vcs) opts+=(-c "$key=");;
  esac
done < <("$real" config --includes --null --name-only --list 2>/dev/null)
args=("$@"); i=0
while [ $i -lt ${{#args[@]}} ]; do case "${{args[$i]}}" in
  -C|-c|--git-dir|--work-tree|--namespace|--config-env|--exec-path) i=$((i + 2));;
  -*) i=$((i + 1));;
  *) break;; esac; done
case "${{args[$i]}}" in
  diff|log|show|whatchanged|format-patch|diff-tree|diff-index|diff-files|range-diff)
    args=("${{args[@]:0:$((i + 1))}}" --no-ext-diff "${{args[@]:$((i + 1))}}");;
esac
exec "$real" -c protocol.ext.allow=never "${{opts[@]}}" "${{args[@]}}"
"""


def _fetcher(tool: str) -> str:
    cases = "".join(f"  *{known}*)\n    {_LOG}\n    cat <<'T1_INSTALLER'\n"
                    f"{_installer_script(INSTALLER_LEAVES.get(known, ()))}T1_INSTALLER\n    exit 0;;\n"
                    for known in KNOWN_INSTALLERS)
    return f"""#!/bin/bash
for a in "$@"; do case "$a" in
{cases}esac; done
{_REAL_PATH} {tool} "$@"; s=$?
case "{tool}:$s" in
  curl:5|curl:6|curl:7|curl:28|curl:35|wget:4)
    url=$(printf '%s\\n' "$@" | grep -m1 -E '^(https?|ftp)://')
    echo "{NEEDS_NETWORK_MARKER} {tool} could not download ${{url:-its URL}} (the sandbox is offline)" >&2;;
esac
exit $s
"""


def _downloader(tool: str) -> str:
    """A package manager run for real (its own, after T1's folder on PATH); when it fails, a download
    subcommand (offline_pkgs.DOWNLOADERS: `npm ci`, `go mod download`, `cargo fetch`) says the sandbox is offline."""
    return f"""#!/bin/bash
{_LOG}
{_REAL_PATH} {tool} "$@"; s=$?
[ $s -ne 0 ] && {_OFFLINE} download-failed {tool} "$@"
exit $s
"""


_PIP_MODULE = """import os, sys
os.execvp("pip", ["pip", *sys.argv[1:]])
"""
_CTRF_PLUGIN = '''"""--ctrf FILE: write a CTRF JSON report (results.tests[].name/status), as pytest-json-ctrf does."""
import json, time

def pytest_addoption(parser):
    parser.getgroup("ctrf").addoption("--ctrf", default=None, help="write a CTRF JSON report")

def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = config.getoption("ctrf")
    if not path:
        return
    tests = []
    for status in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        for rep in terminalreporter.stats.get(status, []):
            if getattr(rep, "when", "call") not in ("call", "setup", "teardown") or not hasattr(rep, "nodeid"):
                continue
            s = {"error": "other", "xfailed": "passed", "xpassed": "failed"}.get(status, status)
            crash = getattr(getattr(rep, "longrepr", None), "reprcrash", None)
            test = {"name": rep.nodeid, "status": s, "duration": getattr(rep, "duration", 0.0)}
            if s in ("failed", "other") and crash is not None:
                test["message"] = str(crash.message)
            tests.append(test)
    summary = {"tests": len(tests), "passed": sum(t["status"] == "passed" for t in tests),
               "failed": sum(t["status"] == "failed" for t in tests), "start": 0, "stop": int(time.time() * 1000)}
    with open(path, "w") as f:
        json.dump({"results": {"tool": {"name": "pytest"}, "summary": summary, "tests": tests}}, f)
'''
_CTRF_DIST = {"METADATA": "Metadata-Version: 2.1\nName: t1-ctrf\nVersion: 0.0\n",
              "entry_points.txt": "[pytest11]\nt1_ctrf = t1_ctrf_plugin\n"}
SHIMS = {
    "git": _GIT,
    "pip": _PIP,
    "pip3": _PIP,
    "uv": _UV,
    "uvx": _UV,
    "pytest": _PYTEST,
    "python": _PYTHON,
    "python3": _PYTHON3,
    "curl": _fetcher("curl"),
    "wget": _fetcher("wget"),
    "apt-get": _APT,
    "apt": _APT,
    **{tool: _downloader(tool) for tool in offline_pkgs.DOWNLOADERS},
}


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _copy_dists(site: Path) -> None:
    for dist_name in PYTEST_DISTS:
        dist = md.distribution(dist_name)
        for f in dist.files or ():
            if "__pycache__" in f.parts or f.parts[0].startswith(".."):
                continue
            src = Path(str(dist.locate_file(f)))
            if src.is_file():
                dest = site / f.as_posix()
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)


@cache
def toolchain_archive(with_pytest: bool, root: str = TOOLCHAIN_DIR) -> bytes:
    """A gzipped tar of bin/ (shims) and site/ (plugin, pip shadow, and optionally the host's pytest).

    The pytest files ship with bytecode compiled by the host interpreter; a sandbox python of the same
    minor version uses it (no compile on every verifier run), any other ignores it.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for name, text in SHIMS.items():  # the shims name their folder: moved to `root`
            _add(tar, f"bin/{name}", text.replace(TOOLCHAIN_DIR, root).encode(), 0o755)
        _add(tar, "site/t1_ctrf_plugin.py", _CTRF_PLUGIN.encode())
        _add(tar, "site/t1_pytest.py", _PYTEST_RUNNER.replace(TOOLCHAIN_DIR, root).encode())
        _add(tar, "site/t1_offline.py", Path(offline_pkgs.__file__).read_bytes())
        _add(tar, "site/pip/__init__.py", b"")
        _add(tar, "site/pip/__main__.py", _PIP_MODULE.encode())
        for fname, text in _CTRF_DIST.items():
            _add(tar, f"site/t1_ctrf-0.0.dist-info/{fname}", text.encode())
        if with_pytest:
            with tempfile.TemporaryDirectory() as tmp:
                site = Path(tmp)
                _copy_dists(site)
                compileall.compile_dir(str(site), quiet=2, workers=1)
                for child in sorted(site.iterdir()):
                    tar.add(str(child), arcname=f"site/{child.name}")
    return buf.getvalue()


def toolchain_prefix(root: str = TOOLCHAIN_DIR) -> str:
    """Shell prefix that puts the toolchain at `root` first (keeps the sandbox's own PATH and PYTHONPATH after it)."""
    return (f'export PATH="{root}/bin:$PATH" '
            f'PYTHONPATH="{root}/site${{PYTHONPATH:+:$PYTHONPATH}}"; ')


def needs_network_lines(output: str) -> list[str]:
    """What the stand-ins said was missing (the text after NEEDS_NETWORK_MARKER), each once, in order."""
    return list(dict.fromkeys(line.split(NEEDS_NETWORK_MARKER, 1)[1].strip() for line in output.splitlines()
                              if NEEDS_NETWORK_MARKER in line))


async def install_stand_ins(shell: Shell) -> None:
    """Only the installer stand-ins and t1_offline.py (no pytest): what a Dockerfile's RUN lines need."""
    await check(shell, f"rm -rf {STAND_INS_DIR}", "clear installer stand-ins")
    await upload_archive(shell, toolchain_archive(False, STAND_INS_DIR), STAND_INS_DIR, "installer stand-ins")


async def remove_stand_ins(shell: Shell) -> None:
    """After setup: the agent's sandbox keeps no trace of them (the verifier installs its own)."""
    await check(shell, f"rm -rf {STAND_INS_DIR}", "remove installer stand-ins")
