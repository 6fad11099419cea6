"""Issue 19 case 7: NaN or infinite timeouts and unbounded healthchecks are refused when a task is read,
naming the file and the field (inf would disable a deadline; NaN makes every attempt crash)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from t1.tasks.formats.dataset import load_task
from t1.tasks.spec import TaskParseError


def _task(root: Path, agent: str = "timeout_sec = 60.0", environment: str = "") -> Path:
    d = root / "t"
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text(f'version = "1.0"\n[agent]\n{agent}\n[verifier]\ntimeout_sec = 30\n'
                                 f'[environment]\nworkdir = "/app"\n{environment}\n')
    (d / "instruction.md").write_text("Do it.\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return d


@pytest.mark.parametrize(("agent", "environment", "field", "problem"), [
    ("timeout_sec = nan", "", "agent.timeout_sec", "must be a finite number, got nan"),
    ("timeout_sec = inf", "", "agent.timeout_sec", "must be a finite number, got inf"),
    ("timeout_sec = 60.0", "[environment.healthcheck]\ncommand = 'true'\nretries = 1_000_000_000",
     "environment.healthcheck.retries", "must be <= 1000"),
    ("timeout_sec = 60.0", "[environment.healthcheck]\ncommand = 'true'\ninterval_sec = inf",
     "environment.healthcheck.interval_sec", "must be a finite number"),
])
def test_unbounded_numbers_are_refused_by_field(tmp_path: Path, agent: str, environment: str, field: str,
                                                problem: str) -> None:
    d = _task(tmp_path, agent, environment)
    with pytest.raises(TaskParseError, match=re.escape(problem)) as info:
        load_task(d)
    assert field in str(info.value) and "task.toml" in str(info.value)


def test_a_bounded_healthcheck_loads(tmp_path: Path) -> None:
    d = _task(tmp_path, environment="[environment.healthcheck]\ncommand = 'true'\nretries = 5\ninterval_sec = 0.5")
    hc = load_task(d).environment.healthcheck
    assert hc is not None and hc.retries == 5 and hc.interval_sec == 0.5
