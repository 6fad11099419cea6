"""Run a task's verifiers in its sandbox after the agent finishes, and read what they found.

`shell` is a verifier shell (`ShellRole.VERIFIER`): on the local provider it runs as a uid of
its own, so /tests, /logs/verifier and the toolchain are out of the agent's reach while the
agent's processes (a server its tests use) keep running. Tests are uploaded to /tests only now,
/logs/verifier is emptied, the verifier command runs with the task's timeout, env and user, its
output goes to a file in the sandbox (so a timeout still leaves output to parse), and the report
is read from CTRF JSON, JUnit XML or pytest -rA output, plus /logs/verifier/reward.txt or
reward.json. Offline sandboxes get the verifier toolchain first (see t1.tasks.toolchain), with
T1's own pytest first on the path; T1-run pytest has its rootdir, ini file and conftest search
pinned to /tests, so files the agent planted (/pytest.ini, /conftest.py) are not read. The
results are then checked against the tests the task's files declare, counted on the host
(`t1.tasks.verify.declared`): a report that cannot come from them is VERIFIER_TAMPERED. Whatever the
verifier does, the result is a VerifierReport with a FailureMode; only a lost sandbox (or a
verifier setup the sandbox refuses) raises.

Process rewards run the same verifiers mid-episode (`cleanup=True`) in a verifier shell of
their own; /tests and /logs/verifier are emptied afterwards.
"""

from __future__ import annotations

import re
import shlex
import time
import uuid

from t1.sandbox.types import Shell
from t1.sandbox.verifier.verifier_env import trusted_env
from t1.tasks.image.dockerfile_replay import exports, place_tests_files
from t1.tasks.provision import Provisioned, as_user
from t1.tasks.spec import VerifierKind, VerifierSpec
from t1.tasks.toolchain import (
    PYTEST_MAIN,
    SHIM_LOG,
    SHIMS,
    TOOLCHAIN_DIR,
    toolchain_archive,
    toolchain_prefix,
)
from t1.tasks.transfer import check, read_if_exists, upload_archive, upload_dir_contents
from t1.tasks.verify.declared import (
    DeclaredTests,
    by_function,
    check_report,
    collection_error,
    declared_tests,
)
from t1.tasks.verify.report import (
    FailureMode,
    RewardFileError,
    VerifierReport,
    parse_ctrf,
    parse_junit,
    parse_pytest_output,
    parse_reward_json,
    parse_reward_txt,
)

TESTS_DIR = "/tests"
LOGS_DIR = "/logs/verifier"
OUTPUT_FILE = f"{LOGS_DIR}/.t1-verifier-output.txt"
CTRF_FILES = ("ctrf.json", "ctrf-report.json")
JUNIT_FILES = ("junit.xml", "results.xml", "report.xml")
_OUTPUT_TAIL = 4000
# /tests, /logs/verifier and the toolchain may be mount points (local sandboxes): empty, never remove
_EMPTY = f"find {TESTS_DIR} {LOGS_DIR} -mindepth 1 -delete"
# pytest run by T1 reads no ini file, conftest or rootdir above /tests (the agent may have written /pytest.ini)
_PINNED = f"--rootdir={TESTS_DIR} --confcutdir={TESTS_DIR} -p no:cacheprovider"

_COMMANDS = {
    VerifierKind.TEST_SH: f"bash {TESTS_DIR}/test.sh",
    VerifierKind.RUN_TESTS_SH: f"bash {TESTS_DIR}/run-tests.sh",
    VerifierKind.PYTEST: f"{PYTEST_MAIN} {TESTS_DIR}/test_outputs.py -rA {_PINNED}",
}


async def install_toolchain(shell: Shell) -> None:
    """Put the offline verifier toolchain into the sandbox, T1's pytest included (a sandbox's own may be the
    agent's)."""
    await check(shell, f"mkdir -p {TOOLCHAIN_DIR} && find {TOOLCHAIN_DIR} -mindepth 1 -delete",
                "clear verifier toolchain")
    await upload_archive(shell, toolchain_archive(with_pytest=True), TOOLCHAIN_DIR, "verifier toolchain")


_TOOL_WORDS = re.compile(r"(?<![\w-])(?:python3?|" + "|".join(map(re.escape, SHIMS)) + r")(?![\w-])")


def uses_toolchain(spec: VerifierSpec) -> bool:
    """Whether the verifier may call what the offline toolchain provides (python, pytest, pip, uv, ...).

    A bash tests/test.sh in a folder with no Python file that names none of those tools gets no toolchain:
    its upload (about 2 MB) is most of a cheap verifier's cost."""
    if spec.kind is not VerifierKind.TEST_SH or spec.run_tests_sh is not None:
        return True
    for folder in (*spec.extra_tests_dirs, spec.tests_dir):
        for path in folder.rglob("*"):
            if not path.is_file():
                continue
            if path.suffix == ".py":
                return True
            if _TOOL_WORDS.search(path.read_text(encoding="utf-8", errors="replace")):
                return True
    return False


async def _upload_tests(shell: Shell, spec: VerifierSpec, provisioned: Provisioned) -> None:
    # A root verifier (VMs) opens /logs/verifier to a task's verifier user; a verifier uid keeps it its own.
    await check(shell, f"mkdir -p {TESTS_DIR} {LOGS_DIR} && {_EMPTY} && "
                f"{{ [ \"$(id -u)\" != 0 ] || chmod 777 {LOGS_DIR}; }}", "prepare /tests and /logs/verifier")
    if provisioned.tests_files and provisioned.build_context is not None:  # the Dockerfile's COPY into /tests
        await place_tests_files(shell, provisioned.tests_files, provisioned.build_context, spec.timeout_sec)
    for shared in spec.extra_tests_dirs:  # Harbor: the top-level tests/ under a step's own
        await upload_dir_contents(shell, shared, TESTS_DIR)
    await upload_dir_contents(shell, spec.tests_dir, TESTS_DIR)
    if spec.run_tests_sh is not None:
        await shell.write_file(f"{TESTS_DIR}/run-tests.sh", spec.run_tests_sh.read_bytes(), 0o755)


async def _read_text(shell: Shell, path: str) -> str | None:
    data = await read_if_exists(shell, path)
    return None if data is None else data.decode("utf-8", errors="replace")


async def run_verifier(
    shell: Shell,
    spec: VerifierSpec,
    provisioned: Provisioned,
    *,
    offline: bool = True,
    cleanup: bool = False,
) -> VerifierReport:
    """Run the verifiers once and report; see the module docstring."""
    start = time.monotonic()
    await _upload_tests(shell, spec, provisioned)
    toolchain = offline and uses_toolchain(spec)
    if toolchain or spec.kind is VerifierKind.PYTEST:  # T1's pytest runs T1's own verifier online too
        await install_toolchain(shell)
    # The task's environment as a verifier may use it (no loader variable into the agent's dirs), then the toolchain
    env = exports(tuple(trusted_env({**dict(provisioned.env), **dict(spec.env)}).items()))
    inner = (f"{env}{toolchain_prefix() if toolchain else ''}cd {shlex.quote(provisioned.workdir)}; "
             f"{_COMMANDS[spec.kind]}")
    # The verifier shell stands in for a container's root (on local sandboxes it is a uid of its own that
    # may write the agent's files): a task asking for root gets it; another user is switched to.
    user = None if spec.user == "root" else spec.user
    own_report = f"{LOGS_DIR}/.t1-pytest-{uuid.uuid4().hex}.json"
    if spec.kind is VerifierKind.PYTEST:  # T1's own verifier: the result is what T1's own plugin reports
        inner += f" --ctrf {own_report}"
    command = f"( {as_user(inner, user)} ) > {OUTPUT_FILE} 2>&1 < /dev/null"
    result = await shell.run(command, timeout_s=spec.timeout_sec)
    output = await _read_text(shell, OUTPUT_FILE) or ""
    if spec.kind is VerifierKind.PYTEST:
        files = {CTRF_FILES[0]: await _read_text(shell, own_report)}
    else:
        files = {name: await _read_text(shell, f"{LOGS_DIR}/{name}")
                 for name in ("reward.txt", "reward.json", *CTRF_FILES, *JUNIT_FILES)}
    shims = await _read_text(shell, SHIM_LOG) if toolchain else None
    if cleanup:
        await shell.run(_EMPTY, 60)
    declared = declared_tests(spec.tests_dir)
    report = build_report(spec.kind, output, files, exit_code=result.exit_code, timed_out=result.timed_out,
                          declared=declared)
    return VerifierReport(
        tests=report.tests, reward_values=report.reward_values, duration_s=time.monotonic() - start,
        timed_out=report.timed_out, exit_code=report.exit_code, failure_mode=report.failure_mode,
        detail=report.detail, output_tail=output[-_OUTPUT_TAIL:],
        shims_used=tuple(dict.fromkeys(line.split()[0] for line in (shims or "").splitlines() if line.strip())),
    )


def build_report(
    kind: VerifierKind, output: str, files: dict[str, str | None], *, exit_code: int | None, timed_out: bool,
    declared: DeclaredTests | None = None,
) -> VerifierReport:
    """Classify one verifier run from its output and the files it left, against the declared tests (pure)."""
    tests = None
    for name in CTRF_FILES:
        if tests is None and files.get(name) is not None:
            tests = parse_ctrf(files[name] or "")
    for name in JUNIT_FILES:
        if tests is None and files.get(name) is not None:
            tests = parse_junit(files[name] or "")
    if tests is None:
        tests = parse_pytest_output(output)
    elif not tests:  # a structured report of no tests: the modules pytest could not collect, from its output
        tests = tuple(t for t in parse_pytest_output(output) or () if collection_error(t)) or tests
    rewards: tuple[tuple[str, float], ...] = ()
    reward_error = ""
    try:
        if files.get("reward.json") is not None:
            rewards = parse_reward_json(files["reward.json"] or "")
        elif files.get("reward.txt") is not None:
            rewards = parse_reward_txt(files["reward.txt"] or "")
    except RewardFileError as exc:
        reward_error = str(exc)
    mode, detail = FailureMode.NONE, ""
    tampered = check_report(tests, declared) if tests and declared is not None else ""
    if tests and declared is not None and not tampered:
        tests = by_function(tests, declared)  # a function whose cases the files do not say counts once
    if tampered:
        mode, detail = FailureMode.VERIFIER_TAMPERED, tampered
    elif timed_out:
        mode, detail = FailureMode.VERIFIER_TIMEOUT, "the verifier ran past its timeout and was killed"
    elif reward_error:
        mode, detail = FailureMode.REWARD_FILE_INVALID, reward_error
    elif kind is VerifierKind.TEST_SH and not rewards:
        if exit_code not in (0, None) and not tests:
            mode, detail = FailureMode.VERIFIER_CRASHED, f"tests/test.sh exited {exit_code} without writing a reward"
        else:
            mode, detail = FailureMode.REWARD_FILE_MISSING, (f"tests/test.sh wrote neither {LOGS_DIR}/reward.txt nor "
                                                             "reward.json")
    elif kind is not VerifierKind.TEST_SH and tests is None:
        if exit_code == 0:
            mode, detail = FailureMode.UNPARSABLE_OUTPUT, "the verifier output has no pytest -rA summary"
        else:
            mode, detail = FailureMode.VERIFIER_CRASHED, f"the verifier exited {exit_code} with no pytest -rA summary"
    elif kind is not VerifierKind.TEST_SH and not tests:
        mode, detail = FailureMode.NO_TESTS, "pytest collected no tests"
    return VerifierReport(tests=tests or (), reward_values=rewards, timed_out=timed_out, exit_code=exit_code,
                          failure_mode=mode, detail=detail)
