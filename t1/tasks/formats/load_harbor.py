"""Read a Harbor / Terminal-Bench 2.x task folder (task.toml, instruction.md, environment/, tests/, solution/, steps/).

Every field of Harbor's task.toml schema 1.0-1.4 (t1.tasks.formats.harbor_schema) is
read: defaults follow Harbor's TaskConfig (verifier and agent `timeout_sec` 600,
`build_timeout_sec` 600, `allow_internet` true); `memory`/`storage` ("2G") when
the `_mb` forms are absent; users may be names or uids. `[verifier]
environment_mode = "separate"` (implied by a `[verifier.environment]` table)
gives the verifier a sandbox of its own, built from that table with tests/ as
its build context, or without it as a fresh copy of the task's environment (built
from tests/Dockerfile when there is one, as Harbor's resolver does); the top-level
`artifacts` and `[[verifier.collect]]` say what it receives. Multi-step tasks
list `[[steps]]` (name, min_reward as a number or a table of reward keys,
[steps.agent], [steps.verifier], [steps.healthcheck], artifacts) with files under
steps/<name>/ (instruction.md, tests/ merged over the top-level tests/,
solution/, workdir/ with an optional setup.sh), and combine step rewards by
`multi_step_reward_strategy` ("mean" or "final"). Features T1 cannot provide
(GPUs, MCP servers, Windows, network allowlists, a per-phase network policy other
than the environment's, unset env templates) are kept
on the spec and refused by name when the task runs (t1.tasks.needs.predict).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path

from t1.tasks.formats.fields import Fields, read_text
from t1.tasks.formats.harbor_schema import (
    HARBOR_DEFAULT_TIMEOUT_SEC,
    SCHEMA_VERSIONS,
    environment_spec,
    resolve_env,
    unknown_keys,
)
from t1.tasks.formats.taskfiles import check_contained
from t1.tasks.spec import (
    Artifact,
    CollectCommand,
    EnvironmentSpec,
    MultiStepStrategy,
    SeparateVerifier,
    SolutionSpec,
    StepSpec,
    TaskFormat,
    TaskMetadata,
    TaskParseError,
    TaskSpec,
    VerifierKind,
    VerifierSpec,
)

_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise TaskParseError(path, "<file>", f"invalid TOML ({exc})") from None


def _user(f: Fields, key: str) -> str | None:
    value = f.data.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f.text(key, None)


def _artifacts(f: Fields, key: str) -> tuple[Artifact, ...]:
    raw = f.data.get(key) or []
    if not isinstance(raw, list):
        raise f.error(key, "expected an array of paths or {source, destination, exclude} tables")
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            out.append(Artifact(source=item))
            continue
        a = Fields(f.file, item, f"{f.name(key)}[{i}]")
        out.append(Artifact(source=a.text("source"), destination=a.text("destination", None),
                            exclude=a.str_list("exclude")))
    return tuple(out)


def _collect(v: Fields) -> tuple[CollectCommand, ...]:
    raw = v.data.get("collect") or []
    if not isinstance(raw, list):
        raise v.error("collect", "expected an array of tables ([[verifier.collect]])")
    out = []
    for i, item in enumerate(raw):
        c = Fields(v.file, item, f"{v.name('collect')}[{i}]")
        out.append(CollectCommand(command=c.text("command"), timeout_sec=c.number("timeout_sec", 60.0),
                                  user=_user(c, "user")))
    return tuple(out)


def _separate(root: Path, v: Fields, task_env: EnvironmentSpec, artifacts: tuple[Artifact, ...],
              tests_dir: Path) -> SeparateVerifier | None:
    mode = v.text("environment_mode", None)
    if mode not in (None, "shared", "separate"):
        raise v.error("environment_mode", f"expected 'shared' or 'separate', got {mode!r}")
    has_table = v.has("environment")
    if mode == "shared" and has_table:
        raise v.error("environment", "environment_mode = 'shared' cannot have a [verifier.environment] table")
    if mode != "separate" and not has_table:
        return None
    if v.has("network_mode"):
        raise v.error("network_mode", "a separate verifier takes its network from [verifier.environment]")
    dockerfile = tests_dir / "Dockerfile"
    if not has_table:  # Harbor's rule: the task's environment, built from tests/ when tests/Dockerfile exists
        env = task_env if not dockerfile.is_file() else replace(task_env, dockerfile=dockerfile, files_dir=None,
                                                                   compose_file=None, docker_image=None)
        return SeparateVerifier(environment=env, artifacts=artifacts, collect=_collect(v))
    env = environment_spec(v.table("environment"), dockerfile=dockerfile if dockerfile.is_file() else None,
                           files_dir=None, compose_file=None)
    if env.dockerfile is None and env.docker_image is None:
        raise v.error("environment", "a separate verifier environment needs tests/Dockerfile or a docker_image")
    return SeparateVerifier(environment=env, artifacts=artifacts, collect=_collect(v))


def phase_network(phase: Fields, public: bool) -> list[str]:
    """[agent]/[verifier] `network_mode` (schema 1.4's per-phase policy): honoured where it is the environment's
    own policy (`public` beside internet, `no-network` without), else refused by name: a sandbox has one
    policy for the whole episode, and an allowlist (`allowed_hosts`) is a policy T1's providers do not have."""
    if not phase.has("network_mode") and not phase.has("allowed_hosts"):
        return []
    mode = str(phase.data.get("network_mode", "allowlist"))
    hosts = phase.str_list("allowed_hosts")
    if mode == ("public" if public else "no-network") and not hosts:
        return []
    listed = f" (allowed_hosts: {', '.join(hosts)})" if hosts else ""
    return [f"{phase.name('network_mode')} = {mode!r}{listed}: T1 gives a sandbox one network policy for the "
            f"whole episode, here {'public' if public else 'no-network'} ([environment])"]


def _verifier(tests_dir: Path, v: Fields, default_timeout: float, refused: list[str], *, public: bool,
              extra: tuple[Path, ...] = (), separate: SeparateVerifier | None = None) -> VerifierSpec:
    test_sh = tests_dir / "test.sh"
    if not test_sh.is_file() and not any((d / "test.sh").is_file() for d in extra):
        raise TaskParseError(test_sh, "tests", "file is missing (Harbor tasks need tests/test.sh)")
    env, unset = resolve_env(v, "env", v.name("env"))
    refused += unset
    if separate is None:
        refused += phase_network(v, public)
    return VerifierSpec(
        kind=VerifierKind.TEST_SH,
        tests_dir=tests_dir,
        timeout_sec=v.number("timeout_sec", default_timeout),
        env=env,
        user=_user(v, "user"),
        extra_tests_dirs=extra,
        separate=separate,
    )


def _solution(sol_dir: Path, env: Fields) -> SolutionSpec | None:
    script = sol_dir / "solve.sh"
    if not script.is_file():
        return None
    turns_file = sol_dir / "turns.txt"
    turns = tuple(line for line in turns_file.read_text(encoding="utf-8").splitlines() if line.strip()) \
        if turns_file.is_file() else ()
    return SolutionSpec(script=script, files_dir=sol_dir, env=resolve_env(env, "env", env.name("env"))[0],
                        turns=turns)


def _min_reward(step: Fields) -> tuple[tuple[str, float], ...]:
    if not step.has("min_reward"):
        return ()
    value = step.data["min_reward"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (("reward", float(value)),)
    table = step.table("min_reward")
    return tuple(sorted((k, table.number(k, positive=False)) for k in table.data))


class _Reader:
    """State shared while reading one task.toml: the root, the task environment, refusals, unknown keys."""

    def __init__(self, root: Path, f: Fields) -> None:
        self.root, self.f = root, f
        self.refused: list[str] = []
        self.ignored: list[str] = []

    def check_keys(self, table: Fields, section: str) -> Fields:
        self.ignored += unknown_keys(table, section, table.prefix)
        if table.has("healthcheck") and isinstance(table.data["healthcheck"], dict):
            self.ignored += unknown_keys(table.table("healthcheck"), "healthcheck", table.name("healthcheck"))
        return table

    def agent_user(self, agent: Fields, public: bool) -> str | None:
        self.refused += phase_network(agent, public)
        return _user(agent, "user")

    def steps(self, task_v: Fields, solution_env: Fields, task_env: EnvironmentSpec,
              artifacts: tuple[Artifact, ...]) -> tuple[StepSpec, ...]:
        f, root = self.f, self.root
        raw = f.data.get("steps")
        if raw is None:
            return ()
        if not isinstance(raw, list) or not raw:
            raise f.error("steps", "expected a non-empty array of tables ([[steps]])")
        task_timeout = task_v.number("timeout_sec", HARBOR_DEFAULT_TIMEOUT_SEC)
        shared_tests = root / "tests"
        steps, seen = [], set()
        for i, item in enumerate(raw):
            s = self.check_keys(Fields(f.file, item, f"steps[{i}]"), "steps")
            name = s.text("name")
            if not _STEP_NAME.match(name) or name in seen:
                raise s.error("name", f"must be a unique folder name, got {name!r}")
            seen.add(name)
            step_dir = root / "steps" / name
            if not step_dir.is_dir():
                raise s.error("name", f"folder steps/<name>/ is missing ({step_dir})")
            own_tests = step_dir / "tests"
            tests_dir = own_tests if own_tests.is_dir() else shared_tests
            extra = (shared_tests,) if own_tests.is_dir() and shared_tests.is_dir() else ()
            v = self.check_keys(s.table("verifier"), "verifier")
            step_artifacts = artifacts + _artifacts(s, "artifacts")
            # a step's own [steps.verifier] mode wins; else it inherits the task's [verifier] mode
            own_mode = v.has("environment_mode") or v.has("environment")
            separate = _separate(root, v if own_mode else task_v, task_env, step_artifacts,
                                 tests_dir if own_mode else shared_tests)
            verifier = _verifier(tests_dir, v, task_timeout, self.refused, public=task_env.allow_internet, extra=extra,
                                 separate=separate)
            verifier = replace(
                verifier,
                env=verifier.env if v.has("env") else resolve_env(task_v, "env", "verifier.env")[0],
                user=verifier.user or _user(task_v, "user"),
            )
            agent = self.check_keys(s.table("agent"), "agent")
            if agent.has("user"):
                self.refused.append(f"{agent.name('user')}: per-step agent users are not supported; "
                                    "set [agent].user for the whole task")
            workdir = step_dir / "workdir"
            steps.append(StepSpec(
                name=name,
                instruction=read_text(step_dir / "instruction.md", f"steps[{i}] instruction.md"),
                verifier=verifier,
                solution=_solution(step_dir / "solution", solution_env),
                workdir_files=workdir if workdir.is_dir() else None,
                min_reward=_min_reward(s),
                agent_timeout_sec=agent.number("timeout_sec", None),
                healthcheck=s.healthcheck("healthcheck"),
            ))
        return tuple(steps)


def _environment(root: Path, env: Fields) -> EnvironmentSpec:
    env_dir = root / "environment"
    dockerfile = env_dir / "Dockerfile"
    compose = env_dir / "docker-compose.yaml"
    if not compose.is_file() and (env_dir / "docker-compose.yml").is_file():
        compose = env_dir / "docker-compose.yml"
    has_dockerfile = dockerfile.is_file()
    return environment_spec(env, dockerfile=dockerfile if has_dockerfile else None,
                            files_dir=env_dir if env_dir.is_dir() and not has_dockerfile else None,
                            compose_file=compose if compose.is_file() else None)


def load_harbor(root: Path) -> TaskSpec:
    """Parse a Harbor / Terminal-Bench 2.x task folder into a TaskSpec."""
    root = root.resolve()
    check_contained(root)
    toml_file = root / "task.toml"
    f = Fields(toml_file, _read_toml(toml_file))
    r = _Reader(root, f)
    r.ignored += unknown_keys(f, "", "")
    version = str(f.data.get("schema_version", f.data.get("version", "1.0")))
    if version not in SCHEMA_VERSIONS:
        r.ignored.append(f"schema_version = {version!r} (T1 reads {', '.join(SCHEMA_VERSIONS)})")
    meta = f.table("metadata")
    env_t, agent = r.check_keys(f.table("environment"), "environment"), r.check_keys(f.table("agent"), "agent")
    v, sol = r.check_keys(f.table("verifier"), "verifier"), r.check_keys(f.table("solution"), "solution")
    task_table = r.check_keys(f.table("task"), "task")
    task_env = _environment(root, env_t)
    artifacts = _artifacts(f, "artifacts")
    has_steps = f.has("steps")
    base_verifier = None
    if (root / "tests" / "test.sh").is_file():
        separate = _separate(root, v, task_env, artifacts, root / "tests")
        base_verifier = _verifier(root / "tests", v, HARBOR_DEFAULT_TIMEOUT_SEC, r.refused,
                                  public=task_env.allow_internet, separate=separate)
    if base_verifier is None and not has_steps:
        raise TaskParseError(root / "tests" / "test.sh", "tests", "file is missing (Harbor tasks need tests/test.sh)")
    steps = r.steps(v, sol, task_env, artifacts)
    instruction_file = root / "instruction.md"
    if instruction_file.is_file() or not steps:
        instruction = read_text(instruction_file, "instruction.md")
    else:
        instruction = steps[0].instruction
    if not instruction.strip():
        raise TaskParseError(instruction_file, "instruction.md", "is empty")
    strategy_text = f.text("multi_step_reward_strategy", "mean")
    try:
        strategy = MultiStepStrategy(strategy_text)
    except ValueError:
        raise f.error("multi_step_reward_strategy", f"expected 'mean' or 'final', got {strategy_text!r}") from None
    agent_user = r.agent_user(agent, task_env.allow_internet)
    return TaskSpec(
        id=task_table.text("name", root.name).replace("/", "__"),
        format=TaskFormat.HARBOR,
        root=root,
        instruction=instruction,
        environment=replace(task_env, refused=task_env.refused + tuple(dict.fromkeys(r.refused))),
        verifier=base_verifier or steps[-1].verifier,
        solution=_solution(root / "solution", sol),
        agent_timeout_sec=agent.number("timeout_sec", HARBOR_DEFAULT_TIMEOUT_SEC),
        agent_user=agent_user,
        steps=steps,
        multi_step_strategy=strategy,
        metadata=TaskMetadata(
            difficulty=str(meta.data.get("difficulty", "unknown")),
            category=meta.text("category", "general"),
            tags=meta.str_list("tags"),
            source=meta.text("source", None) or f.text("source", None) or "harbor",
            split=meta.text("split", "any"),
            family=meta.text("family", ""),
            author=meta.text("author_name", ""),
        ),
        ignored_fields=tuple(r.ignored),
    )
