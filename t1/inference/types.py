"""The seam of the inference plane: a generate request, its result, and the GenerateFn protocol.

Backends (torch, vllm) stream a request as TokenChunk values followed by one GenerateDone; the
gRPC server forwards them as they come and `collect` folds them into a GenerateResult.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class SessionGenerateFn(Protocol):
    """A GenerateFn that keeps state per session (replica affinity, the context last sent) until the
    caller says the session ended (InferencePool)."""

    async def __call__(self, request: GenerateRequest) -> GenerateResult: ...

    def end_session(self, session_id: str) -> None: ...


@dataclass(frozen=True, slots=True, eq=False)
class ChatRequest:
    """One text-level turn: the conversation as messages (T1's form, see t1.inference.openai.openai_messages)."""

    session_id: str
    messages: tuple[dict[str, Any], ...]
    tools: list[dict[str, Any]] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True, slots=True)
class ChatReply:
    """The text of one chat completion (tool calls rendered as <tool_call> blocks) and its usage."""

    text: str
    finish_reason: FinishReason
    prompt_tokens: int = 0
    completion_tokens: int = 0


@runtime_checkable
class ChatGenerateFn(Protocol):
    """Generates from messages and returns text (a chat endpoint): no exact tokens, eval only."""

    @property
    def text_level(self) -> bool: ...

    async def chat(self, request: ChatRequest) -> ChatReply: ...


@dataclass(frozen=True, slots=True, eq=False)
class TokenChunk:
    """Some sampled ids, in order, with their logprobs and the weight version that sampled them."""

    token_ids: np.ndarray    # int32 [k]
    logprobs: np.ndarray     # float32 [k]
    policy_version: int


@dataclass(frozen=True, slots=True, eq=False)
class GenerateDone:
    """The end of one request's stream."""

    finish_reason: FinishReason
    policy_version: int
    routing: RoutingBlock | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What GetModelInfo reports."""

    model_name: str
    backend: str
    policy_version: int
    vocab_size: int
    max_context_tokens: int
    num_moe_layers: int
    num_experts: int
    top_k: int
    routing_dtype: str           # "uint8" | "uint16" | "" (dense)
    eos_token_ids: tuple[int, ...]
    logprob_distribution: str    # "sampling" (after temperature/top-k/top-p) or "raw"
    dtype: str


class Backend(Protocol):
    """A generation engine behind InferenceService."""

    def stream(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateDone]: ...

    def model_info(self) -> ModelInfo: ...

    async def update_weights(self, path: str, version: int) -> float: ...

    async def close(self) -> None: ...


async def collect(events: AsyncIterator[TokenChunk | GenerateDone]) -> GenerateResult:
    """Fold a backend stream into one GenerateResult (per-token versions from the chunks); closes the stream."""
    try:
        return await _fold(events)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def _fold(events: AsyncIterator[TokenChunk | GenerateDone]) -> GenerateResult:
    ids: list[np.ndarray] = []
    logps: list[np.ndarray] = []
    versions: list[np.ndarray] = []
    async for event in events:
        if isinstance(event, TokenChunk):
            ids.append(event.token_ids)
            logps.append(event.logprobs)
            versions.append(np.full(len(event.token_ids), event.policy_version, dtype=np.int32))
            continue
        return GenerateResult(
            token_ids=np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
            logprobs=np.concatenate(logps).astype(np.float32) if logps else np.zeros(0, np.float32),
            finish_reason=event.finish_reason, policy_version=event.policy_version,
            token_versions=np.concatenate(versions) if versions else np.zeros(0, np.int32),
            routing=event.routing, prompt_tokens=event.prompt_tokens, cached_tokens=event.cached_tokens,
        )
    raise RuntimeError("generation stream ended without a GenerateDone")
