"""The values around an episode: its spec, how it ended, its result, where its sandbox comes from, and which
failures are infrastructure's (never a reward)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from t1.agent.episode_limits import EpisodeLimits
from t1.agent.formats import AgentFormat
from t1.errors import InfraError
from t1.inference.types import SamplingParams
from t1.sandbox.types import Sandbox, SandboxLost, SandboxProvider, SandboxRequest
from t1.tasks.spec import TaskSpec
from t1.tasks.verify.outcome import T1Fault
from t1.tasks.verify.report import VerifierReport
from t1.tasks.verify.rewards import RewardMode
from t1.trajectory.types import EpisodeStatus, Trajectory


class InferenceFailed(T1Fault):
    """Generation failed on every try: the episode ends as infra_error."""


SandboxAcquire = Callable[[SandboxRequest], AbstractAsyncContextManager[Sandbox]]
# Failures of the machinery around the policy (t1.errors.InfraError: sandbox, setup, needs, inference): never a reward.
INFRA_ERRORS = (InfraError, OSError, TimeoutError)


def acquire_from(provider: SandboxProvider) -> SandboxAcquire:
    """A sandbox per episode straight from a provider (the SandboxPool's `acquire` adds limits and retries)."""

    @contextlib.asynccontextmanager
    async def acquire(request: SandboxRequest) -> AsyncIterator[Sandbox]:
        sandbox = await provider.create(request)
        try:
            yield sandbox
        finally:
            with contextlib.suppress(SandboxLost, OSError):
                await provider.destroy(sandbox)

    return acquire


@dataclass(frozen=True, slots=True)
class EpisodeSpec:
    """Everything that identifies one attempt."""

    episode_id: str
    task: TaskSpec
    group_id: str
    attempt: int
    fmt: AgentFormat
    sampling: SamplingParams
    limits: EpisodeLimits
    reward_mode: RewardMode = RewardMode.COUNT


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    trajectory: Trajectory
    report: VerifierReport
    turns: int
    duration_s: float
    failure_mode: str = ""
    transcript: str = ""
    drift_tokens: int = 0          # loss-region ids that differ from the sampler's own record (must be 0)
    retokenize_changed: int = 0    # sampled ids a decode-then-re-tokenize pipeline would change
    retokenize_total: int = 0
    text_level: bool = False       # the policy answered with text (a chat endpoint): no exact tokens
    drift_segments: int = 0        # segments with drift_tokens (must be 0)

    @property
    def status(self) -> EpisodeStatus:
        return self.trajectory.status

    @property
    def num_segments(self) -> int:
        return len(self.trajectory.segments)


@dataclass(frozen=True, slots=True)
class EpisodeEnd:
    """How an episode ended, before its trajectory is exported."""

    status: EpisodeStatus
    why: str
    report: VerifierReport
    duration_s: float


class _End(Exception):
    def __init__(self, status: EpisodeStatus, why: str) -> None:
        super().__init__(why)
        self.status, self.why = status, why
