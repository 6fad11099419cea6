"""Tasks run for real in local sandboxes (bubblewrap behind the embedded SSH server): oracles, no-op, failures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import ShellRole
from t1.tasks.formats.dataset import load_dataset, load_task
from t1.tasks.provision import provision, sandbox_request
from t1.tasks.toolchain import toolchain_prefix
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task, run_tasks
from t1.tasks.verify.report import FailureMode
from t1.tasks.verify.rewards import RewardMode
from t1.tasks.verify.verifier import install_toolchain, run_verifier


async def test_fixture_oracles_full_and_noop_less(provider: LocalProvider, fixtures: Path) -> None:
    specs = load_dataset([fixtures])
    oracle = await run_tasks(provider, specs, RunMode.ORACLE, concurrency=2)
    noop = await run_tasks(provider, specs, RunMode.VERIFY, concurrency=2)
    for o, n in zip(oracle, noop, strict=True):
        assert o.status is RunStatus.OK and o.resolved, (o.task, o.as_json(), o.report.output_tail)
        assert o.reward == o.report.total > 0
        assert n.status is RunStatus.OK and not n.resolved and n.reward < o.reward, n.as_json()
    by_task = {o.task: o for o in oracle}
    # installer steps of benchmark test scripts ran offline through the shims, and the report says so
    assert {"curl", "uv", "apt-get"} <= set(by_task["tb1-run-tests"].report.shims_used)
    assert {"curl", "uvx"} <= set(by_task["harbor-csv-report"].report.shims_used)
    assert by_task["t1-fixtures__notes-multistep"].report.reward == 1.0
    assert len(by_task["t1-fixtures__notes-multistep"].report.steps) == 2
    gated = {n.task: n for n in noop}["t1-fixtures__notes-multistep"]
    assert gated.report.failure_mode is FailureMode.STEP_GATE and len(gated.report.steps) == 1


def _harbor_task(root: Path, test_sh: str, toml_extra: str = "", dockerfile: str | None = None) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "task.toml").write_text("[verifier]\ntimeout_sec = 3.0\n[environment]\nallow_internet = false\n"
                                    f"{toml_extra}")
    (root / "instruction.md").write_text("Nothing to do.\n")
    (root / "tests" / "test.sh").write_text(test_sh)
    (root / "tests" / "test_outputs.py").write_text("def test_ok():\n    assert True\n")
    if dockerfile is not None:
        (root / "environment").mkdir()
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    return root


PYTEST_LINE = "python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider\n"


@pytest.mark.parametrize(("test_sh", "mode"), [
    ("sleep 30\n", FailureMode.VERIFIER_TIMEOUT),
    ("echo 'about to crash' >&2\nexit 3\n", FailureMode.VERIFIER_CRASHED),
    (PYTEST_LINE, FailureMode.REWARD_FILE_MISSING),
    (PYTEST_LINE + "echo banana > /logs/verifier/reward.txt\n", FailureMode.REWARD_FILE_INVALID),
])
async def test_verifier_failures_become_reports(provider: LocalProvider, tmp_path: Path, test_sh: str,
                                                mode: FailureMode) -> None:
    spec = load_task(_harbor_task(tmp_path / "t", test_sh))
    run = await run_task(provider, spec, RunMode.VERIFY)
    assert run.status is RunStatus.VERIFIER_ERROR and run.report.failure_mode is mode, run.as_json()
    assert run.report.detail and not run.resolved
    if mode is FailureMode.VERIFIER_TIMEOUT:
        assert run.report.timed_out and run.report.duration_s < 30
    if mode is FailureMode.REWARD_FILE_MISSING:
        assert run.report.passed == 1  # the per-test results still count


async def test_garbage_pytest_output(provider: LocalProvider, fixtures: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(fixtures / "tb1-run-tests", tmp_path / "tb1"))
    (root / "run-tests.sh").write_text("echo 'PASSED? who knows'\necho '=== results: fine ==='\n")
    run = await run_task(provider, load_task(root), RunMode.ORACLE)
    assert run.report.failure_mode is FailureMode.UNPARSABLE_OUTPUT and run.status is RunStatus.VERIFIER_ERROR
    assert run.reward == 0.0


async def test_needs_image_and_healthcheck(provider: LocalProvider, tmp_path: Path) -> None:
    spec = load_task(_harbor_task(tmp_path / "img", PYTEST_LINE, dockerfile="FROM debian:12\nENTRYPOINT [\"/e\"]\n"))
    run = await run_task(provider, spec, RunMode.ORACLE)
    assert run.status is RunStatus.NEEDS_IMAGE and "line 2: ENTRYPOINT" in run.detail and "needs an image" in run.detail
    spec = load_task(_harbor_task(tmp_path / "img2", PYTEST_LINE, toml_extra='docker_image = "x/y:1"\n'))
    assert sandbox_request(spec).docker_image == "x/y:1"
    assert (await run_task(provider, spec, RunMode.VERIFY)).status is RunStatus.NEEDS_IMAGE
    spec = load_task(_harbor_task(tmp_path / "hc", PYTEST_LINE,
                                  toml_extra="[environment.healthcheck]\ncommand = 'test -f /app/ready'\n"
                                             "retries = 2\ninterval_sec = 0.1\n"))
    run = await run_task(provider, spec, RunMode.VERIFY)
    assert run.status is RunStatus.SETUP_FAILED and "healthcheck" in run.detail


async def test_dockerfile_replay_and_checkpoint_verifier(provider: LocalProvider, fixtures: Path) -> None:
    spec = load_task(fixtures / "harbor-csv-report")
    sandbox = await provider.create(sandbox_request(spec))
    try:
        shell = await sandbox.open_shell()
        provisioned = await provision(shell, spec, provider.traits)
        assert provisioned.workdir == "/app" and ("DATA_FILE", "/app/sales.csv") in provisioned.env
        listing = await shell.run("ls /app /app/out && cat /app/sales.csv | wc -l")
        assert "sales.csv" in listing.output and listing.output.split()[-1] == "6"
        vshell = await sandbox.open_shell(role=ShellRole.VERIFIER)
        before = await run_verifier(vshell, spec.verifier, provisioned, cleanup=True)
        leftover = await vshell.run("find /tests /logs/verifier -mindepth 1 | wc -l")
        assert leftover.output.strip() == "0"  # emptied after a checkpoint
        hidden = await shell.run("ls /tests /logs/verifier; cat /tests/test_outputs.py")
        assert hidden.exit_code != 0 and hidden.output.count("Permission denied") == 3  # the agent never sees them
        await shell.run("mkdir -p /app/out && printf 'region,total\\n' > /app/out/totals.csv")
        after = await run_verifier(vshell, spec.verifier, provisioned, cleanup=True)
        assert after.passed - before.passed == 2 and not after.resolved
        await install_toolchain(vshell)
        shims = await vshell.run(f"{toolchain_prefix()} pip install -q 'pytest>=8' && echo pip-ok; "
                                 "pip install surely-not-installed-pkg; echo pip=$?; "
                                 "apt-get install -y surely-not-installed-pkg; echo apt=$?; "
                                 "apt-get install -y bash coreutils && echo apt-ok")
        assert "pip-ok" in shims.output and "pip=1" in shims.output and "apt=100" in shims.output
        assert "pip packages not on this host: surely-not-installed-pkg" in shims.output
        assert "apt packages not on this host: surely-not-installed-pkg" in shims.output and "apt-ok" in shims.output
        await shell.close()
    finally:
        await provider.destroy(sandbox)
    assert RewardMode("count") is RewardMode.COUNT
