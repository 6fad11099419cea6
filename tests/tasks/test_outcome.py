"""The rule that tells infra errors from the attempt's own failures (pure)."""

from __future__ import annotations

import asyncssh
import pytest

from t1.agent.episode import InferenceFailed
from t1.sandbox.ssh.remote import SandboxCreateError
from t1.sandbox.types import SandboxLost
from t1.tasks.image.dockerfile import NeedsImageError
from t1.tasks.transfer import SetupError
from t1.tasks.verify.outcome import attempt_failure
from t1.tasks.verify.report import ATTEMPT_FAILURES, FailureMode


@pytest.mark.parametrize(("exc", "mode"), [
    (SetupError("prepare /tests and /logs/verifier: exit code 1: Not a directory"), FailureMode.AGENT_BROKE_VERIFIER),
    (SandboxLost("SSH connection lost: closed"), FailureMode.SANDBOX_DIED),
    (SetupError("upload tests: tar: write error: No space left on device"), FailureMode.SANDBOX_AT_LIMIT),
    (SandboxLost("the remote shell exited while starting: bash: fork: retry: Resource temporarily unavailable"),
     FailureMode.SANDBOX_AT_LIMIT),
    (OSError("sftp write failed: Disk quota exceeded"), FailureMode.SANDBOX_AT_LIMIT),
    (TimeoutError(), FailureMode.SANDBOX_DIED),
    # a file transfer the agent's full or cluttered sandbox refused: never laundered into an infra error
    (asyncssh.SFTPFailure("Failure"), FailureMode.AGENT_BROKE_VERIFIER),
    (asyncssh.SFTPNoSpaceOnFilesystem("No space left on device"), FailureMode.SANDBOX_AT_LIMIT),
    (RuntimeError("tar: /tmp/.t1-pack.tgz: Cannot open: Is a directory"), FailureMode.AGENT_BROKE_VERIFIER),
])
def test_sandbox_faults_after_the_agent_acted_are_its_own(exc: BaseException, mode: FailureMode) -> None:
    assert attempt_failure(exc, agent_acted=True) is mode
    assert mode in ATTEMPT_FAILURES
    assert attempt_failure(exc, agent_acted=False) is None  # before the agent acted: the infrastructure's


@pytest.mark.parametrize("exc", [
    InferenceFailed("generate failed 3 times"), SandboxCreateError("no capacity"),
    NeedsImageError("needs an image"), KeyError("a bug in T1"),
])
def test_infrastructure_and_bugs_are_never_scored(exc: BaseException) -> None:
    assert attempt_failure(exc, agent_acted=True) is None
