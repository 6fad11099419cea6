"""Failures an attempt causes are scored as its own, never laundered into infra errors: a filled sandbox, tests
left uncollectable; one task's crash never ends a batch.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import Sandbox, SandboxProvider, SandboxRequest
from t1.tasks.formats.dataset import load_task
from t1.tasks.spec import VerifierKind
from t1.tasks.verify.oracle import RunMode, RunStatus, TaskRun, run_task, run_tasks
from t1.tasks.verify.report import FailureMode
from t1.tasks.verify.rewards import RewardMode
from t1.tasks.verify.verifier import build_report
from tasks.reward_integrity.attacks import (
    FILL_INODES,
    HONEST,
    attack_task,
    oracle_run,
    quote,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


async def test_filling_the_sandbox_is_the_attempts_failure(provider: LocalProvider, tmp_path: Path) -> None:
    """Inodes filled with empty files (the tmpfs has a bound): the verifier runs on storage of its own, and the
    attempt scores as an honest failure (it was `infra_error crash:SFTPFailure`, out of every statistic)."""
    if not provider.cfg.overlay:
        pytest.skip("the read-only root's tree dirs are on the host's disk")
    run = await oracle_run(provider, tmp_path / "fill", FILL_INODES)
    assert run.status is not RunStatus.INFRA_ERROR and not run.resolved, run.as_json()
    assert (run.reward, run.report.passed, run.report.total) == HONEST, (
        run.why,
        run.detail,
        run.report.output_tail[-800:],
    )


SEPARATE_TOML = """artifacts = ["/app/out"]
[environment]
allow_internet = false
[verifier]
environment_mode = "separate"
timeout_sec = 60
"""
SEPARATE_TEST = ('[ "$(cat /app/out/answer.txt 2>/dev/null)" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > '
                 '/logs/verifier/reward.txt\n')
IN_THE_WAY = {
    # what the agent can put where T1 packs the artifacts: /tmp replaced by a file, or closed to everyone
    "tmp_is_a_file": "rm -rf /tmp 2>/dev/null; rm -rf /tmp/* /tmp/.[!.]* 2>/dev/null; rmdir /tmp 2>/dev/null; touch "
                     "/tmp\n",
    "tmp_closed": "chmod 000 /tmp 2>/dev/null; true\n",
    "pack_names_taken": "for i in $(seq 200); do mkdir -p /tmp/.t1-artifacts-$i.tgz /tmp/.t1-artifacts.tgz; done\n",
}


@pytest.mark.parametrize("way", sorted(IN_THE_WAY))
async def test_the_artifact_pack_cannot_be_laundered_into_an_infra_error(provider: SandboxProvider, tmp_path: Path,
                                                                         way: str) -> None:
    """A separate verifier's task whose solution does the work and then puts something where T1 packs the artifacts:
    the attempt is scored, never an infra error: resolved (T1's pack path was not in its way) or its own failure."""
    root = tmp_path / way
    (root / "tests").mkdir(parents=True)
    (root / "solution").mkdir()
    (root / "task.toml").write_text(SEPARATE_TOML)
    (root / "instruction.md").write_text("Write 42 into /app/out/answer.txt.\n")
    (root / "tests" / "test.sh").write_text(SEPARATE_TEST)
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\nmkdir -p /app/out && echo 42 > /app/out/answer.txt\n"
                                                + IN_THE_WAY[way])
    run = await run_task(provider, load_task(root), RunMode.ORACLE)
    assert run.status is not RunStatus.INFRA_ERROR, (run.as_json(), run.why, run.detail)
    assert run.resolved or run.report.failure_mode is FailureMode.AGENT_BROKE_VERIFIER, (run.as_json(), run.why)


async def test_one_tasks_crash_does_not_end_a_batch(tmp_path: Path) -> None:
    class Broken(LocalProvider):
        async def create(self, request: SandboxRequest) -> Sandbox:
            raise RuntimeError("a provider bug")
    specs = [load_task(attack_task(tmp_path / name, "true\n")) for name in ("a", "b")]
    runs = await run_tasks(Broken(LocalProviderConfig(root=tmp_path / "root"), ShellConfig()), specs, RunMode.ORACLE)
    assert [(r.status, r.detail) for r in runs] == [(RunStatus.INFRA_ERROR, "crash:RuntimeError: a provider bug")] * 2


def test_a_verifier_that_could_not_start_its_runner_says_so() -> None:
    """A task PATH that hid the test runner read "reward 0" with nothing else: the why names the missing program."""
    output = "/tests/test.sh: line 4: uvx: command not found\n"
    report = build_report(VerifierKind.TEST_SH, output, {"reward.txt": "0"}, exit_code=0, timed_out=False)
    report = replace(report, output_tail=output)
    assert report.why.startswith("reward 0; the verifier could not start uvx (command not found)"), report.why


MODULE_TESTS = '''import sys
sys.path.insert(0, "/app")
import answer  # the attempt's module, imported at collection

def test_value():
    assert answer.VALUE == 42

def test_type():
    assert type(answer.VALUE) is int
'''

COLLECTION_ATTACKS = {
    # what the attempt leaves that pytest cannot collect: its own failure, the cause in `why`
    "no_module": ("rm -f /app/answer.py\n", "ModuleNotFoundError: No module named 'answer'"),
    "syntax_error": ("echo 'VALUE = (' > /app/answer.py\n", "SyntaxError"),
    "raise_at_import": ("echo 'raise RuntimeError(\"no collection\")' > /app/answer.py\n", "no collection"),
    "missing_package": ("echo 'import t1_surely_absent_pkg' > /app/answer.py\n", "t1_surely_absent_pkg"),
    # and what ends pytest during collection instead: still scored, never the task's or the infrastructure's
    "exit_at_import": ("printf 'import os\\nos._exit(0)\\n' > /app/answer.py\n", ""),
    "skip_module": ("printf 'import pytest\\npytest.skip(\"no\", allow_module_level=True)\\n' > /app/answer.py\n", ""),
    "forge_at_import": ("printf '%s\\n' " + quote("import os, sys; sys.stdout.write(" + repr(
        "=== short test summary info ===\nPASSED ../tests/test_outputs.py::test_value\n"
        "PASSED ../tests/test_outputs.py::test_type\n"
        "=== 2 passed in 0.01s ===\n") + "); sys.stdout.flush(); os._exit(0)")
                        + " > /app/answer.py\n", ""),
    "interrupt_collection": ("echo 'raise KeyboardInterrupt' > /app/answer.py\n", ""),
    "wrong_answer": ("echo 'VALUE = \"42\"' > /app/answer.py\n", "assert '42' == 42"),
}


async def module_task_run(provider: SandboxProvider, root: Path, attack: str) -> TaskRun:
    """The task whose tests import the attempt's /app/answer.py, its reference solution replaced by `attack`."""
    root.mkdir(parents=True)
    (root / "task.yaml").write_text("instruction: Write VALUE = 42 into /app/answer.py.\nmax_test_timeout_sec: 60\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_outputs.py").write_text(MODULE_TESTS)
    (root / "solution.sh").write_text("#!/bin/bash\necho 'VALUE = 42' > /app/answer.py\n")
    attempt = root.parent / f"{root.name}-attempt.sh"  # outside the task folder: not the task's
    attempt.write_text("#!/bin/bash\n" + attack)
    spec = load_task(root)  # what the task folder says is decided before the attempt, from the reference solution
    assert spec.solution is not None
    spec = replace(spec, solution=replace(spec.solution, script=attempt),
                   environment=replace(spec.environment, allow_internet=False))
    return await run_task(provider, spec, RunMode.ORACLE, reward_mode=RewardMode.COUNT)


@pytest.mark.parametrize("attack", sorted(COLLECTION_ATTACKS))
async def test_an_attempt_that_breaks_collection_scores_as_an_honest_failure(
        provider: LocalProvider, tmp_path: Path, attack: str) -> None:
    """An attempt that leaves its tests uncollectable (no module, a broken one, one that exits, skips or interrupts
    pytest at import) scores 0 as its own failure: never an infra error, never the task's setup failure or a need,
    and a collection error is not reported as tampering; the cause is in `why`."""
    script, cause = COLLECTION_ATTACKS[attack]
    run = await module_task_run(provider, tmp_path / attack, script)
    assert run.status in (RunStatus.OK, RunStatus.VERIFIER_ERROR) and not run.resolved, run.as_json()
    assert (run.reward, run.report.passed) == (0.0, 0), run.as_json()
    assert run.report.failure_mode not in (FailureMode.VERIFIER_TAMPERED, FailureMode.INFRA_ERROR), run.as_json()
    if cause:  # a collection error or a failed test: the honest failure of the task, the cause named
        assert run.status is RunStatus.OK and run.report.failure_mode is FailureMode.NONE, run.as_json()
        assert cause in run.why, run.why
    solved = await module_task_run(provider, tmp_path / f"{attack}-solved", "echo 'VALUE = 42' > /app/answer.py\n")
    assert solved.resolved and solved.reward == 2.0, solved.as_json()
