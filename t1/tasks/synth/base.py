"""The shape of a synthesized task and how it is written as a Harbor task folder.

A family generator returns a SynthTask: an instruction, files placed under /app,
a setup script (replayed as the Dockerfile's RUN), a pytest file with several
independent tests (one verifier each, so the count reward is dense) and an oracle
solution. Multi-step tasks carry SynthSteps instead of a single test/solution.
Every folder is plain Harbor format: task.toml, instruction.md,
environment/Dockerfile + files/, tests/test.sh + test_outputs.py, solution/solve.sh.
Curriculum tasks (`curriculum.py`) carry a bash tests/test.sh of their own and the oracle's
commands one per line in solution/turns.txt.
"""

from __future__ import annotations

import json
import random
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

TURNS_FILE = "turns.txt"  # T1's own: the oracle's commands, one a line, typed one per turn by the scripted policy
BASE_IMAGE = "python:3.11-bookworm"  # Debian with python3, git, gcc/g++, make; sqlite through python3
TEST_SH = """#!/bin/bash
# Verifier: pytest over test_outputs.py; per-test results in JUnit XML, binary reward in reward.txt.
python3 -c "import pytest" 2>/dev/null || pip install -q pytest
mkdir -p /logs/verifier
cd /app 2>/dev/null || true
python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider --junitxml=/logs/verifier/junit.xml
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


@dataclass(frozen=True, slots=True)
class SynthStep:
    name: str
    instruction: str
    tests: str
    solution: str


@dataclass(frozen=True, slots=True)
class SynthTask:
    family: str
    difficulty: str
    category: str
    instruction: str
    tests: str = ""
    solution: str = ""
    files: dict[str, str] = field(default_factory=dict)  # path under /app -> text
    executable: tuple[str, ...] = ()
    setup: str = ""  # bash run in /app after the files are copied
    steps: tuple[SynthStep, ...] = ()
    agent_timeout_sec: float = 900.0
    verifier_timeout_sec: float = 120.0
    check_sh: str = ""  # a bash tests/test.sh of its own (writes reward.json) instead of pytest over `tests`
    turns: tuple[str, ...] = ()  # the oracle's commands, one per turn (solution/turns.txt); solve.sh runs them all
    solve: str = ""  # solve.sh's commands when they differ from the typed turns
    # a hurried teacher's commands: a step skipped, right only when state the instruction does not show allows
    # it (`synthesize_curriculum(shortcuts=...)` types them in some demonstrations; solve.sh stays `turns`)
    shortcut: tuple[str, ...] = ()


Generator = Callable[[random.Random, str], SynthTask]


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _toml_str(value: str) -> str:
    return json.dumps(value)


def _task_toml(task: SynthTask, task_id: str, split: str, seed: int) -> str:
    lines = [
        'version = "1.0"',
        'multi_step_reward_strategy = "mean"' if task.steps else "",
        "",
        "[task]",
        f"name = {_toml_str(task_id)}",
        "",
        "[metadata]",
        f"difficulty = {_toml_str(task.difficulty)}",
        f"category = {_toml_str(task.category)}",
        f"tags = [{_toml_str(task.family)}, \"t1-synth\"]",
        f"family = {_toml_str(task.family)}",
        f"split = {_toml_str(split)}",
        'source = "t1-synth"',
        f"seed = {seed}",
        "",
        "[verifier]",
        f"timeout_sec = {task.verifier_timeout_sec}",
        "",
        "[agent]",
        f"timeout_sec = {task.agent_timeout_sec}",
        "",
        "[environment]",
        'workdir = "/app"',
        "allow_internet = false",
        "cpus = 1",
        "memory_mb = 1024",
    ]
    for step in task.steps:
        lines += ["", "[[steps]]", f"name = {_toml_str(step.name)}", "min_reward = 0.0"]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def write_task(task: SynthTask, root: Path, task_id: str, split: str, seed: int) -> Path:
    """Write one synthesized task as a Harbor folder at root/task_id."""
    out = root / task_id
    _write(out / "task.toml", _task_toml(task, task_id, split, seed))
    _write(out / "instruction.md", task.instruction.rstrip() + "\n")
    docker = [f"FROM {BASE_IMAGE}", "WORKDIR /app"]
    for rel, text in task.files.items():
        _write(out / "environment" / "files" / rel, text, 0o755 if rel in task.executable else 0o644)
    if task.files:
        docker.append("COPY files/ /app/")
    if task.setup:
        _write(out / "environment" / "setup.sh", task.setup)
        docker += ["COPY setup.sh /tmp/t1-setup.sh", "RUN bash /tmp/t1-setup.sh && rm -f /tmp/t1-setup.sh"]
    _write(out / "environment" / "Dockerfile", "\n".join(docker) + "\n")
    if task.steps:
        for step in task.steps:
            base = out / "steps" / step.name
            _write(base / "instruction.md", step.instruction.rstrip() + "\n")
            _write(base / "tests" / "test.sh", TEST_SH, 0o755)
            _write(base / "tests" / "test_outputs.py", step.tests)
            _write(base / "solution" / "solve.sh", "#!/bin/bash\nset -e\ncd /app\n" + step.solution, 0o755)
    elif task.check_sh:
        _write(out / "tests" / "test.sh", task.check_sh, 0o755)
        # no set -e: a turn may fail on purpose (the error it prints is what the next one reads)
        _write(out / "solution" / "solve.sh", "#!/bin/bash\n"
                                              "cd /app\n" + (task.solve or "\n".join(task.turns)) + "\n", 0o755)
        _write(out / "solution" / TURNS_FILE, "\n".join(task.turns) + "\n")
    else:
        _write(out / "tests" / "test.sh", TEST_SH, 0o755)
        _write(out / "tests" / "test_outputs.py", task.tests)
        _write(out / "solution" / "solve.sh", "#!/bin/bash\nset -e\ncd /app\n" + task.solution, 0o755)
    return out


def _rename_text(text: str, pattern: re.Pattern[str], mapping: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        start, end = m.span()
        is_method = start > 0 and text[start - 1] == "." and text[end:end + 1] == "("
        return m.group(0) if is_method else mapping[m.group(0)]

    return pattern.sub(sub, text)


def renamed(task: SynthTask, mapping: dict[str, str]) -> SynthTask:
    """The task with whole-word tokens renamed everywhere (texts, file names, file contents, setup, steps).

    Method calls (`.name(`) are left alone so json.load(...) or d.items() survive; SQL columns (`o.city`) are
    renamed. Families use this to vary names per seed, so tasks of one family share little text.
    """
    if not mapping:
        return task
    alternatives = "|".join(sorted(map(re.escape, mapping), key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9_])(?:{alternatives})(?![A-Za-z0-9_])")

    def r(text: str) -> str:
        return _rename_text(text, pattern, mapping)

    return replace(
        task,
        instruction=r(task.instruction), tests=r(task.tests), solution=r(task.solution), setup=r(task.setup),
        files={r(k): r(v) for k, v in task.files.items()}, executable=tuple(r(e) for e in task.executable),
        steps=tuple(SynthStep(s.name, r(s.instruction), r(s.tests), r(s.solution)) for s in task.steps),
    )
