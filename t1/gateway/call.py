"""The values that cross the gateway's seams: one chat call in the template's terms, and its completion.

Both wire dialects (OpenAI Chat Completions, Anthropic Messages) parse into a `ChatCall` and render
from a `Completion`; the session (`t1.gateway.session`) only ever sees these.

Messages are in the form chat templates take (OpenAI's): `{"role", "content": str}` plus, for an
assistant, `tool_calls` (`{"id", "type": "function", "function": {"name", "arguments": str}}`) and
`reasoning_content`, and for a tool result `tool_call_id`. `normal_message` makes every message of a
request that form, so a harness's echo of a reply compares equal to the reply as the gateway gave it.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from t1.errors import BadRequest

Message = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK_END = "</think>"


class BadCall(BadRequest, ValueError):
    """A request the gateway refuses (HTTP 400), with what was wrong in it."""


class StopWhy(StrEnum):
    STOP = "stop"              # the model ended its turn
    TOOL_CALLS = "tool_calls"  # ... with tool calls
    LENGTH = "length"          # max_tokens (or the context limit) reached


@dataclass(frozen=True, slots=True)
class AskedSampling:
    """Sampling a harness asked for (None: not given)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ChatCall:
    """One generation request, whatever its wire dialect."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    sampling: AskedSampling = field(default_factory=AskedSampling)
    model: str = ""
    stream: bool = False


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object

    def as_message_part(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class Completion:
    """The reply to a ChatCall: the assistant message's parts, why it stopped, token counts."""

    id: str
    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    stop: StopWhy
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def message(self) -> Message:
        """The assistant message as a harness echoes it back (and as the template renders it)."""
        msg: Message = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [t.as_message_part() for t in self.tool_calls]
        return msg


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def parse_reply(text: str) -> tuple[str, str, tuple[ToolCall, ...]]:
    """A reply's (content, reasoning, tool calls) from the model's text: `<think>` before `</think>` is the
    reasoning; each well-formed `<tool_call>{"name", "arguments"}</tool_call>` block a tool call (a block
    that does not parse stays in the content, where the harness sees it)."""
    reasoning = ""
    if _THINK_END in text:
        head, text = text.split(_THINK_END, 1)
        reasoning = head.split("<think>")[-1].strip("\n")
        text = text.lstrip("\n")
    calls: list[ToolCall] = []

    def take(match: re.Match[str]) -> str:
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return match.group(0)
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                return match.group(0)
        if not isinstance(args, dict):
            return match.group(0)
        calls.append(ToolCall(new_id("call_"), obj["name"], json.dumps(args, ensure_ascii=False)))
        return ""

    content = _TOOL_CALL.sub(take, text)
    return (content.strip() if calls else content), reasoning, tuple(calls)


def text_of(content: Any, where: str) -> str:
    """A content field as text: a string, None, or a list of text parts (anything else is refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadCall(f"{where}[{i}]: only text content is supported, got {kind!r}")
        return "".join(parts)
    raise BadCall(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}")


def normal_tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise BadCall(f"{where}: a tool call needs a \"function\" object")
    fn = call["function"]
    name, args = fn.get("name"), fn.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise BadCall(f"{where}.function.name must be a non-empty string")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": str(call.get("id") or ""), "type": "function", "function": {"name": name, "arguments": args}}


def normal_message(msg: Any, where: str) -> Message:
    """One message in the template's form; fields the template does not use are dropped."""
    if not isinstance(msg, dict):
        raise BadCall(f"{where} must be an object")
    role = msg.get("role")
    if role == "developer":
        role = "system"
    if role not in ROLES:
        raise BadCall(f"{where}.role must be one of {', '.join(ROLES)} (or developer), got {role!r}")
    out: Message = {"role": role, "content": text_of(msg.get("content"), f"{where}.content")}
    if role == "assistant":
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
        calls = msg.get("tool_calls") or []
        if not isinstance(calls, list):
            raise BadCall(f"{where}.tool_calls must be a list")
        if calls:
            out["tool_calls"] = [normal_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    if role == "tool" and msg.get("tool_call_id") is not None:
        out["tool_call_id"] = str(msg["tool_call_id"])
    return out


def normal_tools(tools: Any, where: str = "tools") -> tuple[dict[str, Any], ...]:
    """OpenAI function tools, as the template takes them."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise BadCall(f"{where} must be a list")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadCall(f"{where}[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}")
        out.append({"type": "function", "function": fn})
    return tuple(out)


def number(body: dict[str, Any], key: str, kind: type, lo: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise BadCall(f"{key} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if lo is not None and value < lo:
        raise BadCall(f"{key} must be >= {lo}, got {value!r}")
    return kind(value)


def stops(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise BadCall(f"{key} must be a string or a list of strings")
