"""The vendored real tasks (tests/fixtures/real_tasks): each runs as expected.toml says, and validate predicted it.

A task whose needs this host meets: its own oracle resolves and an untouched sandbox does not. Every
other task: a needs_* report naming what is missing, the very sentence `t1 tasks validate` predicts.
Tasks marked writes_root need a writable system root (the copy-on-write root of local sandboxes);
on a sandbox whose root is read-only they must fail at setup naming the Dockerfile line instead.
"""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.types import SandboxRequest
from t1.tasks.formats.dataset import load_task
from t1.tasks.needs.validate import CheckStatus, check_task
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task

REAL = Path(__file__).parents[1] / "fixtures" / "real_tasks"
EXPECTED: dict[str, dict[str, object]] = tomllib.loads((REAL / "expected.toml").read_text())


def test_every_vendored_task_has_an_expectation_and_attribution() -> None:
    folders = sorted(f"{p.parent.name}/{p.name}" for p in REAL.glob("*/*") if p.is_dir())
    assert folders == sorted(EXPECTED)
    attribution = (REAL / "ATTRIBUTION").read_text()
    assert all(f"\n{name} " in attribution for name in folders)
    assert "Apache License" in (REAL / "LICENSE").read_text()
    assert "MIT License" in (REAL / "LICENSE-mmtb").read_text()
    assert len(folders) >= 50


@pytest.fixture
async def provider(sandbox_root: Path) -> AsyncIterator[LocalProvider]:
    """The copy-on-write root set explicitly (real tasks write anywhere, as in their containers), not by default."""
    prov = LocalProvider(LocalProviderConfig(root=sandbox_root, overlay=True), ShellConfig(command_timeout_s=120.0))
    yield prov
    await prov.close()


async def _root_is_writable(provider: LocalProvider) -> bool:
    sandbox = await provider.create(SandboxRequest())
    try:
        shell = await sandbox.open_shell()
        probe = f"/.t1-root-probe-{uuid.uuid4().hex}"
        out = await shell.run(f"mkdir {probe} 2>/dev/null && rmdir {probe} && echo writable", 30)
        await shell.close()
        return out.output.strip() == "writable"
    finally:
        await provider.destroy(sandbox)


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if EXPECTED[name].get("slow") else [])
                                  for name in sorted(EXPECTED)])
async def test_real_task(provider: LocalProvider, name: str) -> None:
    want = EXPECTED[name]
    spec = load_task(REAL / name)
    check = check_task(spec, name)
    oracle = await run_task(provider, spec, RunMode.ORACLE)
    if want["outcome"] != "runs":
        assert check.status is CheckStatus.WILL_NOT_RUN and str(want["names"]) in check.needs[0].what, check
        assert oracle.status == want["outcome"] and oracle.detail == check.needs[0].what, oracle.as_json()
        return
    assert check.status is CheckStatus.OK, check
    if want.get("writes_root") and not await _root_is_writable(provider):
        assert oracle.status is RunStatus.SETUP_FAILED, oracle.as_json()
        assert oracle.detail.startswith(str(want["root_line"])) and "Read-only file system" in oracle.detail
        return
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.report.output_tail[-2000:])
    untouched = await run_task(provider, spec, RunMode.VERIFY)
    assert untouched.status is RunStatus.OK and not untouched.resolved, untouched.as_json()
    assert untouched.reward < oracle.reward


async def test_untouched_real_tasks_say_why(provider: LocalProvider) -> None:
    """pytest -rA (Terminal-Bench 1) and CTRF (Harbor, uvx --ctrf) reports both name the failing test and its
    assertion's first line, in the TaskRun and its JSON."""
    tb1 = await run_task(provider, load_task(REAL / "tb1" / "hello-world"), RunMode.VERIFY)
    names = {t.name.rsplit("::", 1)[-1]: t.message for t in tb1.report.failed_tests}
    assert set(names) == {"test_hello_file_exists", "test_hello_file_content"}
    assert names["test_hello_file_exists"].startswith("AssertionError: File /app/hello.txt does not exist")
    assert tb1.why.startswith("2 of 2 tests failed: ") and "/app/hello.txt does not exist" in tb1.why
    harbor = await run_task(provider, load_task(REAL / "harbor" / "simple-task"), RunMode.VERIFY)
    body = harbor.as_json()
    assert body["why"] == harbor.why and harbor.why.startswith("2 of 2 tests failed")
    failed = body["failed_tests"]
    assert isinstance(failed, list) and all(t["message"] for t in failed), body
    assert "test_state.py" in str(body["verifier_output_tail"])


def test_cli_table_says_why(sandbox_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from t1.cli.main import main

    root = ["--set", f"sandbox.local.root={sandbox_root}", "--set", "sandbox.local.overlay=true"]
    assert main(["tasks", "verify", str(REAL / "tb1" / "hello-world"), *root]) == 0
    assert "why:" not in capsys.readouterr().out  # verify: an unresolved untouched task is the good outcome
    assert main(["tasks", "oracle", str(REAL / "harbor" / "mcp-tools"), *root]) == 1
    assert "why: needs_feature: environment.mcp_servers (mcp-server)" in capsys.readouterr().out
