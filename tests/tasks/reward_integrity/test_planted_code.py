"""Reward integrity against code planted for the verifier: forged reports, rewritten tests, killed or traced
verifiers, programs, libraries and start-up files in the system, pytest shadowed in the workdir or steered from
the root (attacks.py has the task and the attacks).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest, ShellRole
from t1.tasks.verify.oracle import RunStatus
from tasks.reward_integrity.attacks import (
    ATTACKS,
    HONEST,
    TESTS,
    oracle_run,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


async def test_honest_attempts(provider: LocalProvider, tmp_path: Path) -> None:
    failed = await oracle_run(provider, tmp_path / "honest", ATTACKS["honest_failure"])
    assert failed.status is RunStatus.OK and not failed.resolved
    assert (failed.reward, failed.report.passed, failed.report.total) == HONEST, failed.as_json()
    solved = await oracle_run(provider, tmp_path / "solved", "echo 42 > /app/answer.txt; chmod 644 /app/answer.txt\n")
    assert solved.resolved and solved.reward == 5.0, solved.as_json()


@pytest.mark.parametrize("attack", sorted(set(ATTACKS) - {"honest_failure"}))
async def test_attack_scores_as_an_honest_failure(provider: LocalProvider, tmp_path: Path, attack: str) -> None:
    attacked = await oracle_run(provider, tmp_path / attack, ATTACKS[attack])
    assert attacked.status is not RunStatus.INFRA_ERROR and not attacked.resolved, attacked.as_json()
    outcome = (attacked.reward, attacked.report.passed, attacked.report.total)
    assert outcome == HONEST, (attacked.as_json(), attacked.detail, attacked.report.output_tail)


async def test_solution_never_sees_the_tests(provider: LocalProvider, tmp_path: Path) -> None:
    box = await provider.create(SandboxRequest())
    try:
        agent, verifier = await box.open_shell(), await box.open_shell(role=ShellRole.VERIFIER)
        await verifier.write_file("/tests/test_outputs.py", TESTS.encode())
        verifier_pid = (await verifier.run("echo $$")).output.strip()  # the agent may see its uid unmapped
        seen = await agent.run("cat /tests/test_outputs.py; ls /tests /logs/verifier /tmp/.t1-verifier; "
                               f"cat /proc/{verifier_pid}/environ")
        assert seen.exit_code != 0 and "test_answer" not in seen.output and seen.output.count("Permission denied") == 5
    finally:
        await provider.destroy(box)
