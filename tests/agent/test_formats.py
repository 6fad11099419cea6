"""Agent formats: tool calls and Terminus-2 JSON, good and bad replies; compaction keeps roles valid."""

from __future__ import annotations

import json

import pytest

from t1.agent.compaction import compact_messages
from t1.agent.formats import Command, get_format, parse_terminus2, parse_tool_calls


def _call(name: str, **args: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_tool_calls_in_order_then_finish() -> None:
    text = "Let me look.\n" + _call("bash", command="ls -la") + "\n" + _call("bash", command="sleep 1", timeout_s=5)
    r = parse_tool_calls(text)
    assert r.error is None and not r.done
    assert r.commands == (Command("ls -la"), Command("sleep 1", 5.0))
    r = parse_tool_calls(_call("bash", command="make") + _call("finish") + _call("bash", command="never"))
    assert r.done and r.commands == (Command("make"),)
    # Arguments as a JSON string, as some templates write them.
    r = parse_tool_calls('<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>')
    assert r.commands == (Command("pwd"),)


@pytest.mark.parametrize(("text", "needle"), [
    ("I think we are done.", "no tool call found"),
    ("<tool_call>{\"name\": \"bash\"", "not closed"),
    ("<tool_call>{name: bash}</tool_call>", "not valid JSON"),
    (_call("python", code="1"), "unknown tool 'python'"),
    (_call("bash", command=""), "non-empty string \"command\""),
    (_call("bash", command="ls", timeout_s=-1), "timeout_s must be a positive number"),
    ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "must be an object"),
])
def test_bad_tool_calls_explain_themselves(text: str, needle: str) -> None:
    r = parse_tool_calls(text)
    assert r.error is not None and needle in r.error
    assert r.commands == () and not r.done


def test_terminus2_json() -> None:
    reply = "```json\n" + json.dumps({
        "analysis": "empty dir", "plan": "create file",
        "commands": [{"keystrokes": "echo hi > a.txt\n", "duration": 0.1}, {"keystrokes": "C-c", "duration": 1},
                     {"keystrokes": "cat a.txt\n"}],
        "task_complete": False}) + "\n```"
    r = parse_terminus2(reply)
    assert r.error is None and not r.done
    assert [c.text for c in r.commands] == ["echo hi > a.txt", "cat a.txt"]
    assert r.commands[0].timeout_s == 10.0 and r.commands[1].timeout_s is None
    done = parse_terminus2('{"analysis": "", "plan": "", "commands": [], "task_complete": true}')
    assert done.done and done.error is None


@pytest.mark.parametrize(("text", "needle"), [
    ("no json here", "not a JSON object"),
    ('{"analysis": "a", "plan": "b"}', "missing required field(s): commands"),
    ('{"analysis": "a", "plan": "b", "commands": "ls"}', "must be a list"),
    ('{"analysis": "a", "plan": "b", "commands": [{"keys": "ls"}]}', "commands[0]: needs a string"),
    ('{"analysis": "a", "plan": "b", "commands": [], "task_complete": "yes"}', "true or false"),
])
def test_bad_terminus2_replies(text: str, needle: str) -> None:
    r = parse_terminus2(text)
    assert r.error is not None and needle in r.error


def test_observations_per_format() -> None:
    tools = get_format("tool_calls")
    assert tools.observation(["a", "b"]) == [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    assert tools.observation([], "bad")[0]["content"] == "ERROR: bad"
    t2 = get_format("terminus2")
    assert t2.tools is None and t2.observation(["x"])[0]["role"] == "user"
    with pytest.raises(ValueError, match="agent format must be one of"):
        get_format("xml")


def test_compaction_keeps_last_turns_and_alternation() -> None:
    opening = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
    body = []
    for i in range(5):
        body += [{"role": "assistant", "content": f"a{i}"}, {"role": "tool", "content": f"out{i}"}]
    out = compact_messages(opening + body, 2, keep_last_turns=2, commands_run=[("ls", 0), ("make", 2)])
    assert [m["content"] for m in out[2:]] == ["a3", "out3", "a4", "out4"]
    assert "$ ls  -> exit 0" in out[1]["content"] and "$ make  -> exit 2" in out[1]["content"]
    assert out[0] == opening[0]
    only = compact_messages(opening + body, 2, keep_last_turns=0, commands_run=[])
    assert len(only) == 2 and only[-1]["role"] == "user"
