"""Read a Terminal-Bench 1 task folder (task.yaml, tests/, run-tests.sh, solution.sh|yaml, Dockerfile).

Field names and defaults follow terminal-bench's `Task` model: `instruction`,
`author_name`, `author_email`, `difficulty`, `category`, `tags`, `parser_name`
(pytest), `max_agent_timeout_sec` (360), `max_test_timeout_sec` (60),
`run_tests_in_same_shell` (false). A `parser_name` other than pytest (Terminal-Bench
also has swebench, mlebench, ...) makes a task T1 refuses by name (needs_feature),
not a malformed one: its verifier output needs a parser T1 does not have. Early
task.yaml files carried the instruction as `descriptions: [{key: base,
description: ...}]`; that form is read too.
The Docker build context is the task folder, so environment files reach the
image only through the Dockerfile's COPY/ADD lines. A folder without a Dockerfile
runs on the default workdir (/app, the Terminal-Bench base images' WORKDIR) only
when it holds nothing but the harness's own files (HARNESS_FILES); with other files
beside task.yaml it is malformed, named: no rule says where those files go, and
running it without them would run it half set up.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from t1.tasks.formats.fields import Fields, read_text
from t1.tasks.formats.taskfiles import check_contained
from t1.tasks.spec import (
    EnvironmentSpec,
    SolutionSpec,
    TaskFormat,
    TaskMetadata,
    TaskParseError,
    TaskSpec,
    VerifierKind,
    VerifierSpec,
)

TB1_DEFAULT_AGENT_TIMEOUT_SEC = 360.0
TB1_DEFAULT_TEST_TIMEOUT_SEC = 60.0
TB1_TEST_DIR = "/tests"
TB1_PARSERS = ("pytest",)


def _read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(read_text(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<file>"
        raise TaskParseError(path, where, f"invalid YAML ({getattr(exc, 'problem', exc)})") from None


def _instruction(f: Fields) -> str:
    if f.has("instruction"):
        text = f.text("instruction")
    elif f.has("descriptions"):
        items = f.data["descriptions"]
        if not isinstance(items, list) or not items:
            raise f.error("descriptions", "expected a non-empty list of {key, description}")
        base = next((d for d in items if isinstance(d, dict) and d.get("key") == "base"), items[0])
        if not isinstance(base, dict) or not isinstance(base.get("description"), str):
            raise f.error("descriptions", "entry has no string 'description'")
        text = base["description"]
    else:
        raise f.error("instruction", "required field is missing")
    if not text.strip():
        raise f.error("instruction", "is empty")
    return text


def _solution(root: Path) -> SolutionSpec | None:
    sh, yml = root / "solution.sh", root / "solution.yaml"
    if sh.is_file():
        read_text(sh, "solution.sh")
        return SolutionSpec(script=sh)
    if not yml.is_file():
        return None
    data = _read_yaml(yml)
    if not isinstance(data, list):
        raise TaskParseError(yml, "<root>", "expected a list of {command: ...} entries")
    commands = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("command"), str):
            raise TaskParseError(yml, f"[{i}].command", "required string field is missing")
        commands.append(item["command"])
    return SolutionSpec(script=yml, commands=tuple(commands))


HARNESS_FILES = ("task.yaml", "tests", "run-tests.sh", "solution.sh", "solution.yaml", "docker-compose.yaml",
                 "docker-compose.yml", "README.md", "LICENSE")
"""What Terminal-Bench's harness itself reads from a task folder; anything else reaches the task through its
Dockerfile."""


def _check_environment_files(root: Path) -> None:
    if (root / "Dockerfile").is_file():
        return
    others = sorted(p.name for p in root.iterdir() if p.name not in HARNESS_FILES and not p.name.startswith("."))
    if others:
        raise TaskParseError(root / "Dockerfile", "Dockerfile",
                             f"file is missing, and {len(others)} file(s) beside task.yaml ({', '.join(others[:5])}) "
                             "reach a Terminal-Bench task only through its Dockerfile's COPY lines: without it the "
                             "task would run half set up")


def load_tb1(root: Path) -> TaskSpec:
    """Parse a Terminal-Bench 1 task folder into a TaskSpec."""
    root = root.resolve()
    check_contained(root)
    task_file = root / "task.yaml"
    f = Fields(task_file, _read_yaml(task_file) or {})
    instruction = _instruction(f)
    parser_name = f.text("parser_name", "pytest")
    refused = () if parser_name in TB1_PARSERS else (
        f"task.yaml parser_name = {parser_name!r}: T1 reads the results of {', '.join(TB1_PARSERS)} only",)
    tests_dir = root / "tests"
    run_tests = root / "run-tests.sh"
    if not run_tests.is_file() and not (tests_dir / "test_outputs.py").is_file():
        raise TaskParseError(tests_dir / "test_outputs.py", "tests", "file is missing (and there is no run-tests.sh)")
    _check_environment_files(root)
    dockerfile = root / "Dockerfile"
    compose = root / "docker-compose.yaml"
    if not compose.is_file() and (root / "docker-compose.yml").is_file():
        compose = root / "docker-compose.yml"
    verifier = VerifierSpec(
        kind=VerifierKind.RUN_TESTS_SH if run_tests.is_file() else VerifierKind.PYTEST,
        tests_dir=tests_dir,
        timeout_sec=f.number("max_test_timeout_sec", TB1_DEFAULT_TEST_TIMEOUT_SEC),
        env=(("TEST_DIR", TB1_TEST_DIR),),
        parser_name=parser_name,
        same_shell=f.flag("run_tests_in_same_shell", False),
        run_tests_sh=run_tests if run_tests.is_file() else None,
    )
    author = f.text("author_name", "") or f.text("author_email", "")
    return TaskSpec(
        id=root.name,
        format=TaskFormat.TB1,
        root=root,
        instruction=instruction,
        environment=EnvironmentSpec(
            dockerfile=dockerfile if dockerfile.is_file() else None,
            compose_file=compose if compose.is_file() else None,
            env=(("TEST_DIR", TB1_TEST_DIR),),
            refused=refused,
        ),
        verifier=verifier,
        solution=_solution(root),
        agent_timeout_sec=f.number("max_agent_timeout_sec", TB1_DEFAULT_AGENT_TIMEOUT_SEC),
        metadata=TaskMetadata(
            difficulty=str(f.data.get("difficulty", "unknown")),
            category=f.text("category", "software_engineering"),
            tags=f.str_list("tags"),
            source="terminal-bench-1",
            author=author,
        ),
    )
