"""Anthropic Messages on the wire: a request body into a ChatCall, a Completion into a response.

Content blocks map to the template's messages: a user turn's `tool_result` blocks become `tool`
messages (in order, before its text), an assistant turn's `tool_use` blocks its tool calls (the
input as JSON text) and a `thinking` block its reasoning. Streaming sends the documented event
sequence (message_start, one start/delta/stop per content block, message_delta, message_stop).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from t1.gateway.call import (
    AskedSampling,
    BadCall,
    ChatCall,
    Completion,
    Message,
    StopWhy,
    number,
    stops,
    text_of,
)

_STOP_REASON = {StopWhy.STOP: "end_turn", StopWhy.TOOL_CALLS: "tool_use", StopWhy.LENGTH: "max_tokens"}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadCall(f"{where} must be a string or a list of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadCall(f"{where}[{i}] must be a content block with a \"type\"")
    return content


def _user(content: Any, where: str) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []
    for i, block in enumerate(_blocks(content, where)):
        kind = block["type"]
        if kind == "text":
            texts.append(text_of(block.get("text"), f"{where}[{i}].text"))
        elif kind == "tool_result":
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                        "content": text_of(block.get("content"), f"{where}[{i}].content")})
        else:
            raise BadCall(f"{where}[{i}]: block type {kind!r} is not supported in a user turn (text, tool_result)")
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(content: Any, where: str) -> Message:
    msg: Message = {"role": "assistant", "content": ""}
    texts: list[str] = []
    calls = []
    for i, block in enumerate(_blocks(content, where)):
        kind = block["type"]
        if kind == "text":
            texts.append(text_of(block.get("text"), f"{where}[{i}].text"))
        elif kind == "thinking":
            msg["reasoning_content"] = str(block.get("thinking") or "")
        elif kind == "tool_use":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise BadCall(f"{where}[{i}]: tool_use needs a string name and an object input")
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        else:
            raise BadCall(f"{where}[{i}]: block type {kind!r} is not supported in an assistant turn")
    msg["content"] = "".join(texts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def parse_messages(body: Any) -> ChatCall:
    if not isinstance(body, dict):
        raise BadCall("the request body must be a JSON object")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadCall("messages must be a non-empty list")
    messages: list[Message] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": text_of(system, "system")})
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadCall(f"{where}.role must be user or assistant")
        if m["role"] == "user":
            messages.extend(_user(m.get("content"), f"{where}.content"))
        else:
            messages.append(_assistant(m.get("content"), f"{where}.content"))
    tools = []
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadCall(f"tools[{i}] needs a string name")
        tools.append({"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                                       "parameters": tool.get("input_schema", {})}})
    if (body.get("tool_choice") or {}).get("type") == "none":
        tools = []
    sampling = AskedSampling(temperature=number(body, "temperature", float, 0), top_p=number(body, "top_p", float, 0),
                             top_k=number(body, "top_k", int, 0), max_tokens=number(body, "max_tokens", int, 1),
                             stop=stops(body.get("stop_sequences"), "stop_sequences"))
    return ChatCall(tuple(messages), tuple(tools), sampling, str(body.get("model") or ""), bool(body.get("stream")))


def _content(c: Completion) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if c.reasoning:
        blocks.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
    if c.content or not c.tool_calls:
        blocks.append({"type": "text", "text": c.content})
    blocks += [{"type": "tool_use", "id": t.id, "name": t.name, "input": json.loads(t.arguments)} for t in c.tool_calls]
    return blocks


def message_body(c: Completion, model: str) -> dict[str, Any]:
    return {"id": c.id, "type": "message", "role": "assistant", "model": model, "content": _content(c),
            "stop_reason": _STOP_REASON[c.stop], "stop_sequence": None,
            "usage": {"input_tokens": c.prompt_tokens - c.cached_tokens, "output_tokens": c.completion_tokens,
                      "cache_read_input_tokens": c.cached_tokens, "cache_creation_input_tokens": 0}}


def message_events(c: Completion, model: str) -> Iterator[bytes]:
    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

    body = message_body(c, model)
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"], "output_tokens": 0}}
    yield event("message_start", {"message": start})
    for i, block in enumerate(body["content"]):
        kind = block["type"]
        if kind == "text":
            yield event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
            delta = {"type": "text_delta", "text": block["text"]}
        elif kind == "thinking":
            yield event("content_block_start", {"index": i, "content_block": {"type": "thinking", "thinking": ""}})
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            yield event("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield event("content_block_delta", {"index": i, "delta": delta})
        yield event("content_block_stop", {"index": i})
    yield event("message_delta", {"delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                                  "usage": {"output_tokens": c.completion_tokens}})
    yield event("message_stop", {})


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
