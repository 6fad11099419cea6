"""Harbor task.toml schema 1.0-1.4: the keys of each table, env templates, and the environment table itself.

Every key Harbor's TaskConfig defines is listed here, so each one is either
honoured (read into the TaskSpec) or refused by name (t1.tasks.needs.predict); keys
outside the schema are kept as `ignored_fields` for `t1 tasks validate` to show.
`[environment].env` values may be templates resolved from the host, as Harbor
does: `${VAR}` and `${VAR:-default}`; a template naming an unset variable with no
default, like a network allowlist, is recorded in `EnvironmentSpec.refused` and
refused by name when the task runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from t1.tasks.formats.fields import Fields
from t1.tasks.spec import Env, EnvironmentSpec

SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
KEYS: dict[str, tuple[str, ...]] = {
    "": ("schema_version", "version", "task", "metadata", "verifier", "agent", "environment", "solution", "source",
         "multi_step_reward_strategy", "steps", "artifacts"),
    "task": ("name", "version", "description", "authors", "keywords"),
    "environment": ("build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "gpus",
                    "gpu_types", "tpu", "allow_internet", "network_mode", "allowed_hosts", "mcp_servers", "env",
                    "skills_dir", "healthcheck", "workdir", "memory", "storage"),
    "verifier": ("timeout_sec", "env", "user", "environment_mode", "environment", "network_mode", "allowed_hosts",
                 "collect"),
    "agent": ("timeout_sec", "user", "network_mode", "allowed_hosts"),
    "solution": ("env",),
    "steps": ("name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"),
    "healthcheck": ("command", "interval_sec", "timeout_sec", "start_period_sec", "start_interval_sec", "retries"),
}
HARBOR_DEFAULT_TIMEOUT_SEC = 600.0
_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


def unknown_keys(f: Fields, section: str, name: str) -> list[str]:
    """The keys of table `f` (schema section `section`) that Harbor's schema does not define, by dotted name."""
    known = KEYS[section]
    return [f"{name}.{k}" if name else k for k in f.data if k not in known]


def resolve_env(f: Fields, key: str, where: str) -> tuple[Env, tuple[str, ...]]:
    """A table of NAME = value with ${VAR} / ${VAR:-default} resolved from this host, and the entries left unset."""
    unset: list[str] = []
    out = []
    for name, value in f.env(key):
        def sub(m: re.Match[str], name: str = name) -> str:
            got = os.environ.get(m.group(1))
            if got is not None:
                return got
            if m.group(2) is not None:
                return m.group(2)
            unset.append(f"{where}.{name}: ${{{m.group(1)}}} is not set on this host and has no default")
            return ""
        out.append((name, _TEMPLATE.sub(sub, value)))
    return tuple(out), tuple(dict.fromkeys(unset))


def _size_mb(env: Fields, key: str) -> int | None:
    if env.has(f"{key}_mb"):
        return env.integer(f"{key}_mb")
    if not env.has(key):
        return None
    text = env.text(key)
    m = _MEMORY.match(text)
    if not m:
        raise env.error(key, f"expected a size like '2G' or '512M', got {text!r}")
    scale = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return max(1, int(float(m.group(1)) * scale))


def _network(env: Fields) -> bool:
    allow = env.flag("allow_internet", True)
    if not env.has("network_mode"):
        return allow
    mode = env.text("network_mode")
    if mode not in ("public", "no-network", "allowlist"):
        raise env.error("network_mode", f"expected 'public', 'no-network' or 'allowlist', got {mode!r}")
    if "allow_internet" in env.data and allow != (mode == "public"):
        raise env.error("network_mode", f"{mode!r} conflicts with allow_internet = {str(allow).lower()}")
    return mode == "public"


def _mcp_names(env: Fields) -> tuple[str, ...]:
    raw = env.data.get("mcp_servers") or []
    if not isinstance(raw, list):
        raise env.error("mcp_servers", "expected an array of tables ([[environment.mcp_servers]])")
    return tuple(str(s.get("name", f"#{i}")) if isinstance(s, dict) else f"#{i}" for i, s in enumerate(raw))


def environment_spec(env: Fields, *, dockerfile: Path | None, files_dir: Path | None,
                     compose_file: Path | None) -> EnvironmentSpec:
    """An [environment] (or [verifier.environment]) table as an EnvironmentSpec."""
    values, refused = resolve_env(env, "env", f"{env.prefix}.env")
    allowed = env.str_list("allowed_hosts")
    if env.has("network_mode") and env.data["network_mode"] == "allowlist":
        refused += (f"{env.prefix}.network_mode = 'allowlist' ({', '.join(allowed) or 'no hosts'}): T1's providers "
                  "give a sandbox all of the network or none",)
    gpus = env.integer("gpus", 0, positive=False)
    if env.has("tpu"):
        refused += (f"{env.prefix}.tpu: T1's sandboxes have no TPUs",)
    return EnvironmentSpec(
        files_dir=files_dir, dockerfile=dockerfile, compose_file=compose_file,
        workdir=env.text("workdir", None), env=values, allow_internet=_network(env),
        docker_image=env.text("docker_image", None), cpus=env.number("cpus", None), memory_mb=_size_mb(env, "memory"),
        build_timeout_sec=env.number("build_timeout_sec", HARBOR_DEFAULT_TIMEOUT_SEC),
        healthcheck=env.healthcheck("healthcheck"), storage_mb=_size_mb(env, "storage"), gpus=gpus,
        os=env.text("os", "linux").lower(), mcp_servers=_mcp_names(env), refused=refused,
        skills_dir=env.text("skills_dir", None), allowed_hosts=allowed,
    )
