"""An episode's verifier runs: the final one per step, every K-th turn's (process rewards), and the baseline.

Each run opens a verifier shell in the episode's sandbox (out of the agent's reach where the
provider can do that, t1/sandbox/types.ShellRole) or, for a Harbor task with a separate verifier
environment, packs the declared artifacts and runs the tests in a sandbox of their own.
"""

from __future__ import annotations

import contextlib
import time

from t1.agent.baseline import SharedBaselines
from t1.agent.episode_types import EpisodeSpec, SandboxAcquire
from t1.agent.transcript import Transcript
from t1.metrics import registry as m
from t1.sandbox.types import Sandbox, SandboxLost, SandboxTraits, ShellRole
from t1.tasks.provision import Provisioned
from t1.tasks.spec import StepSpec
from t1.tasks.verify.report import VerifierReport
from t1.tasks.verify.separate import packed_artifacts, run_separate_verifier
from t1.tasks.verify.verifier import run_verifier


class EpisodeVerifier:
    """Runs the verifiers of one episode's task and writes each report to its transcript."""

    def __init__(self, spec: EpisodeSpec, acquire: SandboxAcquire, sandboxes: SandboxTraits,
                 baselines: SharedBaselines | None, tx: Transcript) -> None:
        self._spec, self._acquire, self._sandboxes, self._baselines, self._tx = spec, acquire, sandboxes, baselines, tx

    async def baseline(self, sandbox: Sandbox, phase: StepSpec, provisioned: Provisioned) -> int:
        """Passing verifiers before the first turn: this sandbox's, or the group's when another attempt has it."""
        ran = False

        async def measure() -> int:
            nonlocal ran
            ran = True
            return (await self.verify(sandbox, phase, provisioned, "baseline")).passed

        if self._baselines is None:
            return await measure()
        passed = await self._baselines.get(f"{self._spec.task.id}\0{self._spec.group_id}", measure)
        if not ran:
            self._tx.note(f"verifier baseline: {passed} passed (measured by another attempt of the group)")
        return passed

    async def verify(self, sandbox: Sandbox, phase: StepSpec, provisioned: Provisioned, label: str) -> VerifierReport:
        task = self._spec.task
        t = time.monotonic()
        offline = self._sandboxes.offline or not task.environment.allow_internet
        vshell = await sandbox.open_shell(role=ShellRole.VERIFIER)
        try:
            if phase.verifier.separate is not None:  # Harbor: the tests see only the declared artifacts
                async with packed_artifacts(vshell, phase.verifier.separate, provisioned) as artifacts:
                    report = await run_separate_verifier(self._acquire, task, phase.verifier, artifacts,
                                                         traits=self._sandboxes, offline=offline)
            else:
                report = await run_verifier(vshell, phase.verifier, provisioned, offline=offline)
        finally:
            with contextlib.suppress(SandboxLost, OSError):
                await vshell.close()
        m.TURN_LATENCY.labels(part="verifier").observe(time.monotonic() - t)
        self._tx.verifier(label, report.passed, report.total, report.why)
        return report
