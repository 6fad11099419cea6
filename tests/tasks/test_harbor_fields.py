"""Every Harbor task.toml field honoured or refused by name; the separate verifier environment, run for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.needs import NeedKind
from t1.tasks.formats.dataset import load_task
from t1.tasks.needs.predict import static_needs
from t1.tasks.spec import TaskParseError
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task

TEST_SH = "echo 1 > /logs/verifier/reward.txt\n"


def _task(root: Path, toml: str, test_sh: str = TEST_SH, solve: str | None = None) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "task.toml").write_text(toml)
    (root / "instruction.md").write_text("Do the thing.\n")
    (root / "tests" / "test.sh").write_text(test_sh)
    if solve is not None:
        (root / "solution").mkdir()
        (root / "solution" / "solve.sh").write_text(solve)
    return root


def test_fields_read_with_harbor_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T1_TEST_TOKEN", "s3cret")
    monkeypatch.delenv("T1_SURELY_UNSET", raising=False)
    spec = load_task(_task(tmp_path / "t", """schema_version = "1.2"
source = "example"
artifacts = ["/app/out", { source = "/app/logs", exclude = ["*.tmp"] }]
surprise = 1
[environment]
workdir = "/srv"
storage = "2G"
memory_mb = 512
env = { TOKEN = "${T1_TEST_TOKEN}", MODE = "${T1_SURELY_UNSET:-fast}" }
skills_dir = "/skills"
[environment.healthcheck]
command = "true"
start_interval_sec = 0.5
[agent]
user = 1000
timeout_sec = 30
[verifier]
user = "tester"
env = { MISSING = "${T1_SURELY_UNSET}" }
color = "blue"
[solution]
env = { S = "1" }
"""))
    env = spec.environment
    assert env.workdir == "/srv" and env.storage_mb == 2048 and env.memory_mb == 512 and env.skills_dir == "/skills"
    assert dict(env.env) == {"TOKEN": "s3cret", "MODE": "fast"}
    assert (
        env.healthcheck is not None
        and env.healthcheck.interval_sec == 5.0
        and env.healthcheck.start_interval_sec == 0.5
    )
    assert spec.agent_user == "1000" and spec.verifier.user == "tester" and spec.agent_timeout_sec == 30
    assert spec.metadata.source == "example" and spec.solution is None
    assert spec.ignored_fields == ("surprise", "verifier.color")
    assert env.refused == ("verifier.env.MISSING: ${T1_SURELY_UNSET} is not set on this host and has no default",)
    assert [n.kind for n in static_needs(spec)] == [NeedKind.FEATURE]


@pytest.mark.parametrize(("extra", "named"), [
    ("gpus = 1\n", "environment.gpus = 1: T1's sandboxes have no GPUs"),
    ("os = 'windows'\n", "environment.os = 'windows'"),
    ("tpu = { type = 'v5e', count = 1 }\n", "environment.tpu: T1's sandboxes have no TPUs"),
    ("[[environment.mcp_servers]]\nname = 'tools'\ntransport = 'stdio'\ncommand = 'x'\n",
     "environment.mcp_servers (tools): T1's agents have no MCP client"),
    ("network_mode = 'allowlist'\nallowed_hosts = ['example.org']\n", "network_mode = 'allowlist' (example.org)"),
])
async def test_features_refused_by_name(provider: LocalProvider, tmp_path: Path, extra: str, named: str) -> None:
    spec = load_task(_task(tmp_path / "t", f"[environment]\n{extra}"))
    predicted = static_needs(spec)
    assert len(predicted) == 1 and named in predicted[0].what, predicted
    run = await run_task(provider, spec, RunMode.ORACLE)
    assert run.status is RunStatus.NEEDS_FEATURE and run.detail == predicted[0].what


def test_bad_field_combinations_are_parse_errors(tmp_path: Path) -> None:
    for i, (toml, why) in enumerate((
        ("[verifier]\nenvironment_mode = 'shared'\n[verifier.environment]\ndocker_image = 'x'\n", "cannot have"),
        ("[verifier]\nenvironment_mode = 'elsewhere'\n", "expected 'shared' or 'separate'"),
        ("[verifier]\nenvironment_mode = 'separate'\nnetwork_mode = 'public'\n", "takes its network"),
        ("[verifier.environment]\ncpus = 1\n", "needs tests/Dockerfile or a docker_image"),
        ("[environment]\nallow_internet = false\nnetwork_mode = 'public'\n", "conflicts with allow_internet"),
    )):
        with pytest.raises(TaskParseError, match=why):
            load_task(_task(tmp_path / str(i), toml))


SEPARATE_TOML = """artifacts = ["/app/result.txt"]
[environment]
allow_internet = false
[verifier]
environment_mode = "separate"
timeout_sec = 30
[[verifier.collect]]
command = "echo collected > /logs/artifacts/collected.txt"
"""
SEPARATE_TEST = """ok=1
[ "$(cat /app/result.txt 2>/dev/null)" = 42 ] || { ok=0; echo "no artifact /app/result.txt"; }
[ -e /app/private.txt ] && { ok=0; echo "saw /app/private.txt"; }  # not an artifact: a fresh sandbox has none
[ "$(cat /logs/artifacts/collected.txt 2>/dev/null)" = collected ] || { ok=0; echo "collect did not run"; }
[ -e /tmp/setup-ran ] || { ok=0; echo "tests/setup.sh did not run"; }
echo $ok > /logs/verifier/reward.txt
"""


async def test_separate_verifier_gets_only_artifacts(provider: LocalProvider, tmp_path: Path) -> None:
    root = _task(tmp_path / "sep", SEPARATE_TOML, SEPARATE_TEST,
                 solve="mkdir -p /app && echo 42 > /app/result.txt && echo keep-out > /app/private.txt\n")
    (root / "tests" / "setup.sh").write_text("touch /tmp/setup-ran\n")
    spec = load_task(root)
    assert spec.verifier.separate is not None and spec.verifier.separate.environment.dockerfile is None
    oracle = await run_task(provider, spec, RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.report.output_tail)
    noop = await run_task(provider, spec, RunMode.VERIFY)
    assert noop.status is RunStatus.OK and not noop.resolved
