"""TaskSpec: one task as T1 sees it, whatever folder format it was read from.

A task is an instruction, an environment (files, image, workdir, env, user,
healthcheck), verifiers (tests plus the command that runs them) and usually a
reference solution. Multi-step tasks (Harbor `[[steps]]`) carry one StepSpec per
step; each step has its own instruction, verifier and solution and runs in the
same sandbox after the previous one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from t1.errors import BadRequest

Env = tuple[tuple[str, str], ...]


class TaskFormat(StrEnum):
    """Which folder format a task was read from."""

    TB1 = "terminal-bench-1"
    HARBOR = "harbor"


class VerifierKind(StrEnum):
    """How the verifier is run inside the sandbox."""

    TEST_SH = "test_sh"  # Harbor: bash /tests/test.sh, reward in /logs/verifier/reward.{txt,json}
    RUN_TESTS_SH = "run_tests_sh"  # Terminal-Bench 1: bash /tests/run-tests.sh, pytest -rA output
    PYTEST = "pytest"  # Terminal-Bench 1 without run-tests.sh: pytest -rA on /tests/test_outputs.py


class MultiStepStrategy(StrEnum):
    """How step rewards combine into the task reward (Harbor's multi_step_reward_strategy)."""

    MEAN = "mean"
    FINAL = "final"


class TaskParseError(BadRequest, ValueError):
    """A task folder that cannot be used: names the file, the field and the problem."""

    def __init__(self, file: Path | str, field_name: str, problem: str) -> None:
        self.file = str(file)
        self.field_name = field_name
        self.problem = problem
        super().__init__(f"{file}: {field_name}: {problem}")


@dataclass(frozen=True, slots=True)
class Healthcheck:
    """A command that must succeed before the agent starts (retried)."""

    command: str
    interval_sec: float = 5.0  # Harbor's defaults, which mirror Docker HEALTHCHECK
    timeout_sec: float = 30.0
    retries: int = 3
    start_period_sec: float = 0.0  # failures in this grace period do not count
    start_interval_sec: float = 5.0  # time between checks during the grace period


@dataclass(frozen=True, slots=True)
class EnvironmentSpec:
    """What the sandbox must look like before the agent starts."""

    files_dir: Path | None = None  # uploaded into workdir (Harbor environment/ minus Dockerfile)
    dockerfile: Path | None = None
    compose_file: Path | None = None
    workdir: str | None = None  # None: the Dockerfile's WORKDIR (its base image's when unset), else /app
    env: Env = ()
    allow_internet: bool = True
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    build_timeout_sec: float = 600.0
    healthcheck: Healthcheck | None = None
    storage_mb: int | None = None
    gpus: int = 0
    os: str = "linux"
    mcp_servers: tuple[str, ...] = ()  # names; T1's agents have no MCP client, so a task with any is refused
    refused: tuple[str, ...] = ()  # sentences naming task-file fields T1 cannot honour here (unset ${VAR}, ...)
    skills_dir: str | None = None  # files stay where the Dockerfile put them; T1's agents load no skills
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Artifact:
    """A path the agent's sandbox hands on (Harbor `artifacts`): copied into a separate verifier's sandbox."""

    source: str
    destination: str | None = None
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CollectCommand:
    """Harbor `[[verifier.collect]]`: a command run in the agent's sandbox before artifacts are taken."""

    command: str
    timeout_sec: float = 60.0
    user: str | None = None


@dataclass(frozen=True, slots=True)
class SeparateVerifier:
    """Harbor `environment_mode = "separate"`: the verifier runs in a fresh sandbox of its own.

    That sandbox is built from `environment` (the [verifier.environment] table, with tests/ as its build
    context; the task's own environment when absent), gets /logs/artifacts and the declared artifacts from
    the agent's sandbox, runs tests/setup.sh if present, then the verifier.
    """

    environment: EnvironmentSpec
    artifacts: tuple[Artifact, ...] = ()
    collect: tuple[CollectCommand, ...] = ()


@dataclass(frozen=True, slots=True)
class VerifierSpec:
    """The tests and how to run them after the agent finishes."""

    kind: VerifierKind
    tests_dir: Path
    timeout_sec: float
    env: Env = ()
    user: str | None = None
    parser_name: str = "pytest"
    same_shell: bool = False
    run_tests_sh: Path | None = None  # TB1 run-tests.sh (sits next to task.yaml, not in tests/)
    extra_tests_dirs: tuple[Path, ...] = ()  # uploaded to /tests first (Harbor: top-level tests/ under a step's)
    separate: SeparateVerifier | None = None


@dataclass(frozen=True, slots=True)
class SolutionSpec:
    """The reference (oracle) solution: a script uploaded to /solution and run with bash."""

    script: Path
    files_dir: Path | None = None  # whole solution/ folder for Harbor, None for TB1 solution.sh
    env: Env = ()
    commands: tuple[str, ...] = ()  # TB1 solution.yaml: commands typed into the shell in order
    turns: tuple[str, ...] = ()  # solution/turns.txt (T1's own): the scripted oracle types one command per turn


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step of a multi-step Harbor task."""

    name: str
    instruction: str
    verifier: VerifierSpec
    solution: SolutionSpec | None = None
    workdir_files: Path | None = None  # steps/<name>/workdir/: copied into the workdir before the step
    min_reward: tuple[tuple[str, float], ...] = ()  # key 'reward' for a bare number
    agent_timeout_sec: float | None = None
    healthcheck: Healthcheck | None = None


@dataclass(frozen=True, slots=True)
class TaskMetadata:
    """Descriptive fields; none of them changes how the task runs."""

    difficulty: str = "unknown"
    category: str = "general"
    tags: tuple[str, ...] = ()
    source: str = ""
    split: str = "any"
    family: str = ""
    author: str = ""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task: instruction, environment, verifiers, solution, timeouts, metadata."""

    id: str
    format: TaskFormat
    root: Path
    instruction: str
    environment: EnvironmentSpec
    verifier: VerifierSpec
    solution: SolutionSpec | None = None
    agent_timeout_sec: float = 600.0
    agent_user: str | None = None
    steps: tuple[StepSpec, ...] = ()
    multi_step_strategy: MultiStepStrategy = MultiStepStrategy.MEAN
    metadata: TaskMetadata = field(default_factory=TaskMetadata)
    ignored_fields: tuple[str, ...] = ()  # task file keys outside the format's schema (validate lists them)

    @property
    def is_multi_step(self) -> bool:
        return bool(self.steps)

    def phases(self) -> tuple[StepSpec, ...]:
        """The steps the agent works through; a single-step task is one phase named 'main'."""
        if self.steps:
            return tuple(s if s.agent_timeout_sec else replace(s, agent_timeout_sec=self.agent_timeout_sec)
                         for s in self.steps)
        return (StepSpec(name="main", instruction=self.instruction, verifier=self.verifier,
                         solution=self.solution, agent_timeout_sec=self.agent_timeout_sec),)


def env_tuple(mapping: dict[str, object] | None) -> Env:
    """A mapping of environment variables as a sorted tuple of string pairs."""
    return tuple(sorted((str(k), str(v)) for k, v in (mapping or {}).items()))
