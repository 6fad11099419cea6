"""T1's conversation as OpenAI chat messages, and a reply's tool calls as the text T1's formats parse.

T1 keeps an episode's conversation the way its chat template renders it: an assistant turn is text
(tool calls inside it as `<tool_call>{"name", "arguments"}</tool_call>` blocks) and each command's
output is a `tool` message. The chat API wants structured `tool_calls` with ids that the following
`tool` messages answer, every id answered. `to_chat_messages` pairs them in order: a call without an
output gets "(not run)", an output without a call becomes a user message. Without tool support on the
endpoint, tool messages go as user messages. Pure functions.
"""

from __future__ import annotations

import json
import re
from typing import Any

Message = dict[str, Any]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
NOT_RUN = "(not run)"


def _calls_of(text: str, turn: int) -> tuple[str, list[dict[str, Any]]]:
    """The text outside well-formed <tool_call> blocks, and those blocks as chat tool_calls."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue  # left in the text, as the model wrote it
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        args = call.get("arguments", {})
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append({"id": f"call_{turn}_{len(calls)}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
    kept.append(text[last:])
    return "".join(kept).strip(), calls


def to_chat_messages(messages: list[Message], tool_calls: bool) -> list[Message]:
    """The chat API's messages for T1's conversation (see the module docstring)."""
    out: list[Message] = []
    pending: list[str] = []  # ids of the last assistant turn's calls not answered yet

    def close_pending() -> None:
        out.extend({"role": "tool", "tool_call_id": i, "content": NOT_RUN} for i in pending)
        pending.clear()

    for turn, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content") or ""
        if role == "tool":
            if tool_calls and pending:
                out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": content})
            else:
                out.append({"role": "user", "content": content})
            continue
        close_pending()
        if role == "assistant" and tool_calls:
            text, calls = _calls_of(content, turn)
            if calls:
                out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
                pending = [c["id"] for c in calls]
                continue
        out.append({"role": role, "content": content})
    close_pending()
    return out


def tool_calls_text(calls: list[Any]) -> str:
    """A chat reply's tool_calls as <tool_call> blocks (one per line, after the reply's text); ValueError
    names a call without a function name."""
    blocks = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tool_calls[{i}].function: needs a string name")
        raw = fn.get("arguments", "{}")
        try:
            args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
        except json.JSONDecodeError:
            args = raw  # the parser tells the model its arguments are not JSON
        blocks.append("<tool_call>" + json.dumps({"name": fn["name"], "arguments": args}) + "</tool_call>")
    return "".join("\n" + b for b in blocks)
