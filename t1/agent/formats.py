"""Agent formats: how the policy writes actions and how observations go back into the conversation.

- tool_calls (default): the chat template's tool calls, `<tool_call>{"name", "arguments"}</tool_call>`
  in the assistant turn; tools `bash(command, timeout_s?)` and `finish()`; observations are
  `tool` messages (the template wraps them in <tool_response>).
- terminus2: Terminus-2's JSON protocol, one object per reply
  `{"analysis", "plan", "commands": [{"keystrokes", "duration"}], "task_complete"}`;
  observations are user messages with the terminal output.

Parsing is pure: text in, a ParsedReply out. A reply that does not parse yields `error`
(the episode shows it to the model as an observation, and the turn counts).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

Message = dict[str, Any]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_SPECIAL_KEYS = frozenset({"C-c", "C-d", "C-z", "C-l", "Escape", "Enter"})
MAX_COMMANDS_PER_TURN = 16


class FormatName(StrEnum):
    TOOL_CALLS = "tool_calls"
    TERMINUS2 = "terminus2"


@dataclass(frozen=True, slots=True)
class Command:
    """One shell command to run; timeout_s None means the shell's default."""

    text: str
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """The actions of one reply: commands to run in order, whether the agent says it is done, or an error."""

    commands: tuple[Command, ...] = ()
    done: bool = False
    error: str | None = None


BASH_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "bash", "description": "Run a command in the persistent bash shell of the task's machine.",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "description": "The command line."},
        "timeout_s": {"type": "number", "description": "Seconds before the command is interrupted."}},
        "required": ["command"]}}}
FINISH_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "finish", "description": "Call when the task is complete; the tests run afterwards.",
    "parameters": {"type": "object", "properties": {}}}}


def _positive_number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def parse_tool_calls(text: str) -> ParsedReply:
    """Every <tool_call> block in order; `finish` ends the episode after the commands before it."""
    blocks = _TOOL_CALL.findall(text)
    if not blocks:
        if "<tool_call>" in text:
            return ParsedReply(error="a <tool_call> block is not closed with </tool_call>")
        return ParsedReply(error="no tool call found: call `bash` with a command, or `finish` when the task is done")
    commands: list[Command] = []
    for i, raw in enumerate(blocks[:MAX_COMMANDS_PER_TURN]):
        try:
            call = json.loads(raw)
        except json.JSONDecodeError as exc:
            return ParsedReply(error=f"tool call {i + 1} is not valid JSON: {exc}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParsedReply(error=f"tool call {i + 1} needs a string \"name\"")
        args = call.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                return ParsedReply(error=f"tool call {i + 1}: \"arguments\" is not a JSON object: {exc}")
        if not isinstance(args, dict):
            return ParsedReply(error=f"tool call {i + 1}: \"arguments\" must be an object")
        name = call["name"]
        if name == "finish":
            return ParsedReply(tuple(commands), done=True)
        if name != "bash":
            return ParsedReply(error=f"tool call {i + 1}: unknown tool {name!r} (tools: bash, finish)")
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            return ParsedReply(error=f"tool call {i + 1}: bash needs a non-empty string \"command\"")
        try:
            timeout = _positive_number(args.get("timeout_s"), f"tool call {i + 1}: timeout_s")
        except ValueError as exc:
            return ParsedReply(error=str(exc))
        commands.append(Command(command, timeout))
    return ParsedReply(tuple(commands))


def _json_object(text: str) -> Any:
    """The first complete JSON object in the text (models wrap it in prose or ``` fences)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object found in the reply")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    return obj


def parse_terminus2(text: str) -> ParsedReply:
    try:
        obj = _json_object(text)
    except ValueError as exc:
        return ParsedReply(error=f"the reply is not a JSON object: {exc}")
    if not isinstance(obj, dict):
        return ParsedReply(error="the reply must be a JSON object")
    missing = [k for k in ("analysis", "plan", "commands") if k not in obj]
    if missing:
        return ParsedReply(error=f"missing required field(s): {', '.join(missing)}")
    cmds = obj["commands"]
    if not isinstance(cmds, list):
        return ParsedReply(error="\"commands\" must be a list of {keystrokes, duration}")
    commands: list[Command] = []
    for i, c in enumerate(cmds[:MAX_COMMANDS_PER_TURN]):
        if not isinstance(c, dict) or not isinstance(c.get("keystrokes"), str):
            return ParsedReply(error=f"commands[{i}]: needs a string \"keystrokes\"")
        try:
            duration = _positive_number(c.get("duration"), f"commands[{i}].duration")
        except ValueError as exc:
            return ParsedReply(error=str(exc))
        keys = c["keystrokes"].rstrip("\n")
        if not keys.strip() or keys.strip() in _SPECIAL_KEYS:
            continue  # a bare Enter or a control key: nothing to run in a command shell
        # Terminus-2's duration is how long to wait for output; it bounds the command here, with a floor.
        commands.append(Command(keys, None if duration is None else max(duration, 1.0) * 10))
    done = obj.get("task_complete", False)
    if not isinstance(done, bool):
        return ParsedReply(error="\"task_complete\" must be true or false")
    return ParsedReply(tuple(commands), done=done)


@dataclass(frozen=True, slots=True)
class AgentFormat:
    """One format: the prompt preamble, tools for the template, reply parsing and observation messages."""

    name: FormatName

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return [BASH_TOOL, FINISH_TOOL] if self.name is FormatName.TOOL_CALLS else None

    def first_messages(self, instruction: str) -> list[Message]:
        if self.name is FormatName.TOOL_CALLS:
            system = ("You are an agent working in a Linux shell. Use the bash tool to run commands; "
                      "call finish when the task is done.")
        else:
            system = ("You are an agent working in a Linux terminal. Reply with one JSON object: "
                      '{"analysis": str, "plan": str, "commands": [{"keystrokes": str, "duration": number}], '
                      '"task_complete": bool}. Keystrokes ending in a newline are run as a command.')
        return [{"role": "system", "content": system}, {"role": "user", "content": instruction}]

    def parse(self, text: str) -> ParsedReply:
        return parse_tool_calls(text) if self.name is FormatName.TOOL_CALLS else parse_terminus2(text)

    def observation(self, outputs: list[str], error: str | None = None) -> list[Message]:
        """Messages carrying a turn's results (or its parse error) back to the model."""
        if error is not None:
            text = f"ERROR: {error}"
            return [{"role": "tool", "content": text}] if self.name is FormatName.TOOL_CALLS else \
                [{"role": "user", "content": text}]
        if self.name is FormatName.TOOL_CALLS:
            return [{"role": "tool", "content": out} for out in outputs] or \
                [{"role": "tool", "content": "(no command was run)"}]
        return [{"role": "user", "content": "New Terminal Output:\n" + ("\n".join(outputs) or "(no output)")}]


def get_format(name: str) -> AgentFormat:
    try:
        return AgentFormat(FormatName(name))
    except ValueError:
        raise ValueError(f"agent format must be one of {[f.value for f in FormatName]}, got {name!r}") from None


def format_output(command: str, output: str, exit_code: int | None, timed_out: bool, truncated: bool) -> str:
    """The observation text of one command, as the model sees it."""
    notes = []
    if timed_out:
        notes.append("the command timed out and was interrupted")
    if truncated:
        notes.append("output truncated in the middle")
    tail = f"\n[exit code {exit_code}]" if exit_code is not None else ""
    return output + tail + (f"\n[{'; '.join(notes)}]" if notes else "")
