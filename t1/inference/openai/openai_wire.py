"""The bodies T1 sends to OpenAI-compatible servers and what it reads from their replies: pure functions.

- Completions (token-level, TITO): the prompt goes as a list of token ids and the reply must carry the
  sampled ids: vLLM's `return_token_ids` (`choices[0].token_ids`) or, failing that, `logprobs.tokens`
  as `token_id:N` strings (`return_tokens_as_token_ids`). `logprobs: 0` asks for the sampled token's
  logprob only. Routed experts (vLLM `enable_return_routed_experts`) come back as base64 `.npy` bytes of
  [positions, layers, top_k] from `routed_experts_prompt_start`, and are checked like the routing of
  T1's own servers (t1.inference.routing_check).
- Chat (text-level, eval): standard fields only, so hosted APIs take the body as it is.

A reply that does not match the contract (more sampled ids than max_tokens included) raises
MalformedReply naming the field (the pool retries it,
then reports an infra error); a server that returns no token ids raises NoTokenIds (training refuses it);
EndpointRefused is what the pool raises for a refusal a retry does not change.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any

import numpy as np

from t1.errors import InfraError
from t1.inference.openai.openai_messages import tool_calls_text
from t1.inference.routing_capture import MoeShape
from t1.inference.routing_check import RouteDefects, check_routed_experts
from t1.inference.types import (
    ChatReply,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
)
from t1.routing.block import RoutingBlock

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT,
           "tool_calls": FinishReason.STOP, "content_filter": FinishReason.ABORT}
_TOKEN_ID_PREFIX = "token_id:"


class MalformedReply(InfraError, RuntimeError):
    """A 200 reply whose body does not follow the API (not JSON, a field missing or of the wrong type)."""


class EndpointRefused(InfraError, RuntimeError):
    """The endpoint refused the request for a reason a retry does not change (auth, a 4xx, no token ids)."""


class NoTokenIds(InfraError, RuntimeError):
    """The server answered with text only: exact-token training cannot use it."""


def _sampling_fields(s: SamplingParams) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature,
                            "top_p": s.top_p if s.top_p > 0 else 1.0}
    if s.seed is not None:
        body["seed"] = s.seed
    return body


def completion_body(model: str, request: GenerateRequest, routing_start: int) -> dict[str, Any]:
    """A /completions body for one turn: the exact context as token ids, sampled ids and logprobs asked back."""
    s = request.sampling
    body = {"model": model, "prompt": np.asarray(request.prompt_ids).tolist(), "n": 1, "stream": False,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "skip_special_tokens": False, **_sampling_fields(s)}
    if s.top_k > 0:
        body["top_k"] = s.top_k
    if s.stop_token_ids:
        body["stop_token_ids"] = list(s.stop_token_ids)
    if request.session_id:
        body["session_id"] = request.session_id
    if routing_start:
        body["routed_experts_prompt_start"] = routing_start
    return body


def chat_body(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
              sampling: SamplingParams) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages, "n": 1, "stream": False, **_sampling_fields(sampling)}
    if tools:
        body["tools"] = tools
    return body


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    """obj[key], which must be a `kind` (list or dict)."""
    if not isinstance(obj, dict) or key not in obj:
        raise MalformedReply(f"{where}.{key}: missing")
    value = obj[key]
    if not isinstance(value, kind):
        raise MalformedReply(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _first_choice(body: Any) -> dict[str, Any]:
    choices = _field(body, "choices", list, "reply")
    if len(choices) != 1 or not isinstance(choices[0], dict):
        raise MalformedReply(f"reply.choices: expected one choice object, got {len(choices)}")
    return choices[0]


def _finish(choice: dict[str, Any], where: str) -> FinishReason:
    reason = choice.get("finish_reason")
    if reason not in _FINISH:
        raise MalformedReply(f"{where}.finish_reason: expected one of {sorted(_FINISH)}, got {reason!r}")
    return _FINISH[reason]


def _count(obj: Any, key: str) -> int:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _usage(body: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt, completion, cached) token counts; a server without usage reports zeros."""
    usage = body.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"), _count(details, "cached_tokens")


def _sampled_ids(choice: dict[str, Any], logprobs: dict[str, Any] | None, vocab_size: int) -> np.ndarray:
    ids = choice.get("token_ids")
    if ids is None and logprobs is not None:
        tokens = logprobs.get("tokens")
        if isinstance(tokens, list) and all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
            try:
                ids = [int(t[len(_TOKEN_ID_PREFIX):]) for t in tokens]
            except ValueError as exc:
                raise MalformedReply(f"reply.choices[0].logprobs.tokens: {exc}") from None
    if ids is None:
        raise NoTokenIds("the reply has no sampled token ids (choices[0].token_ids, or logprobs.tokens as "
                         "token_id:N): exact-token training needs a server that honours return_token_ids "
                         "(vLLM) or return_tokens_as_token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise MalformedReply("reply.choices[0].token_ids: expected a list of integers")
    arr = np.asarray(ids, np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise MalformedReply(f"reply.choices[0].token_ids: ids must be in [0, {vocab_size}), got "
                             f"[{arr.min()}, {arr.max()}]")
    return arr.astype(np.int32)


def _logprobs(logprobs: dict[str, Any] | None, n: int) -> np.ndarray:
    where = "reply.choices[0].logprobs.token_logprobs"
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list) or len(values) != n:
        raise MalformedReply(f"{where}: expected {n} logprobs (one per sampled token), got "
                             f"{len(values) if isinstance(values, list) else type(values).__name__}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v <= 0
               for v in values):
        raise MalformedReply(f"{where}: every logprob must be a finite number <= 0")
    return np.asarray(values, np.float32)


def decode_routed_experts(data: Any) -> np.ndarray:
    """vLLM's routed_experts: base64 of an `.npy` file (no pickles)."""
    if not isinstance(data, str):
        raise MalformedReply(f"reply.choices[0].routed_experts: expected base64 text, got {type(data).__name__}")
    try:
        return np.load(io.BytesIO(base64.b64decode(data, validate=True)), allow_pickle=False)
    except (binascii.Error, ValueError, OSError, EOFError) as exc:
        raise MalformedReply(f"reply.choices[0].routed_experts: not a base64 .npy array: {exc}") from None


def parse_completion(body: Any, prompt_len: int, version: int, vocab_size: int, moe: MoeShape | None,
                     routing_start: int, max_tokens: int) -> tuple[GenerateResult, RouteDefects | None]:
    """The GenerateResult of a /completions reply to `completion_body`; routing (checked) when returned."""
    choice = _first_choice(body)
    _field(choice, "text", str, "reply.choices[0]")  # every completion choice has it, token ids or not
    logprobs = choice.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, dict):
        raise MalformedReply("reply.choices[0].logprobs: expected an object")
    ids = _sampled_ids(choice, logprobs, vocab_size)
    if len(ids) > max_tokens:
        raise MalformedReply(f"reply.choices[0].token_ids: {len(ids)} sampled ids for max_tokens {max_tokens}")
    logps = _logprobs(logprobs, len(ids))
    finish = _finish(choice, "reply.choices[0]")
    _, _, cached = _usage(body)
    routing: RoutingBlock | None = None
    defects: RouteDefects | None = None
    raw = choice.get("routed_experts")
    if raw is not None and moe is not None and len(ids):
        routing, defects = check_routed_experts(decode_routed_experts(raw), routing_start,
                                                prompt_len + len(ids) - 1 - routing_start, moe)
    result = GenerateResult(token_ids=ids, logprobs=logps, finish_reason=finish, policy_version=version,
                            token_versions=np.full(len(ids), version, np.int32), routing=routing,
                            prompt_tokens=prompt_len, cached_tokens=min(cached, prompt_len))
    return result, defects


def parse_chat(body: Any) -> ChatReply:
    """The assistant's text of a /chat/completions reply; tool calls become <tool_call> blocks after it."""
    choice = _first_choice(body)
    message = _field(choice, "message", dict, "reply.choices[0]")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise MalformedReply("reply.choices[0].message.content: expected text or null")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise MalformedReply("reply.choices[0].message.tool_calls: expected a list")
    try:
        text = (content or "") + tool_calls_text(calls)
    except ValueError as exc:
        raise MalformedReply(f"reply.choices[0].message.{exc}") from None
    prompt, completion, _ = _usage(body)
    return ChatReply(text, _finish(choice, "reply.choices[0]"), prompt, completion)
