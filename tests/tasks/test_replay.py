"""Dockerfile replay with container semantics in a real local sandbox, and the offline installers at setup."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from t1.sandbox.local.local_provider import LocalProvider
from t1.tasks.formats.dataset import load_task
from t1.tasks.image.base_images import image_env
from t1.tasks.needs.predict import package_needs, static_needs
from t1.tasks.provision import provision, sandbox_request
from t1.tasks.transfer import SetupError
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task


def _task(root: Path, dockerfile: str, files: dict[str, str] | None = None,
          test_sh: str = "echo 1 > /logs/verifier/reward.txt\n") -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "environment").mkdir()
    (root / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n[environment]\nallow_internet = false\n")
    (root / "instruction.md").write_text("Nothing to do.\n")
    (root / "tests" / "test.sh").write_text(test_sh)
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        path = root / "environment" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _archive(path: Path) -> None:
    with tarfile.open(path, "w:gz") as tar:
        data = b"from the archive\n"
        info = tarfile.TarInfo("pkg/inside.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


async def test_replay_honours_arg_env_workdir_user_shell_heredoc(provider: LocalProvider, tmp_path: Path) -> None:
    root = _task(tmp_path / "t", (
        "ARG BASE=ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nFROM ${BASE}\n"
        "ARG WHO=world\nENV GREETING=\"hello ${WHO}\" OUT=/app/out\n"
        "COPY data.txt ./\n"  # the t-bench base image's WORKDIR is /app
        "ADD bundle.tgz /app/unpacked/\n"
        "RUN <<EOF\nset -e\nmkdir -p $OUT\necho \"$GREETING from $WHO\" > $OUT/greeting\nEOF\n"
        "SHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]\n"
        "RUN [[ -n \"$BASH_VERSION\" ]] && echo bash > /app/out/shell\n"
        "RUN python3 - <<PY\nopen('/app/out/py', 'w').write(str(1 << 3) + chr(10))\nPY\n"
        "USER root\nRUN id -un > /tmp/who\n"), {"data.txt": "payload\n"})
    _archive(root / "environment" / "bundle.tgz")
    spec = load_task(root)
    assert static_needs(spec) == [] and package_needs(spec) == []
    sandbox = await provider.create(sandbox_request(spec))
    try:
        shell = await sandbox.open_shell()
        prov = await provision(shell, spec, provider.traits)
        assert prov.workdir == "/app" and prov.user == "root"
        # the image's environment (T1's table), then ENV; ARG is gone
        assert dict(prov.env) == {**dict(image_env("ghcr.io/laude-institute/t-bench/ubuntu-24-04")),
                                  "GREETING": "hello world", "OUT": "/app/out"}
        out = await shell.run("cat /app/data.txt /app/out/greeting /app/out/shell /app/out/py /tmp/who "
                              "/app/unpacked/pkg/inside.txt")
        assert out.output.split("\n")[:6] == ["payload", "hello world from world", "bash", "8", "root",
                                              "from the archive"], out.output
        await shell.close()
    finally:
        await provider.destroy(sandbox)


async def test_setup_installers_offline(provider: LocalProvider, tmp_path: Path) -> None:
    present = _task(tmp_path / "present", "FROM ubuntu:24.04\nWORKDIR /app\n"
                    "RUN apt-get update && apt-get install -y --no-install-recommends curl bash \\\n"
                    "    && pip3 install --break-system-packages pyyaml && echo ok > /app/ran\n",
                    test_sh="[ -f /app/ran ] && echo 1 > /logs/verifier/reward.txt || echo 0 > "
                            "/logs/verifier/reward.txt\n")
    spec = load_task(present)
    assert package_needs(spec) == []
    run = await run_task(provider, spec, RunMode.VERIFY)
    assert run.status is RunStatus.PASSES_WITHOUT_WORK, run.as_json()  # the whole RUN line got through offline

    missing = _task(tmp_path / "missing", "FROM ubuntu:24.04\nRUN apt-get update\n"
                    "RUN apt-get install -y coq-surely-absent curl\n")
    spec = load_task(missing)
    predicted = package_needs(spec)
    assert [str(n) for n in predicted] == [
        "needs_network: Dockerfile line 3: RUN apt-get install -y coq-surely-absent curl: apt packages not on this "
        "host: coq-surely-absent (the sandbox is offline)"]
    run = await run_task(provider, spec, RunMode.ORACLE)
    assert run.status is RunStatus.NEEDS_NETWORK, run.as_json()
    assert run.detail == predicted[0].what  # validate predicted the run's own sentence

    pip = _task(tmp_path / "pip", "FROM python:3.13\nRUN pip install --no-cache-dir surely-absent-dist==1.0\n")
    run = await run_task(provider, load_task(pip), RunMode.VERIFY)
    assert run.status is RunStatus.NEEDS_NETWORK and "pip packages not on this host: surely-absent-dist" in run.detail

    broken = _task(tmp_path / "broken", "FROM ubuntu:24.04\nRUN echo starting\nRUN ls /surely/absent/dir\n")
    run = await run_task(provider, load_task(broken), RunMode.VERIFY)
    assert run.status is RunStatus.SETUP_FAILED, run.as_json()
    assert run.detail.startswith("Dockerfile line 3: RUN ls /surely/absent/dir: exit code 2: ")
    assert "No such file or directory" in run.detail and "\n" not in run.detail


async def test_user_switches_or_names_the_line(provider: LocalProvider, tmp_path: Path) -> None:
    """USER applies to later RUN lines; a sandbox that cannot switch users says so, naming the line."""
    spec = load_task(_task(tmp_path / "u", "FROM ubuntu:24.04\nUSER nobody\nRUN id -un > /tmp/who\n"))
    sandbox = await provider.create(sandbox_request(spec))
    try:
        shell = await sandbox.open_shell()
        can_switch = (await shell.run("runuser -u nobody -- true && echo yes", 30)).output.strip() == "yes"
        if can_switch:
            prov = await provision(shell, spec, provider.traits)
            assert prov.user == "nobody" and (await shell.run("cat /tmp/who")).output.strip() == "nobody"
        else:
            try:
                await provision(shell, spec, provider.traits)
                raise AssertionError("provision ran RUN as nobody in a sandbox that cannot switch users")
            except SetupError as exc:
                assert str(exc).startswith("Dockerfile line 3: RUN id -un > /tmp/who: exit code 1: "), exc
        await shell.close()
    finally:
        await provider.destroy(sandbox)


async def test_test_and_solution_installers_predicted_and_reported(provider: LocalProvider, tmp_path: Path) -> None:
    """Installer lines in tests/test.sh and in the solution: validate names the package, the run says needs_network."""
    root = _task(tmp_path / "t", "FROM ubuntu:24.04\nWORKDIR /app\n",
                 test_sh="uv add polars-surely-absent==1.37.1\nuv run pytest /tests -rA\n")
    spec = load_task(root)
    predicted = package_needs(spec)
    assert [str(n) for n in predicted] == [
        "needs_network: verifier: pip packages not on this host: polars-surely-absent (the sandbox is offline)"]
    run = await run_task(provider, spec, RunMode.VERIFY)
    assert run.status is RunStatus.NEEDS_NETWORK, run.as_json()
    assert run.detail == predicted[0].what
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("set -e\npip install absent-solver-dep\necho done\n")
    run = await run_task(provider, load_task(root), RunMode.ORACLE)
    assert run.status is RunStatus.NEEDS_NETWORK and run.detail.startswith(
        "solution: pip packages not on this host: absent-solver-dep"), run.as_json()


async def test_pytest_stand_in_survives_a_test_script_that_sets_pythonpath(provider: LocalProvider,
                                                                            tmp_path: Path) -> None:
    """DevEval's run-tests.sh does `export PYTHONPATH=$(pwd)` before `pytest` and `uv run pytest`: the pytest T1
    ships (when the sandbox's python3 has none) must still be found, and the tests' verdict must still count."""
    root = _task(tmp_path / "pp", "FROM ubuntu:24.04\nWORKDIR /app\n",
                 test_sh="cd /app && export PYTHONPATH=$(pwd)\nuv add pytest\n"
                         "pytest /tests/test_outputs.py -rA && uv run pytest /tests/test_outputs.py -rA "
                         "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
    (root / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\n\ndef test_done():\n    assert Path('/app/done').read_text() == 'yes\\n'\n")
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("echo yes > /app/done\n")
    spec = load_task(root)
    oracle = await run_task(provider, spec, RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.report.output_tail[-1500:])
    assert "No module named pytest" not in oracle.report.output_tail
    untouched = await run_task(provider, spec, RunMode.VERIFY)
    assert untouched.status is RunStatus.OK and not untouched.resolved, untouched.as_json()
