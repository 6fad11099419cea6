"""Reward integrity of Harbor-style test.sh runners: pytest planted in the workdir, plugins registered there,
links at the root, a task environment pointing into the agent's places, git's configuration in
the agent's repository; each class also by a path the issue did not name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxProvider
from t1.tasks.formats.dataset import load_task
from t1.tasks.verify.oracle import RunMode, RunStatus, TaskRun, run_task
from t1.tasks.verify.rewards import RewardMode
from tasks.reward_integrity.attacks import (
    FORGED_ECHO,
    FORGER_PY,
    HARBOR_RUNNERS,
    PASS_ALL_PLUGIN,
    TESTS,
    WORKDIR_PLANTS,
    forger_sh,
    harbor_task,
    oracle_with,
    plant_plugin,
    quote,
    replace_with,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.mark.parametrize("runner", sorted(HARBOR_RUNNERS))
async def test_harbor_tests_ignore_a_pytest_planted_in_the_workdir(provider: LocalProvider, tmp_path: Path,
                                                                   runner: str) -> None:
    """A Harbor test.sh that runs pytest from /app: the agent's /app/pytest.py, _pytest/, pluggy.py and
    conftest.py change nothing; the attempt scores as an honest failure of the same task."""
    runs = {}
    for name, solution in (("honest", "true\n"), ("planted", WORKDIR_PLANTS)):
        task = load_task(harbor_task(tmp_path / name, HARBOR_RUNNERS[runner], solution))
        runs[name] = await run_task(
            provider, task, RunMode.ORACLE, reward_mode=RewardMode.COUNT
        )
    honest, planted = runs["honest"], runs["planted"]
    assert honest.status is RunStatus.OK and honest.report.passed == 1 and not honest.resolved, honest.as_json()
    assert (planted.reward, planted.report.passed, planted.report.total, planted.resolved) == \
        (honest.reward, honest.report.passed, honest.report.total, False), planted.as_json()


ROOT_LINKS = (f"printf '%s\\n' {quote(PASS_ALL_PLUGIN)} > /app/conftest.py; printf '[pytest]\\naddopts = -p "
              "no:terminal\\n' > /app/pytest.ini; "
              "ln -sf /app/conftest.py /conftest.py; ln -sf /app/pytest.ini /pytest.ini\n")
HARBOR_PLANTS = {
    "pytest_in_the_workdir": WORKDIR_PLANTS,
    "plugin_dist_info_in_the_workdir": plant_plugin("/app", "t1forge-0.dist-info"),
    "plugin_egg_info_in_the_workdir": plant_plugin("/app", "t1forge.egg-info"),
    "links_at_the_root": ROOT_LINKS,
    # the same class by another file: a tox.ini linked at the root that loads the agent's plugin module
    "tox_ini_link_at_the_root": plant_plugin("/app", "t1forge-0.dist-info")
    + "printf '[pytest]\\naddopts = -p t1forge_plugin\\n' > /app/tox.ini; ln -sf /app/tox.ini /tox.ini\n",
}
"""What the agent plants in its workdir and at the root for a Harbor test.sh that runs pytest from /app."""


def _scored_as_honest(planted: TaskRun, honest: TaskRun) -> None:
    """What the agent planted changed nothing: the same count and reward as the honest failure, not resolved."""
    assert (planted.reward, planted.report.passed, planted.report.total, planted.resolved) == (
        honest.reward,
        honest.report.passed,
        honest.report.total,
        False,
    ), (planted.as_json(), planted.report.output_tail)


@pytest.mark.parametrize("plant", sorted(HARBOR_PLANTS))
@pytest.mark.parametrize("runner", sorted(HARBOR_RUNNERS))
async def test_harbor_pytest_loads_nothing_the_agent_planted(provider: SandboxProvider, tmp_path: Path, runner: str,
                                                             plant: str, harbor_base: str) -> None:
    """Plugins registered by a distribution in /app, links at / to the agent's conftest or ini: an honest failure."""
    honest = await run_task(provider, load_task(harbor_task(tmp_path / "honest", HARBOR_RUNNERS[runner], "true\n",
                                                             harbor_base)),
                            RunMode.ORACLE, reward_mode=RewardMode.COUNT)
    planted = await run_task(provider, load_task(harbor_task(tmp_path / "planted", HARBOR_RUNNERS[runner],
                                                              HARBOR_PLANTS[plant], harbor_base)),
                             RunMode.ORACLE, reward_mode=RewardMode.COUNT)
    assert honest.status is RunStatus.OK and honest.report.passed == 1 and not honest.resolved, honest.as_json()
    _scored_as_honest(planted, honest)


ENV_DOCKERFILE = ('ENV PATH="/root/.local/bin:$PATH" PYTHONPATH=/app\n'
                  "ENV BASH_ENV=/app/.bash_env LD_LIBRARY_PATH=/app/lib\nWORKDIR /app\n"
                  "RUN cp /etc/hostname /root/.copied\n")
"""A task environment pointing into the agent's places, as real Dockerfiles do (the last line: other variables)."""
TB_TEST_SH = ("#!/bin/bash\ncd /app\nuv venv .tbench-testing\nsource .tbench-testing/bin/activate\n{runner}\n"
              "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
"""Terminal-Bench's test.sh: a venv made in the workdir, activated, then pytest."""
FORGER_FUNCTIONS = "".join(f"{tool}() {{ {FORGED_ECHO.strip()}; return 0; }}; export -f {tool}\n"
                            for tool in ("uvx", "python3", "pytest", "uv"))
ENV_PLANTS = {
    "programs_first_on_the_task_path": "mkdir -p /root/.local/bin\n" + "".join(
        replace_with(f"/root/.local/bin/{tool}", forger_sh()) for tool in ("python3", "pytest", "uvx", "uv")),
    "startup_code_on_the_task_pythonpath": f"printf '%s\\n' {quote(FORGER_PY)} > /app/sitecustomize.py; "
                                           "cp /app/sitecustomize.py /app/usercustomize.py\n",
    "a_venv_left_in_the_workdir": "mkdir -p /app/.tbench-testing/bin\n"
                                  f"printf '%s' {quote(FORGER_FUNCTIONS)} > /app/.tbench-testing/bin/activate\n",
    # the same class by other variables: a shell start-up file, and the shell itself first on the task's PATH
    "shell_startup_named_by_the_task_env": f"printf '%s' {quote(FORGER_FUNCTIONS)} > /app/.bash_env\n",
    "bash_first_on_the_task_path": "mkdir -p /root/.local/bin\n" + replace_with(
        "/root/.local/bin/bash", "#!/usr/bin/bash\n" + FORGED_ECHO + "echo 1 > /logs/verifier/reward.txt\nexit 0\n"),
}


def env_task(root: Path, runner: str, solution: str, base: str) -> Path:
    harbor_task(root, runner, solution)
    (root / "environment" / "Dockerfile").write_text(f"FROM {base}\n{ENV_DOCKERFILE}")
    (root / "tests" / "test.sh").write_text(TB_TEST_SH.format(runner=runner))
    return root


@pytest.mark.parametrize("plant", sorted(ENV_PLANTS))
@pytest.mark.parametrize("runner", sorted(HARBOR_RUNNERS))
async def test_task_environment_into_agent_dirs_runs_nothing_planted(provider: SandboxProvider, tmp_path: Path,
                                                                    runner: str, plant: str, harbor_base: str) -> None:
    """`ENV PATH="/root/.local/bin:$PATH"`, `PYTHONPATH=/app`, `BASH_ENV`, Terminal-Bench's venv in /app: the
    verifier runs none of what the agent put there, and still finds its stand-ins (uv, uvx) on that PATH."""
    honest = await run_task(
        provider,
        load_task(env_task(tmp_path / "honest", HARBOR_RUNNERS[runner], "true\n", harbor_base)),
        RunMode.ORACLE,
        reward_mode=RewardMode.COUNT,
    )
    assert honest.status is RunStatus.OK and honest.report.passed == 1 and not honest.resolved, \
        (honest.as_json(), honest.report.output_tail)
    planted = await run_task(provider, load_task(env_task(tmp_path / "planted", HARBOR_RUNNERS[runner],
                                                           ENV_PLANTS[plant], harbor_base)),
                             RunMode.ORACLE, reward_mode=RewardMode.COUNT)
    _scored_as_honest(planted, honest)


GIT_TESTS = TESTS + '''
def test_repository_status():
    import subprocess
    assert subprocess.run(["git", "status", "--short"], cwd="/app").returncode == 0
'''
FORGED_NAMES = [
    f"test_outputs.py::{n}"
    for n in (
        "test_app_exists",
        "test_answer_exists",
        "test_answer_value",
        "test_answer_single_line",
        "test_answer_mode",
        "test_repository_status",
    )
]
GIT_FORGER = ("#!/bin/sh\nfor f in ctrf.json ctrf-report.json; do printf '%s' '" + '{"results":{"tests":[' + ",".join(
    f'{{"name":"{n}","status":"passed"}}' for n in FORGED_NAMES) + "]}}' > /logs/verifier/$f; done\n"
    "echo 1 > /logs/verifier/reward.txt\ncat\n")
GIT_PLANTS = {
    "fsmonitor": "git config core.fsmonitor /app/.forge\n",
    # the same class by another key: a clean filter git runs on `git status` for a file whose stat changed
    "clean_filter": "echo '* filter=t1' > .git/info/attributes; git config filter.t1.clean /app/.forge; "
                    "echo data > data.txt; git add data.txt; touch -d 2020-01-01 data.txt\n",
}


@pytest.mark.parametrize("plant", sorted(GIT_PLANTS))
async def test_git_runs_no_program_the_agents_repository_names(provider: SandboxProvider, tmp_path: Path,
                                                               plant: str) -> None:
    """A test that runs `git status` in the agent's repository: its fsmonitor or filter does not run as the
    verifier (before: it wrote the CTRF and reward files T1 read, a full pass of 6 where 2 pass)."""
    honest = await oracle_with(provider, tmp_path / "honest", GIT_TESTS, "git init -q /app\n")
    assert (honest.reward, honest.report.passed, honest.report.total) == (2.0, 2, 6), honest.as_json()
    plant_script = (f"cd /app && git init -q && printf '%s' {quote(GIT_FORGER)} > /app/.forge && chmod 755 /app/.forge "
                    "&& "
                    + GIT_PLANTS[plant])
    planted = await oracle_with(provider, tmp_path / "planted", GIT_TESTS, plant_script)
    assert (planted.reward, planted.report.passed, planted.report.total, planted.resolved) == (2.0, 2, 6, False), \
        (planted.as_json(), planted.report.output_tail)
