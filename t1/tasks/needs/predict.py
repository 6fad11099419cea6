"""Predict, from a task folder alone, what will stop it on this host: images, packages, features.

`static_needs` is what `provision` refuses before touching a sandbox (the same
function, so validate and a run agree): compose services, Dockerfile lines a
local sandbox cannot replay, images without a Dockerfile, and task.toml features
T1 does not provide. `package_needs` reads the installer lines of the Dockerfile's
RUN steps and of the test scripts (t1.tasks.needs.installers) and names the packages
this host lacks, in the very sentence the run reports when the stand-ins say it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from t1.sandbox.needs import Need, NeedKind, NeedsError
from t1.sandbox.types import LOCAL_TRAITS, SandboxTraits
from t1.tasks import offline_pkgs
from t1.tasks.image.context_files import host_copy
from t1.tasks.image.dockerplan import DockerPlan, build_plan, plan_or_none
from t1.tasks.image.entrypoint import entrypoint_need
from t1.tasks.needs.installers import RequirementFile, find_installs, missing_on_host
from t1.tasks.needs.test_imports import missing_test_imports
from t1.tasks.spec import EnvironmentSpec, TaskSpec

_TEST_SCRIPTS = ("test.sh", "run-tests.sh", "setup.sh")


def _compose_needs(path: Path | None) -> list[Need]:
    if path is None:
        return []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        return [Need(NeedKind.IMAGE, f"{path}: unreadable compose file ({exc})")]
    services = data.get("services") or {} if isinstance(data, dict) else {}
    if isinstance(services, dict) and len(services) > 1:
        return [Need(NeedKind.IMAGE, f"{path.name}: {len(services)} services ({', '.join(services)}): "
                                     "multi-container tasks need a compose-capable provider; local sandboxes run one")]
    return []


def _feature_needs(env: EnvironmentSpec, where: str) -> list[Need]:
    needs = []
    if env.gpus > 0:
        needs.append(Need(NeedKind.FEATURE, f"{where}.gpus = {env.gpus}: T1's sandboxes have no GPUs"))
    if env.os != "linux":
        needs.append(Need(NeedKind.FEATURE, f"{where}.os = {env.os!r}: T1's sandboxes run Linux only"))
    if env.mcp_servers:
        needs.append(Need(NeedKind.FEATURE, f"{where}.mcp_servers ({', '.join(env.mcp_servers)}): "
                                            "T1's agents have no MCP client"))
    needs += [Need(NeedKind.FEATURE, sentence) for sentence in env.refused]
    return needs


def _environment_needs(env: EnvironmentSpec, where: str, traits: SandboxTraits) -> list[Need]:
    needs = _feature_needs(env, where) + _compose_needs(env.compose_file)
    if env.dockerfile is not None and traits.no_images:
        try:
            plan = build_plan(env.dockerfile)
        except NeedsError as exc:
            needs.append(exc.need)
        else:
            entry = entrypoint_need(plan, env.dockerfile.parent)
            needs += [entry] if entry is not None else []
    elif traits.no_images and env.docker_image and env.dockerfile is None:
        needs.append(Need(NeedKind.IMAGE, f"{where}.docker_image {env.docker_image}: no Dockerfile to replay "
                                          "in a local sandbox"))
    return needs


def static_needs(spec: TaskSpec, *, traits: SandboxTraits = LOCAL_TRAITS) -> list[Need]:
    """What stops the task in sandboxes of `traits` before any package is installed (empty when nothing does)."""
    needs = _environment_needs(spec.environment, "environment", traits)
    for phase in spec.phases():
        separate = phase.verifier.separate
        if separate is not None:
            needs += _environment_needs(separate.environment, "verifier.environment", traits)
    missing = missing_test_imports(spec) if traits.no_images else []  # another provider's image is not this host
    if missing:
        needs.append(Need(NeedKind.NETWORK, f"verifier: the tests import {', '.join(missing)}, which this host does "
                                            "not have and the task does not install (the sandbox is offline)"))
    return list(dict.fromkeys(needs))  # a separate verifier that copies the task environment repeats its needs


def _resolver(spec: TaskSpec, plan: DockerPlan | None, cwd: str) -> RequirementFile:
    """Requirement files named in a line run in `cwd`: read from the task folder's copy
    (t1.tasks.image.context_files)."""
    dockerfile = spec.environment.dockerfile
    if plan is None or dockerfile is None:
        return lambda path: None
    return lambda path: host_copy(plan, dockerfile.parent, path, cwd)


def _setup_texts(spec: TaskSpec, plan: DockerPlan | None) -> list[tuple[str, str, RequirementFile]]:
    """Each Dockerfile RUN line, named as a setup report names it (`Dockerfile line N: RUN ...`)."""
    return [(step.label(), step.args[0], _resolver(spec, plan, step.cwd)) for step in plan.run_lines()] if plan else []


def _test_texts(spec: TaskSpec) -> list[str]:
    texts: list[str] = []
    for phase in spec.phases():
        v = phase.verifier
        scripts = [v.run_tests_sh] if v.run_tests_sh else []
        scripts += [d / name for d in (*v.extra_tests_dirs, v.tests_dir) for name in _TEST_SCRIPTS]
        for path in dict.fromkeys(scripts):
            if path is not None and path.is_file():
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def _missing(text: str, resolve: RequirementFile) -> list[str]:
    """What the stand-ins would say for this shell text, one sentence per installer that misses something."""
    out = []
    for install in find_installs(text, resolve):
        missing = missing_on_host(install)
        if missing and install.kind == "offline":
            out.append(missing[0])
        elif missing:
            out.append(offline_pkgs.missing_sentence(install.kind, missing))
    return list(dict.fromkeys(out))


def package_needs(spec: TaskSpec) -> list[Need]:
    """Packages the task's setup and test scripts install that this host lacks, in the run's own words.

    A RUN line is one Need named as replay names it (`Dockerfile line N: RUN ...: apt packages not on this
    host: coq (the sandbox is offline)`); the test scripts together are one `verifier: ...` Need, as the run
    reports what its stand-ins said during the verifier (they run in the workdir).
    """
    plan = plan_or_none(spec.environment.dockerfile)
    needs = [Need(NeedKind.NETWORK, f"{where}: {'; '.join(said)}")
             for where, text, resolve in _setup_texts(spec, plan) if (said := _missing(text, resolve))]
    in_workdir = _resolver(spec, plan, plan.workdir if plan else "/app")
    verifier = list(dict.fromkeys(s for text in _test_texts(spec) for s in _missing(text, in_workdir)))
    if verifier:
        needs.append(Need(NeedKind.NETWORK, f"verifier: {'; '.join(verifier)}"))
    return needs
