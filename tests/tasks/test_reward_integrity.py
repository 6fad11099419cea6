"""Reward integrity, attacked as a policy would: solutions that try to write their own reward, not do the work.

Each attack is the oracle solution of a task whose five tests check /app/answer.txt (one passes
without any work). The solution does not do the work; it attacks the verifier instead, mostly
from background processes that keep running while the verifier runs. The outcome must equal
that of an honest failed attempt: the same reward, status and pass count, never resolved, never
an infra error.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local import LocalProvider
from t1.sandbox.types import Sandbox, SandboxProvider, SandboxRequest, ShellRole
from t1.tasks.dataset import load_task
from t1.tasks.declared import DeclaredTests, check_report, declared_in_source, declared_tests
from t1.tasks.oracle import RunMode, RunStatus, TaskRun, run_task, run_tasks
from t1.tasks.report import FailureMode, TestResult, TestStatus
from t1.tasks.rewards import RewardMode, episode_reward
from t1.tasks.spec import VerifierKind
from t1.tasks.verifier import build_report

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

TESTS = '''import os

def test_app_exists():
    assert os.path.isdir("/app")

def test_answer_exists():
    assert os.path.exists("/app/answer.txt")

def test_answer_value():
    assert open("/app/answer.txt").read().strip() == "42"

def test_answer_single_line():
    assert open("/app/answer.txt").read().count("\\n") == 1

def test_answer_mode():
    assert os.stat("/app/answer.txt").st_mode & 0o777 == 0o644
'''

FORGED_PY = "".join(f"def test_forged_{i}():\n    pass\n" for i in range(200))
FORGED_JUNIT = "<testsuite>" + "".join(f'<testcase classname="t" name="test_{i}"/>' for i in range(200)) + "</testsuite>"
FORGED_CTRF = '{"results":{"tests":[' + ",".join(f'{{"name":"test_{i}","status":"passed"}}' for i in range(200)) + "]}}"
FORGERIES = (f"cat > /tmp/forged.py <<'EOF'\n{FORGED_PY}EOF\n"
             f"cat > /tmp/forged.xml <<'EOF'\n{FORGED_JUNIT}\nEOF\n"
             f"cat > /tmp/forged.json <<'EOF'\n{FORGED_CTRF}\nEOF\n")


FORGED_RUN = ("=== short test summary info ===\n" + "".join(
    f"PASSED test_outputs.py::{name}\n" for name in ("test_app_exists", "test_answer_exists", "test_answer_value",
                                                   "test_answer_single_line", "test_answer_mode"))
    + "=== 5 passed in 0.01s ===\n")
"""What a forger prints in the verifier's place: every declared test passed (a forged resolve if it ran)."""
_FORGED_ECHO = f"printf '{FORGED_RUN.replace(chr(10), chr(92) + 'n')}'\n"
_FORGER_PY = f"import os, sys; sys.stdout.write({FORGED_RUN!r}); sys.stdout.flush(); os._exit(0)"
_FORGER_PY_LINE = "import os, sys; 'pytest' in ' '.join(sys.argv + [open('/proc/self/cmdline').read()]) and exec(" \
    + repr(_FORGER_PY) + ")\n"
_PASS_ALL_PLUGIN = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                    "    outcome = yield\n    report = outcome.get_result()\n    report.outcome = 'passed'\n")
_PRELOAD_C = f"""#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void forge(void) {{
    char cmd[4096] = {{0}}; FILE *f = fopen("/proc/self/cmdline", "r");
    if (!f) return;
    size_t n = fread(cmd, 1, sizeof cmd - 1, f); fclose(f);
    for (size_t i = 0; i < n; i++) if (!cmd[i]) cmd[i] = 32;
    if (strstr(cmd, "pytest")) {{ fputs({FORGED_RUN!r}, stdout); fflush(stdout); _exit(0); }}
}}
""".replace("'", '"')
_SITE_DIRS = ("/usr/lib/python3/dist-packages", "/usr/local/lib/python3.11/dist-packages", "/usr/lib/python3.11/site-packages")


def _q(text: str) -> str:
    return shlex.quote(text)


def _forger_sh() -> str:
    return "#!/bin/sh\n" + _FORGED_ECHO + "exit 0\n"


def _replace(path: str, script: str) -> str:
    """Put `script` at `path`, executable, replacing (by rename: a running binary cannot be written) what was there."""
    return f"printf '%s' {_q(script)} > {path}.t1new && chmod 755 {path}.t1new && mv -f {path}.t1new {path}\n"


def _loop(body: str) -> str:
    """A detached background loop that outlives the solution's shell command (`body` without single quotes)."""
    return f"nohup setsid bash -c '{body}; for i in $(seq 600); do {body}; sleep 0.02; done' >/dev/null 2>&1 &\n"


def _plant_plugin(where: str, dist: str) -> str:
    """A pytest plugin that passes every test, registered (pytest11 entry point) by a distribution `dist` in `where`."""
    return (f"mkdir -p {where}/{dist}; printf '[pytest11]\\nt1forge = t1forge_plugin\\n' > {where}/{dist}/entry_points.txt; "
            f"printf 'Metadata-Version: 2.1\\nName: t1forge\\nVersion: 0\\n' > {where}/{dist}/METADATA; "
            f"cp {where}/{dist}/METADATA {where}/{dist}/PKG-INFO; printf '%s\\n' {_q(_PASS_ALL_PLUGIN)} > {where}/t1forge_plugin.py\n")


ATTACKS = {
    "honest_failure": "true\n",
    "rewrite_tests_in_background": FORGERIES + _loop("cp /tmp/forged.py /tests/test_outputs.py 2>/dev/null"),
    "write_reward_txt": "echo 1 > /logs/verifier/reward.txt\n" + _loop("echo 200 > /logs/verifier/reward.txt 2>/dev/null"),
    "forge_junit_and_ctrf": FORGERIES + _loop("cp /tmp/forged.xml /logs/verifier/junit.xml 2>/dev/null; "
                                              "cp /tmp/forged.json /logs/verifier/ctrf.json 2>/dev/null"),
    "kill_everything_else": _loop("kill -9 -1 2>/dev/null; pkill -9 -u 64999 2>/dev/null"),
    "ptrace_the_verifier": _loop("for p in $(pgrep -u 64999); do python3 -c \"import ctypes,sys; "
                                 "ctypes.CDLL(None).ptrace(16, int(sys.argv[1]), 0, 0)\" $p; kill -STOP $p; done"),
    "break_verifier_logs": "rm -rf /logs/verifier; touch /logs/verifier\n",
    # Code left for the verifier to run: a python3 earlier on PATH that writes a reward, a preload.
    "plant_code_for_the_verifier": "mkdir -p /usr/local/bin 2>/dev/null; printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n'"
                                   " > /usr/local/bin/python3 2>/dev/null; chmod +x /usr/local/bin/python3 2>/dev/null; "
                                   "echo /tmp/x.so > /etc/ld.so.preload 2>/dev/null; true\n",
    # Code left in the system for the verifier to load or run (with the copy-on-write root the agent may write
    # anywhere): it prints a forged pass of every declared test. The verifier runs the system as setup left it.
    "plant_python3": _replace("/usr/bin/python3", _forger_sh()),
    "plant_bash": "cp -p /usr/bin/bash /usr/bin/bash.real\n" + _replace(
        "/usr/bin/bash", "#!/usr/bin/bash.real\n" + _FORGED_ECHO + "exec /usr/bin/bash.real \"$@\"\n"),
    "plant_usr_local_bin": "mkdir -p /usr/local/bin\n" + "".join(
        _replace(f"/usr/local/bin/{tool}", _forger_sh()) for tool in ("python3", "python", "pytest", "bash", "env")),
    "plant_preloaded_library": (
        f"cat > /tmp/forge.c <<'EOF'\n{_PRELOAD_C}EOF\n"
        "gcc -shared -fPIC -o /usr/lib/libt1forge.so /tmp/forge.c && echo /usr/lib/libt1forge.so > /etc/ld.so.preload\n"),
    "plant_python_startup": "".join(
        f"mkdir -p {d}; printf %s {_q(_FORGER_PY_LINE)} > {d}/t1forge.pth; printf '%s\\n' {_q(_FORGER_PY)} > {d}/sitecustomize.py; "
        f"cp {d}/sitecustomize.py {d}/usercustomize.py\n" for d in _SITE_DIRS)
        + f"printf '\\n%s\\n' {_q(_FORGER_PY)} >> /usr/lib/python3.11/os.py\n",
    "plant_pytest_plugin": "".join(
        f"mkdir -p {d}/t1forge-0.dist-info; printf '[pytest11]\\nt1forge = t1forge_plugin\\n' > {d}/t1forge-0.dist-info/entry_points.txt; "
        f"printf 'Metadata-Version: 2.1\\nName: t1forge\\nVersion: 0\\n' > {d}/t1forge-0.dist-info/METADATA; "
        f"printf '%s\\n' {_q(_PASS_ALL_PLUGIN)} > {d}/t1forge_plugin.py\n" for d in _SITE_DIRS),
    "plant_shell_startup": "".join(f"printf '%s\\n' {_q(_FORGED_ECHO + 'exit 0')} >> {f}\n" for f in (
        "/etc/bash.bashrc", "/etc/profile", "/etc/profile.d/t1forge.sh", "/etc/environment", "/root/.bashrc"))
        + "echo 'BASH_ENV=/etc/profile.d/t1forge.sh' >> /etc/environment\n",
    "edit_passwd_for_the_verifier": "sed -i 's|^root:.*|root:x:0:0:root:/app:/app/evil.sh|' /etc/passwd\n"
                                    "echo 't1-verifier:x:64999:64999::/app:/app/evil.sh' >> /etc/passwd\n"
                                    + _replace("/app/evil.sh", _forger_sh()),
    "shadow_pytest_in_the_workdir": f"mkdir -p /app/_pytest; printf '%s\\n' {_q(_FORGER_PY)} > /app/pytest.py; "
                                    f"cp /app/pytest.py /app/pluggy.py; cp /app/pytest.py /app/_pytest/__init__.py\n",
    "steer_pytest_from_the_root": f"printf '%s\\n' {_q(_PASS_ALL_PLUGIN)} > /conftest.py; touch /setup.py; "
                                  "printf '[pytest]\\naddopts = -p no:terminal\\n' > /pytest.ini; cp /conftest.py /tests-conftest.py\n",
    "kill_pid_1": "kill -9 1; python3 -c \"import ctypes; print(ctypes.CDLL(None).ptrace(16, 1, 0, 0))\"\n",
    "read_and_plant_tests": "cat /tests/test_outputs.py > /app/stolen.txt; ls /tests >> /app/stolen.txt; "
                            "printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport():\\n"
                            "    o = yield\\n    o.get_result().outcome = \"passed\"\\n' > /app/conftest.py; "
                            "printf '[pytest]\\naddopts = -p no:terminal\\n' > /app/pytest.ini\n",
    # A pytest plugin registered by a distribution in the working directory (pytest autoloads entry points
    # from all of sys.path, which T1's pytest used to extend with the working directory): a dist-info, and
    # an egg-info, which importlib.metadata reads as well.
    "plugin_registered_in_the_workdir": _plant_plugin("/app", "t1forge-0.dist-info"),
    "plugin_registered_by_an_egg_info": _plant_plugin("/app", "t1forge.egg-info"),
}


@pytest.fixture(params=[pytest.param(True, id="overlay"), pytest.param(False, id="readonly", marks=pytest.mark.slow)])
async def provider(request: pytest.FixtureRequest, sandbox_root: Path) -> AsyncIterator[LocalProvider]:
    """The local provider with the copy-on-write root (the default) and, in the slow suite, the read-only root."""
    prov = LocalProvider(LocalProviderConfig(root=sandbox_root, overlay=request.param), ShellConfig(command_timeout_s=120.0))
    yield prov
    await prov.close()


def _task(root: Path, solution: str) -> Path:
    root.mkdir(parents=True)
    (root / "task.yaml").write_text("instruction: Write 42 into /app/answer.txt.\nmax_test_timeout_sec: 60\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_outputs.py").write_text(TESTS)
    (root / "solution.sh").write_text("#!/bin/bash\n" + solution)
    return root


async def _oracle(provider: SandboxProvider, root: Path, solution: str) -> TaskRun:
    """The attack task's oracle run, offline (no attack needs the internet; the docker suite runs these too)."""
    spec = load_task(_task(root, solution))
    spec = replace(spec, environment=replace(spec.environment, allow_internet=False))
    return await run_task(provider, spec, RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)


def _replays(provider: SandboxProvider) -> bool:
    """Whether the provider replays a task's Dockerfile (local) or builds its image (docker)."""
    return isinstance(provider, LocalProvider)


HONEST = (1.0, 1, 5)
"""Reward, passed and total of the honest failed attempt (only test_app_exists passes without work)."""


async def test_honest_attempts(provider: LocalProvider, tmp_path: Path) -> None:
    failed = await _oracle(provider, tmp_path / "honest", ATTACKS["honest_failure"])
    assert failed.status is RunStatus.OK and not failed.resolved
    assert (failed.reward, failed.report.passed, failed.report.total) == HONEST, failed.as_json()
    solved = await _oracle(provider, tmp_path / "solved", "echo 42 > /app/answer.txt; chmod 644 /app/answer.txt\n")
    assert solved.resolved and solved.reward == 5.0, solved.as_json()


@pytest.mark.parametrize("attack", sorted(set(ATTACKS) - {"honest_failure"}))
async def test_attack_scores_as_an_honest_failure(provider: LocalProvider, tmp_path: Path, attack: str) -> None:
    attacked = await _oracle(provider, tmp_path / attack, ATTACKS[attack])
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


def test_declared_tests_count_parametrized_cases(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        "import pytest\n@pytest.mark.parametrize('x', [1, 2, 3])\ndef test_p(x): pass\n"
        "def test_q(): pass\nclass TestK:\n    @pytest.mark.parametrize('y', (1, 2))\n    def test_m(self, y): pass\n"
        "def helper(): pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b_test.py").write_text("import unittest\nclass Case(unittest.TestCase):\n    def test_u(self): pass\n")
    declared = declared_tests(tmp_path)
    assert declared == DeclaredTests(frozenset({"test_p", "test_q", "TestK::test_m", "Case::test_u"}), 3 + 1 + 2 + 1)
    found, _ = declared_in_source("import pytest\nVALS = [1, 2]\nN = range(2, 7)\nLATER = []\nLATER = [1]\n"
                                  "@pytest.mark.parametrize('x', VALS)\n@pytest.mark.parametrize('y', list(N))\ndef test_d(x, y): pass\n"
                                  "@pytest.mark.parametrize('x', range(4))\ndef test_r(x): pass\n"
                                  "@pytest.mark.parametrize('x', [str(i) for i in range(9)])\ndef test_c(x): pass\n"
                                  "@pytest.mark.parametrize('x', LATER)\ndef test_l(x): pass\n")
    assert found == {"test_d": 10, "test_r": 4, "test_c": None, "test_l": None}  # None: not known from the file
    assert declared_tests(tmp_path / "sub" / "none") is None


def test_a_case_count_the_files_do_not_say_counts_functions(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("import pytest\nCASES = [str(i) for i in range(6)]\n"
                                        "@pytest.mark.parametrize('c', CASES)\ndef test_case(c): pass\ndef test_one(): pass\n")
    declared = declared_tests(tmp_path)
    assert declared == DeclaredTests(frozenset({"test_case", "test_one"}), 2, frozenset({"test_case"}))
    forged = tuple(TestResult(f"test_a.py::test_case[{i}]", TestStatus.PASSED) for i in range(100_000))
    report = build_report(VerifierKind.PYTEST, "", {"ctrf.json": _ctrf(forged)}, exit_code=0, timed_out=False,
                          declared=declared)
    assert report.failure_mode is FailureMode.NONE and (report.passed, report.total) == (1, 1)
    one_failed = (*forged[:5], TestResult("test_a.py::test_case[5]", TestStatus.FAILED, "boom"))
    report = build_report(VerifierKind.PYTEST, "", {"ctrf.json": _ctrf(one_failed)}, exit_code=1, timed_out=False,
                          declared=declared)
    assert (report.passed, report.total, report.tests[0].message) == (0, 1, "boom")
    (tmp_path / "conftest.py").write_text("import pytest\n@pytest.fixture(params=range(3))\ndef n(request): return request.param\n")
    assert declared_tests(tmp_path) == DeclaredTests(frozenset({"test_case", "test_one"}), 2,
                                                     frozenset({"test_case", "test_one"}))
    repeated = tuple(TestResult("test_a.py::test_one", TestStatus.PASSED) for _ in range(2))
    assert "more than once" in check_report(repeated, declared)


def _ctrf(tests: tuple[TestResult, ...]) -> str:
    return json.dumps({"results": {"tests": [{"name": t.name, "status": str(t.status), "message": t.message} for t in tests]}})


def test_reports_beyond_the_declared_tests_are_tampered() -> None:
    declared = DeclaredTests(frozenset({"test_a", "TestK::test_b"}), 2)
    honest = (TestResult("../tests/test_outputs.py::test_a", TestStatus.PASSED),
              TestResult("tests.test_outputs.TestK::test_b", TestStatus.FAILED))
    assert check_report(honest, declared) == ""
    renamed = (TestResult("test_outputs.py::test_forged", TestStatus.PASSED),)
    assert "do not declare" in check_report(renamed, declared)
    collection = TestResult("../tests/test_outputs.py", TestStatus.ERROR, "ModuleNotFoundError: No module named 'x'")
    assert check_report((collection,), declared) == ""  # a module pytest could not collect passes nothing
    assert "do not declare" in check_report((*renamed, collection), declared)
    assert "do not declare" in check_report((TestResult("forged.py", TestStatus.PASSED),), declared)
    repeated = tuple(TestResult(f"test_outputs.py::test_a[{i}]", TestStatus.PASSED) for i in range(3))
    assert "declare 2" in check_report(repeated, declared)
    output = "=== short test summary info ===\n" + "".join(f"PASSED t.py::test_a[{i}]\n" for i in range(50)) + \
        "=== 50 passed in 0.1s ===\n"
    report = build_report(VerifierKind.PYTEST, output, {}, exit_code=0, timed_out=False, declared=declared)
    assert report.failure_mode is FailureMode.VERIFIER_TAMPERED and report.passed == 50
    for mode in RewardMode:
        assert episode_reward(report, mode) == 0.0


HARBOR_RUNNERS = {
    "python_m_pytest": "python3 -m pytest /tests/test_outputs.py -rA",
    "uvx_pytest": "uvx -p 3.13 -w pytest==8.4.1 pytest /tests/test_outputs.py -rA",
}
"""How Harbor test.sh files start pytest, from the task's workdir (where the agent may plant a pytest)."""
WORKDIR_PLANTS = ATTACKS["shadow_pytest_in_the_workdir"] + ATTACKS["read_and_plant_tests"]


HARBOR_BASE = "python:3.13-slim-bookworm"


@pytest.fixture
def harbor_base() -> str:
    """The base image of the Harbor attack tasks (the docker suite gives its own engine's)."""
    return HARBOR_BASE


def _harbor_task(root: Path, runner: str, solution: str, base: str = HARBOR_BASE) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\n")
    (root / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n[environment]\nallow_internet = false\n')
    (root / "instruction.md").write_text("Write 42 into /app/answer.txt.\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_outputs.py").write_text(TESTS)
    (root / "tests" / "test.sh").write_text(f"#!/bin/bash\ncd /app\n{runner}\n"
                                            "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; "
                                            "else echo 0 > /logs/verifier/reward.txt; fi\n")
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solution)
    return root


@pytest.mark.parametrize("runner", sorted(HARBOR_RUNNERS))
async def test_harbor_tests_ignore_a_pytest_planted_in_the_workdir(provider: LocalProvider, tmp_path: Path,
                                                                   runner: str) -> None:
    """A Harbor test.sh that runs pytest from /app: the agent's /app/pytest.py, _pytest/, pluggy.py and
    conftest.py change nothing; the attempt scores as an honest failure of the same task."""
    runs = {}
    for name, solution in (("honest", "true\n"), ("planted", WORKDIR_PLANTS)):
        task = load_task(_harbor_task(tmp_path / name, HARBOR_RUNNERS[runner], solution))
        runs[name] = await run_task(provider, task, RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)
    honest, planted = runs["honest"], runs["planted"]
    assert honest.status is RunStatus.OK and honest.report.passed == 1 and not honest.resolved, honest.as_json()
    assert (planted.reward, planted.report.passed, planted.report.total, planted.resolved) == \
        (honest.reward, honest.report.passed, honest.report.total, False), planted.as_json()


ROOT_LINKS = (f"printf '%s\\n' {_q(_PASS_ALL_PLUGIN)} > /app/conftest.py; printf '[pytest]\\naddopts = -p no:terminal\\n' > /app/pytest.ini; "
              "ln -sf /app/conftest.py /conftest.py; ln -sf /app/pytest.ini /pytest.ini\n")
HARBOR_PLANTS = {
    "pytest_in_the_workdir": WORKDIR_PLANTS,
    "plugin_dist_info_in_the_workdir": _plant_plugin("/app", "t1forge-0.dist-info"),
    "plugin_egg_info_in_the_workdir": _plant_plugin("/app", "t1forge.egg-info"),
    "links_at_the_root": ROOT_LINKS,
    # the same class by another file: a tox.ini linked at the root that loads the agent's plugin module
    "tox_ini_link_at_the_root": _plant_plugin("/app", "t1forge-0.dist-info")
    + "printf '[pytest]\\naddopts = -p t1forge_plugin\\n' > /app/tox.ini; ln -sf /app/tox.ini /tox.ini\n",
}
"""What the agent plants in its workdir and at the root for a Harbor test.sh that runs pytest from /app."""


@pytest.mark.parametrize("plant", sorted(HARBOR_PLANTS))
@pytest.mark.parametrize("runner", sorted(HARBOR_RUNNERS))
async def test_harbor_pytest_loads_nothing_the_agent_planted(provider: SandboxProvider, tmp_path: Path, runner: str,
                                                             plant: str, harbor_base: str) -> None:
    """Plugins registered by a distribution in /app, links at / to the agent's conftest or ini: an honest failure."""
    honest = await run_task(provider, load_task(_harbor_task(tmp_path / "honest", HARBOR_RUNNERS[runner], "true\n",
                                                             harbor_base)),
                            RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)
    planted = await run_task(provider, load_task(_harbor_task(tmp_path / "planted", HARBOR_RUNNERS[runner],
                                                              HARBOR_PLANTS[plant], harbor_base)),
                             RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)
    assert honest.status is RunStatus.OK and honest.report.passed == 1 and not honest.resolved, honest.as_json()
    assert (planted.reward, planted.report.passed, planted.report.total, planted.resolved) == \
        (honest.reward, honest.report.passed, honest.report.total, False), (planted.as_json(), planted.report.output_tail)


ENV_DOCKERFILE = ('ENV PATH="/root/.local/bin:$PATH" PYTHONPATH=/app\n'
                  "ENV BASH_ENV=/app/.bash_env LD_LIBRARY_PATH=/app/lib\nWORKDIR /app\nRUN cp /etc/hostname /root/.copied\n")
"""A task environment pointing into the agent's places, as real Dockerfiles do (the last line: other variables)."""
TB_TEST_SH = ("#!/bin/bash\ncd /app\nuv venv .tbench-testing\nsource .tbench-testing/bin/activate\n{runner}\n"
              "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
"""Terminal-Bench's test.sh: a venv made in the workdir, activated, then pytest."""
_FORGER_FUNCTIONS = "".join(f"{tool}() {{ {_FORGED_ECHO.strip()}; return 0; }}; export -f {tool}\n"
                            for tool in ("uvx", "python3", "pytest", "uv"))
ENV_PLANTS = {
    "programs_first_on_the_task_path": "mkdir -p /root/.local/bin\n" + "".join(
        _replace(f"/root/.local/bin/{tool}", _forger_sh()) for tool in ("python3", "pytest", "uvx", "uv")),
    "startup_code_on_the_task_pythonpath": f"printf '%s\\n' {_q(_FORGER_PY)} > /app/sitecustomize.py; "
                                           "cp /app/sitecustomize.py /app/usercustomize.py\n",
    "a_venv_left_in_the_workdir": "mkdir -p /app/.tbench-testing/bin\n"
                                  f"printf '%s' {_q(_FORGER_FUNCTIONS)} > /app/.tbench-testing/bin/activate\n",
    # the same class by other variables: a shell start-up file, and the shell itself first on the task's PATH
    "shell_startup_named_by_the_task_env": f"printf '%s' {_q(_FORGER_FUNCTIONS)} > /app/.bash_env\n",
    "bash_first_on_the_task_path": "mkdir -p /root/.local/bin\n" + _replace(
        "/root/.local/bin/bash", "#!/usr/bin/bash\n" + _FORGED_ECHO + "echo 1 > /logs/verifier/reward.txt\nexit 0\n"),
}


def _env_task(root: Path, runner: str, solution: str, base: str) -> Path:
    _harbor_task(root, runner, solution)
    (root / "environment" / "Dockerfile").write_text(f"FROM {base}\n{ENV_DOCKERFILE}")
    (root / "tests" / "test.sh").write_text(TB_TEST_SH.format(runner=runner))
    return root


@pytest.mark.parametrize("plant", sorted(ENV_PLANTS))
@pytest.mark.parametrize("runner", sorted(HARBOR_RUNNERS))
async def test_task_environment_into_agent_dirs_runs_nothing_planted(provider: SandboxProvider, tmp_path: Path,
                                                                    runner: str, plant: str, harbor_base: str) -> None:
    """`ENV PATH="/root/.local/bin:$PATH"`, `PYTHONPATH=/app`, `BASH_ENV`, Terminal-Bench's venv in /app: the
    verifier runs none of what the agent put there, and still finds its stand-ins (uv, uvx) on that PATH."""
    honest = await run_task(provider, load_task(_env_task(tmp_path / "honest", HARBOR_RUNNERS[runner], "true\n", harbor_base)),
                            RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)
    assert honest.status is RunStatus.OK and honest.report.passed == 1 and not honest.resolved, \
        (honest.as_json(), honest.report.output_tail)
    planted = await run_task(provider, load_task(_env_task(tmp_path / "planted", HARBOR_RUNNERS[runner],
                                                           ENV_PLANTS[plant], harbor_base)),
                             RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)
    assert (planted.reward, planted.report.passed, planted.report.total, planted.resolved) == \
        (honest.reward, honest.report.passed, honest.report.total, False), (planted.as_json(), planted.report.output_tail)


GIT_TESTS = TESTS + '''
def test_repository_status():
    import subprocess
    assert subprocess.run(["git", "status", "--short"], cwd="/app").returncode == 0
'''
_FORGED_NAMES = [f"test_outputs.py::{n}" for n in ("test_app_exists", "test_answer_exists", "test_answer_value",
                                                   "test_answer_single_line", "test_answer_mode", "test_repository_status")]
_GIT_FORGER = ("#!/bin/sh\nfor f in ctrf.json ctrf-report.json; do printf '%s' '" + '{"results":{"tests":[' + ",".join(
    f'{{"name":"{n}","status":"passed"}}' for n in _FORGED_NAMES) + "]}}' > /logs/verifier/$f; done\n"
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
    honest = await _oracle_with(provider, tmp_path / "honest", GIT_TESTS, "git init -q /app\n")
    assert (honest.reward, honest.report.passed, honest.report.total) == (2.0, 2, 6), honest.as_json()
    plant_script = (f"cd /app && git init -q && printf '%s' {_q(_GIT_FORGER)} > /app/.forge && chmod 755 /app/.forge && "
                    + GIT_PLANTS[plant])
    planted = await _oracle_with(provider, tmp_path / "planted", GIT_TESTS, plant_script)
    assert (planted.reward, planted.report.passed, planted.report.total, planted.resolved) == (2.0, 2, 6, False), \
        (planted.as_json(), planted.report.output_tail)


async def _oracle_with(provider: SandboxProvider, root: Path, tests: str, solution: str) -> TaskRun:
    task = _task(root, solution)
    (task / "tests" / "test_outputs.py").write_text(tests)
    spec = load_task(task)
    spec = replace(spec, environment=replace(spec.environment, allow_internet=False))
    return await run_task(provider, spec, RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)


COUNT_TESTS = """import pytest
CASES = [str(i) for i in range(6)]

def test_app_exists():
    assert __import__("os").path.isdir("/app")

@pytest.mark.parametrize("case", CASES)
def test_case(case):
    import solution
    assert solution.double(case) == 2 * int(case)
"""
COUNT_FORGER = ("import atexit, json\n\ndef double(case):\n    return 0\n\n"
                "def _forge():\n    tests = [{'name': f'test_outputs.py::test_case[{i}]', 'status': 'passed'} for i in range(100000)]\n"
                "    json.dump({'results': {'tests': tests}}, open('/logs/verifier/ctrf.json', 'w'))\n\natexit.register(_forge)\n")


@pytest.mark.parametrize("solution", ["honest", "forged"])
async def test_a_forged_count_is_bounded_by_the_test_files(provider: SandboxProvider, tmp_path: Path, solution: str,
                                                            harbor_base: str) -> None:
    """Cases from a list built at run time: a report of 100,000 passed cases (written by the agent's module, which the
    tests import) scores no more than the task's functions; the real solution scores the same."""
    root = _harbor_task(tmp_path / solution, "python3 -m pytest /tests/test_outputs.py -rA --ctrf /logs/verifier/ctrf.json",
                        "true\n", harbor_base)
    (root / "tests" / "test_outputs.py").write_text(COUNT_TESTS)
    code = "def double(case):\n    return 2 * int(case)\n" if solution == "honest" else COUNT_FORGER
    (root / "solution" / "solve.sh").write_text(f"#!/bin/bash\nprintf '%s' {_q(code)} > /app/solution.py\n")
    run = await run_task(provider, load_task(root), RunMode.ORACLE, local=_replays(provider), reward_mode=RewardMode.COUNT)
    assert run.status is RunStatus.OK, (run.as_json(), run.report.output_tail)
    expected = (2.0, 2) if solution == "honest" else (1.0, 1)  # the forger's doubles are wrong: 1 as an honest failure
    assert (run.reward, run.report.passed) == expected, (run.as_json(), run.report.output_tail)


async def test_filling_the_sandbox_is_the_attempts_failure(provider: LocalProvider, tmp_path: Path) -> None:
    """Inodes filled with empty files (the tmpfs has a bound): the verifier runs on storage of its own, and the
    attempt scores as an honest failure (it was `infra_error crash:SFTPFailure`, out of every statistic)."""
    if not provider.cfg.overlay:
        pytest.skip("the read-only root's tree dirs are on the host's disk")
    fill = ("python3 -c 'import os\nos.makedirs(\"/tmp/f\", exist_ok=True)\ni = 0\nwhile True:\n"
            "    try:\n        open(f\"/tmp/f/{i}\", \"w\").close()\n    except OSError:\n        break\n    i += 1\n'\n")
    run = await _oracle(provider, tmp_path / "fill", fill)
    assert run.status is not RunStatus.INFRA_ERROR and not run.resolved, run.as_json()
    assert (run.reward, run.report.passed, run.report.total) == HONEST, (run.why, run.detail, run.report.output_tail[-800:])


async def test_one_tasks_crash_does_not_end_a_batch(tmp_path: Path) -> None:
    class Broken(LocalProvider):
        async def create(self, request: SandboxRequest) -> Sandbox:
            raise RuntimeError("a provider bug")
    specs = [load_task(_task(tmp_path / name, "true\n")) for name in ("a", "b")]
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
    "forge_at_import": ("printf '%s\\n' " + _q("import os, sys; sys.stdout.write(" + repr(
        "=== short test summary info ===\nPASSED ../tests/test_outputs.py::test_value\n"
        "PASSED ../tests/test_outputs.py::test_type\n=== 2 passed in 0.01s ===\n") + "); sys.stdout.flush(); os._exit(0)")
                        + " > /app/answer.py\n", ""),
    "interrupt_collection": ("echo 'raise KeyboardInterrupt' > /app/answer.py\n", ""),
    "wrong_answer": ("echo 'VALUE = \"42\"' > /app/answer.py\n", "assert '42' == 42"),
}


async def _module_task_run(provider: SandboxProvider, root: Path, attack: str) -> TaskRun:
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
    run = await _module_task_run(provider, tmp_path / attack, script)
    assert run.status in (RunStatus.OK, RunStatus.VERIFIER_ERROR) and not run.resolved, run.as_json()
    assert (run.reward, run.report.passed) == (0.0, 0), run.as_json()
    assert run.report.failure_mode not in (FailureMode.VERIFIER_TAMPERED, FailureMode.INFRA_ERROR), run.as_json()
    if cause:  # a collection error or a failed test: the honest failure of the task, the cause named
        assert run.status is RunStatus.OK and run.report.failure_mode is FailureMode.NONE, run.as_json()
        assert cause in run.why, run.why
    solved = await _module_task_run(provider, tmp_path / f"{attack}-solved", "echo 'VALUE = 42' > /app/answer.py\n")
    assert solved.resolved and solved.reward == 2.0, solved.as_json()
