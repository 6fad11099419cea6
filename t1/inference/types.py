"""The seam of the inference plane: a generate request, its result, and the GenerateFn protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np

from t1.routing.block import RoutingBlock


class FinishReason(StrEnum):
    STOP = "stop"        # an EOS or stop token was sampled (it is included in token_ids)
    LENGTH = "length"    # max_tokens or the context limit was reached
    ABORT = "abort"      # cancelled


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    max_tokens: int = 256


@dataclass(frozen=True, slots=True, eq=False)
class GenerateRequest:
    """prompt_ids is the session's full exact context (int32); the server reuses its cached prefix."""

    session_id: str
    prompt_ids: np.ndarray
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_routing: bool = True


@dataclass(frozen=True, slots=True, eq=False)
class GenerateResult:
    """Sampled ids and logprobs (aligned), versions per token, and routing for newly processed positions."""

    token_ids: np.ndarray          # int32 [n]
    logprobs: np.ndarray           # float32 [n]
    finish_reason: FinishReason
    policy_version: int
    token_versions: np.ndarray     # int32 [n], the version that sampled each token
    routing: RoutingBlock | None   # rows for positions routing.start .. prompt_len + n - 2
    prompt_tokens: int = 0
    cached_tokens: int = 0         # prompt tokens served from the session's cache (not prefilled)


class GenerateFn(Protocol):
    """Generate one turn; in-process or over gRPC, the caller does not care."""

    async def __call__(self, request: GenerateRequest) -> GenerateResult: ...
