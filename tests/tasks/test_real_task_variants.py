"""Issue 39's failures, each reproduced on a vendored real task (tests/fixtures/real_tasks) changed in one place.

A test copies a real task folder and edits the one line that other real tasks have and the corpus does
not (a FROM of a language image, a `useradd -u 1000`, the uv installer followed by `cp ~/.local/bin/uv`,
a large sparse file, an `npm ci`): the rest of the task, its verifier and its oracle are the real ones.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from t1.config.sandbox import LocalProviderConfig, ShellConfig
from t1.sandbox.local.local_provider import LocalProvider
from t1.sandbox.needs import NeedKind
from t1.tasks.formats.dataset import load_task
from t1.tasks.image.base_images import SYSTEM_PATH, lookup, missing_toolchain
from t1.tasks.needs.validate import CheckStatus, check_folder
from t1.tasks.verify.oracle import RunMode, RunStatus, run_task

REAL = Path(__file__).parents[1] / "fixtures" / "real_tasks"


def variant(name: str, dest: Path, file: str, edit: Callable[[str], str]) -> Path:
    """A copy of the vendored real task `name` with `file` (relative to the task) rewritten by `edit`."""
    root = dest / name.replace("/", "__")
    shutil.copytree(REAL / name, root)
    path = root / file
    path.write_text(edit(path.read_text()))
    return root


def _from(image: str) -> Callable[[str], str]:
    return lambda text: "\n".join(f"FROM {image}" if line.startswith("FROM ") else line for line in text.splitlines())


@pytest.fixture
async def overlay(sandbox_root: Path) -> AsyncIterator[LocalProvider]:
    prov = LocalProvider(LocalProviderConfig(root=sandbox_root, overlay=True), ShellConfig(command_timeout_s=120.0))
    yield prov
    await prov.close()


@pytest.mark.parametrize("image", ["golang:1.22", "r-base:4.4.1", "mcr.microsoft.com/dotnet/sdk:8.0",
                                   "alpine:3.20", "python:3.12-alpine", "registry.example/team/toolbox:3"])
async def test_an_image_the_host_cannot_stand_in_for_is_needs_image_naming_it(
        tmp_path: Path, overlay: LocalProvider, image: str) -> None:
    """evoeval-0 FROM a language image whose toolchain this host lacks, Alpine (apk, musl) or an image outside
    T1's table: validate and the run both say needs_image at the FROM line, naming the image (before: validate
    said ok, and the run scored 0 or failed at setup with `go: not found` / `apk: not found`)."""
    entry = lookup(image)
    if entry is not None and entry.toolchain and not missing_toolchain(entry):
        pytest.skip(f"this host has {entry.toolchain} on {SYSTEM_PATH}: it stands in for {image}")
    root = variant("tb1/evoeval-0", tmp_path, "Dockerfile", _from(image))
    check = check_folder(root)
    assert check.status is CheckStatus.WILL_NOT_RUN, check
    need = check.needs[0]
    assert need.kind is NeedKind.IMAGE and need.what.startswith(f"Dockerfile line 2: FROM {image}: "), need
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.NEEDS_IMAGE and oracle.detail == need.what, oracle.as_json()


def test_a_language_image_whose_toolchain_the_host_has_is_stood_in_for(tmp_path: Path) -> None:
    """The host stands in for a language image only when T1 finds its toolchain on the system PATH."""
    present = [e for e in ("node:20", "eclipse-temurin:21-jdk", "gcc:13", "golang:1.22")
               if (entry := lookup(e)) is not None and not missing_toolchain(entry)]
    if not present:
        pytest.skip("this host has none of node, java/javac, gcc/g++, go")
    for image in present:
        check = check_folder(variant("tb1/evoeval-0", tmp_path / image.replace(":", "_"), "Dockerfile", _from(image)))
        assert check.status is CheckStatus.OK, (image, check)


async def test_useradd_of_uid_1000_gets_that_uid_as_in_its_container(tmp_path: Path, overlay: LocalProvider) -> None:
    """simple-task whose Dockerfile adds its user with uid 1000 (a common line): the sandbox's root has its
    image's accounts, not the host's, so useradd succeeds and the oracle resolves (before: `UID 1000 is not
    unique`, the host's own user being in the copy-on-write root's /etc/passwd)."""
    root = variant("harbor/simple-task", tmp_path, "environment/Dockerfile",
                   lambda text: text + "\nRUN useradd -m -u 1000 -s /bin/bash appuser && id -u appuser\n")
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.setup_output)


async def test_env_path_that_extends_path_keeps_the_images_path(tmp_path: Path, overlay: LocalProvider) -> None:
    """simple-task whose Dockerfile puts a tool folder first on PATH the way real tasks do
    (`ENV PATH="/opt/tools/bin:${PATH}"`) and then runs plain commands: `${PATH}` expands to the base image's
    PATH, so the next RUN finds cp and useradd, and the oracle resolves (before: the stand-in for the base
    image had no PATH, `${PATH}` expanded to nothing and setup failed with `cp: not found`)."""
    lines = ('ENV PATH="/opt/tools/bin:${PATH}"\n'
             "RUN cp /etc/hostname /tmp/hostname.copy && useradd -m toolsuser && id -u toolsuser")
    root = variant("harbor/simple-task", tmp_path, "environment/Dockerfile", lambda text: f"{text}\n{lines}\n")
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.setup_output)


async def test_a_task_path_without_the_toolchain_still_finds_the_verifiers_stand_ins(
        tmp_path: Path, overlay: LocalProvider) -> None:
    """simple-task whose image sets its own PATH of system folders only: its test.sh runs the uv installer and
    `uvx ... pytest`, and T1's offline stand-ins are still found, so the oracle resolves and the untouched
    sandbox does not (before: `uvx: command not found`, reported as reward 0 with an empty output tail)."""
    line = 'ENV PATH="/opt/venv/bin:/usr/local/bin:/usr/bin:/bin"'
    root = variant("harbor/simple-task", tmp_path, "environment/Dockerfile", lambda text: f"{text}\n{line}\n")
    task = load_task(root)
    oracle = await run_task(overlay, task, RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.setup_output)
    untouched = await run_task(overlay, task, RunMode.VERIFY)
    assert untouched.status is RunStatus.OK and not untouched.resolved, untouched.as_json()


async def test_uv_installer_leaves_uv_and_uvx_where_the_real_one_does(tmp_path: Path, overlay: LocalProvider) -> None:
    """simple-task installing uv as many TB2 Dockerfiles do, then copying the binaries the installer leaves in
    ~/.local/bin: setup succeeds, the copies run (they find T1's offline uv), and the oracle resolves."""
    line = ("RUN curl -LsSf https://astral.sh/uv/install.sh | sh && cp /root/.local/bin/uv /root/.local/bin/uvx "
            "/usr/local/bin/ && uv --version && uvx --version")
    root = variant("harbor/simple-task", tmp_path, "environment/Dockerfile", lambda text: f"{text}\n{line}\n")
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.setup_output)


async def test_a_large_sparse_file_is_honest_work(tmp_path: Path, overlay: LocalProvider) -> None:
    """simple-task whose solution also makes a 2 GiB sparse disk image (as tests of file systems and databases
    do): no per-file size cap fails it (before: `File too large` under the default max_file_mb of 1 GiB); the
    sandbox's storage, not a file's size, bounds what it writes."""
    root = variant("harbor/simple-task", tmp_path, "solution/solve.sh",
                   lambda text: text + "truncate -s 2G /app/disk.img && test $(stat -c %s /app/disk.img) = "
                                       "2147483648\n")
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, oracle.as_json()


@pytest.mark.parametrize(("line", "said"), [
    ("npm ci", "npm ci could not download its packages"),
    ("npm install --omit=dev", "npm install could not download its packages"),
    ("go mod download", "go mod download could not download its packages"),
    ("cargo fetch", "cargo fetch could not download its packages"),
    ("curl -fsSL -o /tmp/go.tgz https://go.dev/dl/go1.22.5.linux-amd64.tar.gz",
     "curl could not download https://go.dev/dl/go1.22.5.linux-amd64.tar.gz"),
    ("wget -q https://github.com/jqlang/jq/releases/download/jq-1.7.1/jq-linux-amd64",
     "wget could not download https://github.com/jqlang/jq/releases/download/jq-1.7.1/jq-linux-amd64"),
])
async def test_downloads_outside_apt_and_pip_are_needs_network_naming_the_line(
        tmp_path: Path, overlay: LocalProvider, line: str, said: str) -> None:
    """simple-task whose Dockerfile also downloads with a package manager or a plain curl/wget: validate predicts
    needs_network naming the line and what could not be downloaded, and the run says the same sentence (before:
    validate said ok, and the run was a setup_failed with the tool's own network error)."""
    root = variant("harbor/simple-task", tmp_path, "environment/Dockerfile",
                   lambda text: text.replace("WORKDIR /app", f"WORKDIR /app\nRUN {line}"))
    want = f"Dockerfile line 4: RUN {line}: {said} (the sandbox is offline)"
    check = check_folder(root)
    assert check.status is CheckStatus.WILL_NOT_RUN and [n.what for n in check.needs] == [want], check
    assert check.needs[0].kind is NeedKind.NETWORK
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.NEEDS_NETWORK and oracle.detail == want, (oracle.as_json(), oracle.setup_output)


def test_tb1_task_without_dockerfile_but_with_environment_files_is_malformed_by_name(tmp_path: Path) -> None:
    """Terminal-Bench 1's hello-world runs without a Dockerfile (it has only the harness's own files); the same
    folder with a file beside task.yaml that only a Dockerfile could put in place is malformed, naming the file
    and the missing Dockerfile (before: validate said ok and the run went ahead without the file)."""
    assert check_folder(REAL / "tb1" / "hello-world").status is CheckStatus.OK
    root = variant("tb1/hello-world", tmp_path, "task.yaml", lambda text: text)
    (root / "greeting_template.txt").write_text("Hello, {name}!\n")
    check = check_folder(root)
    assert check.status is CheckStatus.MALFORMED, check
    assert "Dockerfile: file is missing, and 1 file(s) beside task.yaml (greeting_template.txt)" in check.error


def test_an_entrypoint_that_is_the_container_itself_is_needs_image(tmp_path: Path) -> None:
    """dns-blacklisting's ENTRYPOINT is a plain script ending in `exec "$@"` (it runs, as the sandbox's first
    process); the same task whose script ends by running its own server instead is the container's program
    itself, which a local sandbox cannot be: needs_image naming the line and the script."""
    assert check_folder(REAL / "harbor" / "dns-blacklisting").status is CheckStatus.OK
    root = variant("harbor/dns-blacklisting", tmp_path, "environment/entrypoint.sh",
                   lambda text: text.replace('exec "$@"', "exec python3 /usr/local/bin/block-server.py"))
    check = check_folder(root)
    assert [str(n) for n in check.needs] == [
        "needs_image: Dockerfile line 15: ENTRYPOINT /entrypoint.sh: entrypoint.sh does not end by exec-ing the "
        "container's command (exec \"$@\"), so it is the container's first process itself; this task needs an image"]


async def test_tests_importing_a_package_the_host_lacks_is_needs_network_not_the_attempts_fault(
        tmp_path: Path, overlay: LocalProvider) -> None:
    """evoeval-0 whose test module also imports numpy, which this host's python3 lacks and nothing in the task
    installs: pytest cannot collect it whatever the attempt does, so validate and the run both say needs_network
    naming the module (before: the oracle was scored, its collection error reported as verifier_tampered)."""
    root = variant("tb1/evoeval-0", tmp_path, "tests/test_outputs.py", lambda text: "import numpy as np\n" + text)
    want = ("verifier: the tests import numpy, which this host does not have and the task does not install "
            "(the sandbox is offline)")
    probe = subprocess.run(
        ["python3", "-c", "import numpy"], env={"PATH": SYSTEM_PATH}, capture_output=True, check=False
    )
    if probe.returncode == 0:
        pytest.skip("this host's python3 has numpy")
    check = check_folder(root)
    assert [(n.kind, n.what) for n in check.needs] == [(NeedKind.NETWORK, want)], check
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.NEEDS_NETWORK and oracle.detail == want, oracle.as_json()


async def test_a_separate_verifier_environment_that_does_not_build_is_the_tasks_failure(
        tmp_path: Path, overlay: LocalProvider) -> None:
    """simple-task with a separate verifier built from tests/Dockerfile, one of whose lines fails: the oracle run
    is a setup_failed naming the verifier's environment and the line, not the reference solution's fault (before:
    agent_broke_verifier, the solution blamed for what the task's own verifier image does)."""
    root = variant("harbor/simple-task", tmp_path, "task.toml",
                   lambda text: text.replace("[verifier]", '[verifier]\nenvironment_mode = "separate"', 1))
    (root / "tests" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN ls /surely/absent/dir\n")
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.SETUP_FAILED, oracle.as_json()
    assert oracle.detail.startswith("the separate verifier's environment: Dockerfile line 2: RUN ls /surely/absent/dir")
    assert str(oracle.report.failure_mode) == "setup_failed"


async def test_a_separate_verifier_environment_may_copy_into_tests(tmp_path: Path, overlay: LocalProvider) -> None:
    """simple-task with a separate verifier built from tests/Dockerfile that COPYs the test module into /tests (as
    Harbor's own examples do) and a test.sh that runs that copy: the steps land as the verifier's own files and the
    oracle resolves (before: setup failed with `Permission denied`, /tests belonging to the verifier's uid)."""
    root = variant("harbor/simple-task", tmp_path, "task.toml",
                   lambda text: 'artifacts = ["/app/hello.txt"]\n' + text.replace(
                       "[verifier]", '[verifier]\nenvironment_mode = "separate"', 1))
    test_sh = root / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace("/tests/test_state.py", "/tests/copied/test_state.py"))
    (root / "tests" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY test_state.py /tests/copied/\nADD test.sh /tests/copied/test.sh\n")
    oracle = await run_task(overlay, load_task(root), RunMode.ORACLE)
    assert oracle.status is RunStatus.OK and oracle.resolved, (oracle.as_json(), oracle.setup_output)
    assert "copied/test_state.py::test_hello_file_contents" in oracle.report.output_tail, oracle.report.output_tail


@pytest.mark.parametrize("mode", [RunMode.ORACLE, RunMode.VERIFY])
async def test_a_test_module_that_cannot_be_collected_is_the_tasks_error(
        tmp_path: Path, overlay: LocalProvider, mode: RunMode) -> None:
    """evoeval-0 whose test module has a Python 2 print statement: pytest cannot collect it on an untouched sandbox
    or after the reference solution, whatever an attempt does. validate calls the task malformed, and the oracle and
    untouched runs are its setup failure naming the file, line and cause, before anything runs (before: each run was
    scored 0 as the attempt's failure, `1 of 1 tests failed: tests/test_outputs.py`)."""
    root = variant("tb1/evoeval-0", tmp_path, "tests/test_outputs.py",
                   lambda text: text.replace("import json\n", 'import json\nprint "collecting"\n', 1))
    want = ("verifier: tests/test_outputs.py line 2: SyntaxError: Missing parentheses in call to 'print'. Did you mean "
            "print(...)?: the task's test file does not compile under the sandbox's python3, so pytest cannot collect "
            "it whatever the attempt does")
    check = check_folder(root)
    assert check.status is CheckStatus.MALFORMED and check.error == want, check
    run = await run_task(overlay, load_task(root), mode)
    assert run.status is RunStatus.SETUP_FAILED and run.detail == want and want in run.why, run.as_json()
