"""rollout.tool_schemas: the tool-call prompt with or without the tools' JSON schemas, same replies and parsing."""

from __future__ import annotations

from pathlib import Path

from t1.agent.formats import FormatName, get_format
from t1.coordinator.model_setup import make_renderers


def test_prompt_without_schemas_is_shorter_and_replies_unchanged(tiny_model_dir: Path) -> None:
    fmt = get_format("tool_calls")
    messages = fmt.first_messages("The file alpha.txt holds a code. Write that code to red.txt.")
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": "cat alpha.txt"}}}],
    }
    full = make_renderers(tiny_model_dir)[FormatName.TOOL_CALLS]
    bare = make_renderers(tiny_model_dir, tool_schemas=False)[FormatName.TOOL_CALLS]
    with_schemas = full.render(messages, add_generation_prompt=True)
    without = bare.render(messages, add_generation_prompt=True)
    assert '"name": "bash"' in with_schemas and "<tools>" in with_schemas
    assert "<tools>" not in without and '"name": "bash"' not in without
    assert messages[0]["content"] in without and messages[1]["content"] in without  # system and task stay
    assert len(bare.encode(without)) < len(full.encode(with_schemas)) - 100
    # the assistant's tool call renders the same and parses the same either way
    reply_full = full.render([*messages, call], add_generation_prompt=False)[len(with_schemas):]
    reply_bare = bare.render([*messages, call], add_generation_prompt=False)[len(without):]
    assert reply_full == reply_bare
    parsed = fmt.parse(reply_bare.removesuffix("<|im_end|>\n"))
    assert parsed.error is None and [c.text for c in parsed.commands] == ["cat alpha.txt"]
