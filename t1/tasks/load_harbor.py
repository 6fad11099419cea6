"""Read a Harbor / Terminal-Bench 2.x task folder (task.toml, instruction.md, environment/, tests/, solution/, steps/).

Defaults follow Harbor's task config: verifier and agent `timeout_sec` 600,
`environment.build_timeout_sec` 600, `allow_internet` true, workdir /app.
`[environment].memory` ("2G") is read when `memory_mb` is absent. Multi-step
tasks list `[[steps]]` (name, min_reward as a number or a table of reward keys,
optional [steps.agent], [steps.verifier], [steps.healthcheck]) with files under
steps/<name>/ (instruction.md, tests/, solution/, workdir/), and combine step
rewards by the top-level `multi_step_reward_strategy` ("mean" or "final").
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path

from t1.tasks.fields import Fields, read_text
from t1.tasks.spec import (
    EnvironmentSpec,
    MultiStepStrategy,
    SolutionSpec,
    StepSpec,
    TaskFormat,
    TaskMetadata,
    TaskParseError,
    TaskSpec,
    VerifierKind,
    VerifierSpec,
)
from t1.tasks.taskfiles import check_contained

HARBOR_DEFAULT_TIMEOUT_SEC = 600.0
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as exc:
        raise TaskParseError(path, "<file>", f"invalid TOML ({exc})") from None


def _memory_mb(env: Fields) -> int | None:
    if env.has("memory_mb"):
        return env.integer("memory_mb")
    if not env.has("memory"):
        return None
    text = env.text("memory")
    m = _MEMORY.match(text)
    if not m:
        raise env.error("memory", f"expected a size like '2G' or '512M', got {text!r}")
    scale = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return max(1, int(float(m.group(1)) * scale))


def _verifier(tests_dir: Path, v: Fields, default_timeout: float) -> VerifierSpec:
    test_sh = tests_dir / "test.sh"
    if not test_sh.is_file():
        raise TaskParseError(test_sh, "tests", "file is missing (Harbor tasks need tests/test.sh)")
    return VerifierSpec(
        kind=VerifierKind.TEST_SH,
        tests_dir=tests_dir,
        timeout_sec=v.number("timeout_sec", default_timeout),
        env=v.env("env"),
        user=v.text("user", None),
    )


def _solution(sol_dir: Path, env: Fields) -> SolutionSpec | None:
    script = sol_dir / "solve.sh"
    if not script.is_file():
        return None
    return SolutionSpec(script=script, files_dir=sol_dir, env=env.env("env"))


def _min_reward(step: Fields) -> tuple[tuple[str, float], ...]:
    if not step.has("min_reward"):
        return ()
    value = step.data["min_reward"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (("reward", float(value)),)
    table = step.table("min_reward")
    return tuple(sorted((k, table.number(k, positive=False)) for k in table.data))


def _steps(root: Path, f: Fields, task_v: Fields, solution_env: Fields) -> tuple[StepSpec, ...]:
    raw = f.data.get("steps")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise f.error("steps", "expected a non-empty array of tables ([[steps]])")
    task_timeout = task_v.number("timeout_sec", HARBOR_DEFAULT_TIMEOUT_SEC)
    steps, seen = [], set()
    for i, item in enumerate(raw):
        s = Fields(f.file, item, f"steps[{i}]")
        name = s.text("name")
        if not _STEP_NAME.match(name) or name in seen:
            raise s.error("name", f"must be a unique folder name, got {name!r}")
        seen.add(name)
        step_dir = root / "steps" / name
        if not step_dir.is_dir():
            raise s.error("name", f"folder steps/<name>/ is missing ({step_dir})")
        tests_dir = step_dir / "tests" if (step_dir / "tests").is_dir() else root / "tests"
        v = s.table("verifier")
        verifier = _verifier(tests_dir, v, task_timeout)
        verifier = replace(verifier, env=verifier.env if v.has("env") else task_v.env("env"),
                           user=verifier.user or task_v.text("user", None))
        workdir = step_dir / "workdir"
        steps.append(StepSpec(
            name=name,
            instruction=read_text(step_dir / "instruction.md", f"steps[{i}] instruction.md"),
            verifier=verifier,
            solution=_solution(step_dir / "solution", solution_env),
            workdir_files=workdir if workdir.is_dir() else None,
            min_reward=_min_reward(s),
            agent_timeout_sec=s.table("agent").number("timeout_sec", None),
            healthcheck=s.healthcheck("healthcheck"),
        ))
    return tuple(steps)


def load_harbor(root: Path) -> TaskSpec:
    """Parse a Harbor / Terminal-Bench 2.x task folder into a TaskSpec."""
    root = root.resolve()
    check_contained(root)
    toml_file = root / "task.toml"
    f = Fields(toml_file, _read_toml(toml_file))
    meta, env, agent = f.table("metadata"), f.table("environment"), f.table("agent")
    v, sol = f.table("verifier"), f.table("solution")
    has_steps = f.has("steps")
    base_verifier = _verifier(root / "tests", v, HARBOR_DEFAULT_TIMEOUT_SEC) if (root / "tests" / "test.sh").is_file() else None
    if base_verifier is None and not has_steps:
        raise TaskParseError(root / "tests" / "test.sh", "tests", "file is missing (Harbor tasks need tests/test.sh)")
    steps = _steps(root, f, v, sol)
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
    env_dir = root / "environment"
    dockerfile = env_dir / "Dockerfile"
    compose = env_dir / "docker-compose.yaml"
    if not compose.is_file() and (env_dir / "docker-compose.yml").is_file():
        compose = env_dir / "docker-compose.yml"
    has_dockerfile = dockerfile.is_file()
    task_table = f.table("task")
    return TaskSpec(
        id=task_table.text("name", root.name).replace("/", "__"),
        format=TaskFormat.HARBOR,
        root=root,
        instruction=instruction,
        environment=EnvironmentSpec(
            files_dir=env_dir if env_dir.is_dir() and not has_dockerfile else None,
            dockerfile=dockerfile if has_dockerfile else None,
            compose_file=compose if compose.is_file() else None,
            workdir=env.text("workdir", None),
            env=env.env("env"),
            allow_internet=env.flag("allow_internet", True),
            docker_image=env.text("docker_image", None),
            cpus=env.number("cpus", None),
            memory_mb=_memory_mb(env),
            build_timeout_sec=env.number("build_timeout_sec", HARBOR_DEFAULT_TIMEOUT_SEC),
            healthcheck=env.healthcheck("healthcheck"),
        ),
        verifier=base_verifier or steps[-1].verifier,
        solution=_solution(root / "solution", sol),
        agent_timeout_sec=agent.number("timeout_sec", HARBOR_DEFAULT_TIMEOUT_SEC),
        agent_user=agent.text("user", None),
        steps=steps,
        multi_step_strategy=strategy,
        metadata=TaskMetadata(
            difficulty=str(meta.data.get("difficulty", "unknown")),
            category=meta.text("category", "general"),
            tags=meta.str_list("tags"),
            source=meta.text("source", "harbor"),
            split=meta.text("split", "any"),
            family=meta.text("family", ""),
            author=meta.text("author_name", ""),
        ),
    )
