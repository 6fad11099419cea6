"""Harbor's separate verifier environment: the tests run in a fresh sandbox, fed only the declared artifacts.

After the agent (or the oracle) is done, in the agent's sandbox: the
`[[verifier.collect]]` commands run, then /logs/artifacts and every declared
artifact are packed (their `exclude` patterns left out) and streamed to a host file (never
held in memory: a pack of any size costs T1 a constant). A new sandbox is made
from the verifier's environment (its own table with tests/ as build context, or
a fresh copy of the task's), the pack is unpacked there at the same absolute
paths, tests/setup.sh runs if the task has one, and then the verifier. The
agent's sandbox is never seen by the tests, so what the agent left elsewhere
cannot influence them. Building that sandbox depends on the task alone (the artifacts
arrive after it is built), so its failure is the task's or the host's, never the
attempt's: VerifierEnvironmentError, an infra error for episodes and a setup_failed
for `t1 tasks oracle|verify`, with the cause.
"""

from __future__ import annotations

import logging
import shlex
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from pathlib import Path

from t1.sandbox.types import Sandbox, SandboxProvider, SandboxRequest, SandboxTraits, Shell, ShellRole
from t1.tasks.provision import Provisioned, as_user, provision, sandbox_request
from t1.tasks.spec import SeparateVerifier, TaskSpec, VerifierSpec
from t1.tasks.transfer import SetupError, check, upload_archive_file, upload_dir_contents
from t1.tasks.verify.outcome import T1Fault
from t1.tasks.verify.report import VerifierReport
from t1.tasks.verify.verifier import TESTS_DIR, run_verifier

log = logging.getLogger(__name__)
ARTIFACTS_DIR = "/logs/artifacts"
TESTS_SETUP = "setup.sh"


@asynccontextmanager
async def packed_artifacts(shell: Shell, sep: SeparateVerifier, provisioned: Provisioned) -> AsyncIterator[Path]:
    """Run the collect commands, then pack /logs/artifacts and the declared artifacts (missing ones skipped) into a
    host file, removed on exit. The pack streams (`Shell.read_to`): T1 never holds it in memory, whatever its size."""
    await check(shell, f"mkdir -p {ARTIFACTS_DIR}", f"create {ARTIFACTS_DIR}")
    for c in sep.collect:
        result = await shell.run(f"( {as_user(provisioned.prefix() + c.command, c.user)} ) < /dev/null 2>&1",
                                 timeout_s=c.timeout_sec)
        if result.exit_code != 0 or result.timed_out:
            log.info("verifier collect %r failed (exit %s): %s", c.command, result.exit_code, result.output[-200:])
    pack = f"/tmp/.t1-artifacts-{uuid.uuid4().hex}.tgz"  # unpredictable: nothing the agent made can be in its way
    sources = [ARTIFACTS_DIR] + [a.source for a in sep.artifacts]
    rel = " ".join(shlex.quote(s.lstrip("/") or ".") for s in sources)
    excludes = " ".join(f"--exclude={shlex.quote(p)}" for a in sep.artifacts for p in a.exclude)
    await shell.run(f"cd / && list=''; for p in {rel}; do [ -e \"/$p\" ] && "
                    f"list=\"$list $p\"; done; tar -czf {pack} {excludes} $list 2>/dev/null; true", 300)
    with tempfile.TemporaryDirectory(prefix="t1-artifacts-") as host_dir:
        local = Path(host_dir) / "artifacts.tgz"
        try:
            await shell.read_to(pack, local)
        finally:
            await shell.run(f"rm -f {pack}", 30)
        yield local


class VerifierEnvironmentError(T1Fault):
    """The separate verifier's environment could not be built (not a SetupError: the attempt is not to blame)."""

    def __init__(self, message: str, output_tail: str = "") -> None:
        super().__init__(message)
        self.output_tail = output_tail


Acquire = Callable[[SandboxRequest], AbstractAsyncContextManager[Sandbox]]


def fresh_sandbox(provider: SandboxProvider) -> Acquire:
    """Sandboxes straight from a provider, destroyed on exit (the rollout worker passes its pool's instead)."""
    @asynccontextmanager
    async def acquire(request: SandboxRequest) -> AsyncIterator[Sandbox]:
        sandbox = await provider.create(request)
        try:
            yield sandbox
        finally:
            await provider.destroy(sandbox)
    return acquire


async def run_separate_verifier(
    acquire: Acquire, spec: TaskSpec, verifier: VerifierSpec, artifacts: Path, *, traits: SandboxTraits,
    offline: bool,
) -> VerifierReport:
    """Build the verifier's own sandbox, hand it the artifacts (the host's pack file, streamed), run
    tests/setup.sh and the verifier there."""
    if verifier.separate is None:
        raise ValueError(f"task {spec.id}: the verifier is not separate")
    env = verifier.separate.environment
    vspec = replace(spec, environment=env, agent_user=None, steps=(), verifier=replace(verifier, separate=None))
    async with acquire(sandbox_request(vspec)) as sandbox:
        shell = await sandbox.open_shell()
        try:
            try:
                provisioned = await provision(shell, vspec, traits)
            except SetupError as exc:
                raise VerifierEnvironmentError(f"the separate verifier's environment: {exc}", exc.output_tail) from exc
            await sandbox.end_setup()  # the artifacts are the agent's: data for the tests, never their system
            await upload_archive_file(shell, artifacts, "/", "verifier artifacts")
        finally:
            await shell.close()
        # /tests and /logs/verifier belong to the verifier's uid, here as in the agent's sandbox.
        vshell = await sandbox.open_shell(role=ShellRole.VERIFIER)
        try:
            setup = verifier.tests_dir / TESTS_SETUP
            if setup.is_file():
                await upload_dir_contents(vshell, verifier.tests_dir, TESTS_DIR)
                await check(vshell, f"( {provisioned.prefix()}bash {TESTS_DIR}/{TESTS_SETUP} ) < /dev/null 2>&1",
                            f"tests/{TESTS_SETUP} in the separate verifier", verifier.timeout_sec)
            return await run_verifier(vshell, replace(verifier, separate=None), provisioned, offline=offline)
        finally:
            await vshell.close()
