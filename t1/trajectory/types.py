"""Trajectory, segment and turn records (docs/design.md: Data that crosses boundaries)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np


class EpisodeStatus(StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"
    CONTEXT_LIMIT = "context_limit"
    INFRA_ERROR = "infra_error"


@dataclass(frozen=True, slots=True)
class TurnSpan:
    """Positions [start, end) of one turn's sampled tokens in its segment, and the turn's reward."""

    start: int
    end: int
    reward: float = 0.0


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    """One exact-token sequence (TITO holds within it). Arrays are aligned by position."""

    token_ids: np.ndarray        # int32 [N]
    logprobs: np.ndarray         # float32 [N], NaN where the token was not sampled
    loss_mask: np.ndarray        # bool [N], True only on sampled tokens
    policy_versions: np.ndarray  # int32 [N], -1 where not sampled
    routing: np.ndarray | None   # uint8/uint16 [N, layers, top_k], sentinel rows where missing
    turns: tuple[TurnSpan, ...] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True, slots=True)
class VerifierSummary:
    """What the verifiers said at the end of the episode."""

    passed: int = 0
    total: int = 0
    tests: tuple[tuple[str, str], ...] = ()  # (test name, status)


@dataclass(frozen=True, slots=True)
class TitoCounters:
    repaired_turns: int = 0
    masked_tokens: int = 0
    template_mismatches: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class Trajectory:
    """One episode: segments sharing one episode reward, the verifier report, status and timings."""

    id: str
    task_id: str
    group_id: str
    attempt: int
    segments: tuple[Segment, ...]
    reward: float
    status: EpisodeStatus
    verifier: VerifierSummary = field(default_factory=VerifierSummary)
    timings: tuple[tuple[str, float], ...] = ()
    tito: TitoCounters = field(default_factory=TitoCounters)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)
