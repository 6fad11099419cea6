"""The verifier's environment: built from system and test dirs only, whatever the task's environment points at.

A task's environment may point into places the agent can write (`ENV PATH="/root/.local/bin:$PATH"`,
`ENV PYTHONPATH=/app`, `BASH_ENV`, `LD_LIBRARY_PATH=/app/lib`): in the agent's shells that is the
task's container as its author meant it, but a verifier that followed it would run and load what
the agent planted there. So the variables that make a program run or load a file (`LOADER_LISTS`,
`LOADER_FILES`) keep, in a verifier's environment, only entries in the dirs the verifier takes from
the system as setup left it (`TRUSTED_TOP`: /usr, /bin, /opt, ...; `t1.sandbox.verifier.enter_verifier`),
/tests and the verifier's own toolchain. Entries of PYTHONPATH outside them are not lost: T1's pytest
appends them to `sys.path` after start-up, last (`AGENT_PYTHONPATH`), so tests still import the
agent's modules, but nothing there runs at start-up (`sitecustomize.py`) or shadows a module of the
system or of T1's pytest.

Git reads the configuration of the repository it works in, and the verifier inspects the agent's
repository (`safe.directory=*`: it belongs to another uid). Command-line configuration
(`GIT_CONFIG_COUNT`, which wins over the repository's) turns off what would run a program the
repository names: hooks, the fsmonitor, pagers, editors, ssh and askpass commands, credential
helpers. Programs a repository names per driver (`filter.*`, `diff.*`) are turned off by the
verifier toolchain's `git` (`t1.tasks.toolchain`). Pure functions.
"""

from __future__ import annotations

import posixpath
import re

from t1.sandbox.verifier.verifier_role import VERIFIER_HOME

TRUSTED_TOP = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt", "etc")
"""Top-level dirs a verifier session takes from the system as setup left it (`enter_verifier.PRISTINE_TOP`)."""
TESTS_DIR = "/tests"
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
"""Always on a verifier's PATH, after the task's trusted entries (a task PATH that left them out still finds them)."""
AGENT_PYTHONPATH = "T1_AGENT_PYTHONPATH"
"""PYTHONPATH entries outside the trusted dirs, which T1's pytest appends to `sys.path` last."""

LOADER_LISTS = {
    "PATH": ":", "PYTHONPATH": ":", "LD_LIBRARY_PATH": ":", "LD_PRELOAD": ": ", "LD_AUDIT": ":",
    "PERL5LIB": ":", "PERLLIB": ":", "RUBYLIB": ":", "NODE_PATH": ":", "GEM_PATH": ":", "CLASSPATH": ":",
    "LUA_PATH": ";", "LUA_CPATH": ";", "R_LIBS": ":", "R_LIBS_USER": ":", "R_LIBS_SITE": ":", "GCONV_PATH": ":",
    "JULIA_LOAD_PATH": ":", "GUILE_LOAD_PATH": ":", "TCLLIBPATH": " ", "OCAMLPATH": ":",
}
"""Search lists of programs, libraries and modules (name -> separators): untrusted entries are dropped."""
LOADER_FILES = (
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "BASH_ENV",
    "ENV",
    "PROMPT_COMMAND",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONEXECUTABLE",
    "PERL5OPT",
    "RUBYOPT",
    "NODE_OPTIONS",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "GEM_HOME",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "R_PROFILE",
    "R_PROFILE_USER",
    "R_ENVIRON",
    "R_ENVIRON_USER",
    "GIT_EXEC_PATH",
    "GIT_TEMPLATE_DIR",
    "GIT_CONFIG",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "GIT_EXTERNAL_DIFF",
    "GIT_PAGER",
    "GIT_EDITOR",
    "PAGER",
    "EDITOR",
    "VISUAL",
    "LESSOPEN",
    "LESSCLOSE",
    "PIP_CONFIG_FILE",
    "NPM_CONFIG_USERCONFIG",
    "npm_config_userconfig",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "GOFLAGS",
    "GOENV",
    "PYTEST_ADDOPTS",
    "PYTEST_PLUGINS",
)
"""Variables naming one file or program to run, or options that may load one: dropped when they name an
untrusted path (or any `$` expansion, which the host cannot resolve)."""

GIT_CONFIG = (("safe.directory", "*"), ("core.fsmonitor", "false"), ("core.hooksPath", "/dev/null"),
              ("core.pager", "cat"), ("core.editor", ":"), ("sequence.editor", ":"), ("core.sshCommand", "ssh"),
              ("core.askPass", ""), ("credential.helper", ""), ("core.alternateRefsCommand", ""),
              ("interactive.diffFilter", ""), ("gpg.program", "gpg"), ("gpg.ssh.program", "ssh-keygen"),
              ("gpg.x509.program", "gpgsm"))
"""Command-line git configuration of every verifier session (wins over the repository's)."""
GIT_ENV = {"GIT_PAGER": "cat", "PAGER": "cat", "GIT_EDITOR": ":", "GIT_SEQUENCE_EDITOR": ":", "GIT_ASKPASS": "",
           "SSH_ASKPASS": "", "GIT_TERMINAL_PROMPT": "0"}

_PATHS = re.compile(r"(?<![\w.-])/[^\s:;=,\"']*")


def trusted_dir(path: str) -> bool:
    """Whether `path` lies in a dir the agent cannot have changed for the verifier (pure)."""
    if not path.startswith("/") or "$" in path or "/../" in f"{path}/":
        return False
    norm = posixpath.normpath(path)
    top = norm.split("/")[1]
    return top in TRUSTED_TOP or any(norm == d or norm.startswith(f"{d}/") for d in (TESTS_DIR, VERIFIER_HOME))


def _split(value: str, seps: str) -> list[str]:
    return [e for e in re.split(f"[{re.escape(seps)}]", value) if e]


def _names_untrusted(value: str) -> bool:
    return "$" in value or "`" in value or any(not trusted_dir(p) for p in _PATHS.findall(value))


def trusted_env(env: dict[str, str]) -> dict[str, str]:
    """`env` as a verifier may use it: loader variables keep only trusted entries (see the module docstring).

    PATH always ends with the system dirs; untrusted PYTHONPATH entries move to `AGENT_PYTHONPATH`.
    """
    out = dict(env)
    for name, seps in LOADER_LISTS.items():
        if name not in out:
            continue
        entries = _split(out.pop(name), seps)
        kept = [e for e in entries if trusted_dir(e)]
        if name == "PYTHONPATH":
            agent = [e for e in entries if not trusted_dir(e) and "$" not in e]
            if agent:
                out[AGENT_PYTHONPATH] = ":".join(agent)
        if kept:
            out[name] = (":" if ":" in seps else seps[0]).join(kept)
    for name in LOADER_FILES:
        if name in out and _names_untrusted(out[name]):
            del out[name]
    path = [e for e in out.get("PATH", "").split(":") if e]
    out["PATH"] = ":".join(dict.fromkeys([*path, *SYSTEM_PATH]))
    return out


def git_hardening() -> dict[str, str]:
    """Environment that makes git run no program the repository names (pure; see the module docstring)."""
    env = {"GIT_CONFIG_COUNT": str(len(GIT_CONFIG))}
    for i, (key, value) in enumerate(GIT_CONFIG):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return {**env, **GIT_ENV}


def verifier_env(env: dict[str, str]) -> dict[str, str]:
    """A verifier session's environment: the agent's as a verifier may use it (`trusted_env`), a home and a
    TMPDIR of its own (its storage: an agent that filled /tmp does not stop pytest), and git hardened (pure). Git
    refuses repositories owned by another uid; the verifier inspects the
    agent's (root's) as a root verifier would, so every directory is marked safe for it."""
    return {**trusted_env(env), "HOME": VERIFIER_HOME, "TMPDIR": VERIFIER_HOME, "USER": "t1-verifier",
            "LOGNAME": "t1-verifier", **git_hardening()}
