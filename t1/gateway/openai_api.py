"""OpenAI Chat Completions on the wire: a request body into a ChatCall, a Completion into a response.

Streaming answers with the same completion as `chat.completion.chunk` events (the role, the
content, each tool call, the finish reason, usage when `stream_options.include_usage`, `[DONE]`):
the gateway generates a turn whole (its exact ids are recorded before any of it is shown), then
streams it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from t1.gateway.call import (
    AskedSampling,
    BadCall,
    ChatCall,
    Completion,
    normal_message,
    normal_tools,
    number,
    stops,
)


def parse_chat(body: Any) -> ChatCall:
    if not isinstance(body, dict):
        raise BadCall("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadCall("messages must be a non-empty list")
    n = number(body, "n", int, 1)
    if n not in (None, 1):
        raise BadCall(f"n must be 1 (one completion per request), got {n}")
    max_tokens = number(body, "max_completion_tokens", int, 1) or number(body, "max_tokens", int, 1)
    sampling = AskedSampling(temperature=number(body, "temperature", float, 0), top_p=number(body, "top_p", float, 0),
                             top_k=number(body, "top_k", int, 0), max_tokens=max_tokens,
                             seed=number(body, "seed", int), stop=stops(body.get("stop"), "stop"))
    tools = normal_tools(body.get("tools"))
    if body.get("tool_choice") == "none":
        tools = ()
    return ChatCall(tuple(normal_message(m, f"messages[{i}]") for i, m in enumerate(messages)), tools, sampling,
                    str(body.get("model") or ""), bool(body.get("stream", False)))


def _usage(c: Completion) -> dict[str, Any]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}


def completion_body(c: Completion, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.reasoning:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [t.as_message_part() for t in c.tool_calls]
    return {"id": c.id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": c.stop.value, "logprobs": None}],
            "usage": _usage(c)}


def completion_chunks(c: Completion, model: str, include_usage: bool) -> Iterator[bytes]:
    """The completion as server-sent events."""
    created = int(time.time())

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {"id": c.id, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    yield event({"role": "assistant", "content": ""})
    if c.reasoning:
        yield event({"reasoning_content": c.reasoning})
    if c.content:
        yield event({"content": c.content})
    for i, t in enumerate(c.tool_calls):
        yield event({"tool_calls": [{"index": i, **t.as_message_part()}]})
    yield event({}, c.stop.value)
    if include_usage:
        usage = {"id": c.id, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": [], "usage": _usage(c)}
        yield b"data: " + json.dumps(usage).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "t1"}]}


def error_body(status: int, message: str, code: str = "") -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code or None}}
