"""Harbor itself as the reference reader: every vendored Harbor task, read by Harbor's task model and by T1's
loader, field by field.

Harbor (0.25, Python >= 3.12) runs in a virtual environment of its own, which `run.sh` beside this file
builds; it reads each folder with `dump.py` and this test compares what it made of the folder with T1's
TaskSpec: name, instruction, timeouts, users, env, resources, network, verifier mode and its environment,
collect commands, artifacts, solution env, steps. Without T1_HARBOR_PYTHON (the path of that
environment's python) the tests skip: the default suite does not build a second environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from t1.tasks.formats.dataset import load_task
from t1.tasks.formats.harbor_schema import HARBOR_DEFAULT_TIMEOUT_SEC
from t1.tasks.spec import EnvironmentSpec, Healthcheck, StepSpec, TaskSpec, VerifierSpec

pytestmark = pytest.mark.harbor_reference
HERE = Path(__file__).parent
HARBOR_TASKS = sorted(p for p in (HERE.parents[1] / "fixtures" / "real_tasks" / "harbor").iterdir() if p.is_dir())
HARBOR_PYTHON = os.environ.get("T1_HARBOR_PYTHON", "")


def harbor_reads(folders: list[Path]) -> list[dict[str, Any]]:
    """What Harbor's own Task makes of each folder (dump.py, in Harbor's environment)."""
    if not HARBOR_PYTHON:
        pytest.skip("T1_HARBOR_PYTHON is not set (tests/tasks/harbor_reference/run.sh builds Harbor's environment)")
    out = subprocess.run([HARBOR_PYTHON, str(HERE / "dump.py"), *map(str, folders)], capture_output=True, text=True,
                         timeout=300, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def _health(h: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if h is None else {k: h[k] for k in ("command", "interval_sec", "timeout_sec", "retries",
                                                       "start_period_sec", "start_interval_sec")}


def _t1_health(h: Healthcheck | None) -> dict[str, Any] | None:
    return None if h is None else {"command": h.command, "interval_sec": h.interval_sec, "timeout_sec": h.timeout_sec,
                                   "retries": h.retries, "start_period_sec": h.start_period_sec,
                                   "start_interval_sec": h.start_interval_sec}


def _harbor_env(e: dict[str, Any]) -> dict[str, Any]:
    public = e["network_mode"] == "public" if e.get("allow_internet") is None else bool(e["allow_internet"])
    return {"build_timeout_sec": e["build_timeout_sec"], "docker_image": e["docker_image"], "os": e["os"],
            "cpus": e["cpus"], "memory_mb": e["memory_mb"], "storage_mb": e["storage_mb"], "gpus": e["gpus"] or 0,
            "allow_internet": public, "allowed_hosts": e.get("allowed_hosts") or [],
            "mcp_servers": [s["name"] for s in e["mcp_servers"]], "env_keys": sorted(e["env"]),
            "skills_dir": e["skills_dir"], "workdir": e["workdir"], "healthcheck": _health(e["healthcheck"])}


def _t1_env(e: EnvironmentSpec) -> dict[str, Any]:
    return {"build_timeout_sec": e.build_timeout_sec, "docker_image": e.docker_image, "os": e.os, "cpus": e.cpus,
            "memory_mb": e.memory_mb, "storage_mb": e.storage_mb, "gpus": e.gpus, "allow_internet": e.allow_internet,
            "allowed_hosts": list(e.allowed_hosts), "mcp_servers": list(e.mcp_servers),
            "env_keys": sorted(k for k, _ in e.env), "skills_dir": e.skills_dir, "workdir": e.workdir,
            "healthcheck": _t1_health(e.healthcheck)}


def _harbor_verifier(v: dict[str, Any], env: dict[str, Any] | None, root: Path) -> dict[str, Any]:
    sep = None
    if env is not None:
        built = root / env["directory"] / "Dockerfile"
        sep = {"dockerfile": str(built) if env["docker_image"] is None and built.is_file() else None,
               "docker_image": env["docker_image"], "environment": _harbor_env(env["config"])}
    user = v["user"]
    return {"timeout_sec": v["timeout_sec"], "env": v["env"], "user": None if user is None else str(user),
            "collect": [{"command": c["command"], "timeout_sec": c["timeout_sec"],
                         "user": None if c["user"] is None else str(c["user"])} for c in v.get("collect") or []],
            "separate": sep}


def _t1_verifier(v: VerifierSpec) -> dict[str, Any]:
    sep = v.separate
    separate = None if sep is None else {
        "dockerfile": str(sep.environment.dockerfile) if sep.environment.dockerfile and
        sep.environment.dockerfile.parent.name == "tests" else None,
        "docker_image": sep.environment.docker_image, "environment": _t1_env(sep.environment)}
    return {"timeout_sec": v.timeout_sec, "env": dict(v.env), "user": v.user,
            "collect": [{"command": c.command, "timeout_sec": c.timeout_sec, "user": c.user}
                        for c in (sep.collect if sep else ())], "separate": separate}


def _artifacts(raw: list[Any]) -> list[dict[str, Any]]:
    return [{"source": a, "destination": None, "exclude": []} if isinstance(a, str) else
            {"source": a["source"], "destination": a["destination"], "exclude": a.get("exclude") or []} for a in raw]


def harbor_view(d: dict[str, Any], root: Path) -> dict[str, Any]:
    """The fields T1 reads, as Harbor's model has them (defaults applied as Harbor applies them)."""
    c = d["config"]
    agent_timeout = c["agent"]["timeout_sec"]
    steps = c["steps"] or []
    view = {"id": d["name"].replace("/", "__"), "agent_timeout_sec": agent_timeout or HARBOR_DEFAULT_TIMEOUT_SEC,
            "agent_user": None if c["agent"]["user"] is None else str(c["agent"]["user"]),
            "environment": _harbor_env(c["environment"]), "solution_env": c["solution"]["env"],
            "multi_step_strategy": c["multi_step_reward_strategy"] or "mean",
            "artifacts": _artifacts(c["artifacts"]), "steps": []}
    if not steps:
        view["instruction"] = d["instruction"]
        view["verifier"] = _harbor_verifier(c["verifier"], d["verifier_env"], root)
    for s in steps:
        view["steps"].append({
            "name": s["name"], "min_reward": s["min_reward"], "agent_timeout_sec": s["agent"]["timeout_sec"],
            "healthcheck": _health(s["healthcheck"]), "artifacts": _artifacts(c["artifacts"] + s["artifacts"]),
            "verifier": _harbor_verifier(s["verifier"], d["step_verifier_env"][s["name"]], root)})
    return view


def _t1_min_reward(step: StepSpec) -> object:
    if not step.min_reward:
        return None
    return step.min_reward[0][1] if [k for k, _ in step.min_reward] == ["reward"] else dict(step.min_reward)


def t1_view(spec: TaskSpec) -> dict[str, Any]:
    """The same fields as T1's loader has them."""
    view = {"id": spec.id, "agent_timeout_sec": spec.agent_timeout_sec, "agent_user": spec.agent_user,
            "environment": _t1_env(spec.environment),
            "solution_env": dict(spec.solution.env) if spec.solution else {},
            "multi_step_strategy": str(spec.multi_step_strategy),
            "artifacts": [{"source": a.source, "destination": a.destination, "exclude": list(a.exclude)}
                          for a in (spec.verifier.separate.artifacts if spec.verifier.separate else ())],
            "steps": []}
    if not spec.steps:
        view["instruction"] = spec.instruction
        view["verifier"] = _t1_verifier(spec.verifier)
    for s in spec.steps:
        sep = s.verifier.separate
        view["steps"].append({
            "name": s.name, "min_reward": _t1_min_reward(s), "agent_timeout_sec": s.agent_timeout_sec,
            "healthcheck": _t1_health(s.healthcheck),
            "artifacts": [{"source": a.source, "destination": a.destination, "exclude": list(a.exclude)}
                          for a in (sep.artifacts if sep else ())],
            "verifier": _t1_verifier(s.verifier)})
    return view


def differences(ref: Any, ours: Any, where: str = "") -> list[str]:
    """Every field where T1's reading differs from Harbor's, by dotted path."""
    if isinstance(ref, dict) and isinstance(ours, dict):
        return [d for k in sorted(set(ref) | set(ours)) for d in differences(ref.get(k), ours.get(k), f"{where}.{k}")]
    if isinstance(ref, list) and isinstance(ours, list) and len(ref) == len(ours):
        return [d for i, (a, b) in enumerate(zip(ref, ours, strict=True)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(ref, (int, float)) and isinstance(ours, (int, float)) and not isinstance(ref, bool):
        return [] if float(ref) == float(ours) else [f"{where}: Harbor {ref!r}, T1 {ours!r}"]
    return [] if ref == ours else [f"{where}: Harbor {ref!r}, T1 {ours!r}"]


def _artifacts_only_when_separate(view: dict[str, Any], t1: dict[str, Any]) -> None:
    """Artifacts are what a separate verifier receives, and there T1 must read them as Harbor does; beside a
    shared verifier Harbor only copies them into its trial folder for people to read (T1 keeps no such
    folder: docs/tasks.md), so there they are not compared."""
    if not view["steps"] and view["verifier"]["separate"] is None:
        view["artifacts"] = t1["artifacts"]
    for ref, ours in zip(view["steps"], t1["steps"], strict=False):
        if ref["verifier"]["separate"] is None:
            ref["artifacts"] = ours["artifacts"]
    if view["steps"]:
        view["artifacts"] = t1["artifacts"]


@pytest.mark.parametrize("folder", HARBOR_TASKS, ids=[p.name for p in HARBOR_TASKS])
def test_t1_reads_every_vendored_harbor_task_as_harbor_does(folder: Path) -> None:
    (ref,) = harbor_reads([folder])
    assert "error" not in ref, ref
    spec = load_task(folder)
    ours = t1_view(spec)
    theirs = harbor_view(ref, folder.resolve())
    _artifacts_only_when_separate(theirs, ours)
    assert differences(theirs, ours) == [], json.dumps({"harbor": theirs, "t1": ours}, indent=1, default=str)


def test_separate_verifier_without_a_table_is_built_from_tests_dockerfile(tmp_path: Path) -> None:
    """`environment_mode = "separate"` with no [verifier.environment] and a tests/Dockerfile: Harbor builds the
    verifier from tests/ (its resolver's rule); T1 must too, not from a copy of the task's environment."""
    root = tmp_path / "simple-task"
    shutil.copytree(HERE.parents[1] / "fixtures" / "real_tasks" / "harbor" / "simple-task", root)
    toml = root / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]", '[verifier]\nenvironment_mode = "separate"', 1))
    (root / "tests" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN mkdir -p /logs/verifier\n")
    (ref,) = harbor_reads([root])
    assert ref["verifier_env"]["directory"] == "tests", ref
    spec = load_task(root)
    assert differences(harbor_view(ref, root.resolve()), t1_view(spec)) == []
    assert (
        spec.verifier.separate is not None
        and spec.verifier.separate.environment.dockerfile == root.resolve() / "tests" / "Dockerfile"
    )


def _schema_14(tmp_path: Path, name: str, agent_network: str) -> Path:
    root = tmp_path / name
    shutil.copytree(HERE.parents[1] / "fixtures" / "real_tasks" / "harbor" / "simple-task", root)
    toml = root / "task.toml"
    text = toml.read_text().replace('version = "1.0"\n', 'schema_version = "1.4"\n\n[task]\nname = "t1/simple-task"\n'
                                    'version = "2.1.0"\n', 1)
    toml.write_text(text.replace("[agent]", f"[agent]\n{agent_network}", 1)
                    .replace("[environment]", '[environment]\nnetwork_mode = "no-network"', 1))
    return root


def test_schema_14_task_version_and_per_phase_network(tmp_path: Path) -> None:
    """Schema 1.3's `[task].version` is read (not an unknown key), and 1.4's per-phase network policy is honoured
    where it is the environment's own and refused by name (with its allowed_hosts) where it is not; Harbor reads
    both folders."""
    from t1.tasks.needs.validate import check_folder

    same = _schema_14(tmp_path, "same", 'network_mode = "no-network"')
    allow = _schema_14(tmp_path, "allow", 'network_mode = "allowlist"\nallowed_hosts = ["pypi.org", '
                                          '"*.pythonhosted.org"]')
    refs = harbor_reads([same, allow])
    assert all("error" not in r for r in refs), refs
    assert refs[0]["config"]["task"]["version"] == "2.1.0" and refs[1]["config"]["agent"]["allowed_hosts"]
    ok = check_folder(same)
    assert not ok.needs and not any("version" in n for n in ok.notes), ok
    assert differences(harbor_view(refs[0], same.resolve()), t1_view(load_task(same))) == []
    refused = check_folder(allow)
    assert [str(n) for n in refused.needs] == [
        "needs_feature: agent.network_mode = 'allowlist' (allowed_hosts: pypi.org, *.pythonhosted.org): T1 gives a "
        "sandbox one network policy for the whole episode, here no-network ([environment])"], refused
