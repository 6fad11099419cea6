"""The gateway on Qwen3's own chat template (vendored in tests/fixtures/chat_templates), thinking off and on,
with the tiny model generating: a harness-shaped conversation of tool calls and results runs to the end,
every segment start counted with its cause, drift 0, never an exception."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from t1.config.rollout import HarnessConfig
from t1.gateway.call import ChatCall
from t1.gateway.session import GatewaySession
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams, collect
from t1.tito import ChatRenderer

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
TOOLS = ({"type": "function", "function": {"name": "bash", "description": "run",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}},)


@pytest.mark.parametrize("template", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("on_rewrite", ["new_segment", "repair"])
async def test_harness_conversation_on_a_real_template(tokenizer, backend, template, thinking, on_rewrite) -> None:
    tok = copy.copy(tokenizer)
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    renderer = ChatRenderer(tok, end_of_turn="<|im_end|>", template_kwargs={"enable_thinking": thinking})
    sampled: list[np.ndarray] = []

    async def generate(req: GenerateRequest) -> GenerateResult:
        res = await collect(backend.stream(req))
        sampled.append(res.token_ids.copy())
        return res

    sess = GatewaySession(
        "ep",
        generate,
        renderer,
        SamplingParams(max_tokens=12),
        HarnessConfig(command="x", on_template_rewrite=on_rewrite),
        4096,
        0,
    )
    messages: list[dict] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Go."}]
    for i in range(5):
        done = await sess.complete(ChatCall(tuple(messages), TOOLS))
        messages.append(done.message())
        # A harness sends tool results after a tool call, and a user nudge (a new query) otherwise.
        messages += [{"role": "tool", "tool_call_id": t.id, "content": f"out {i}"} for t in done.tool_calls] or \
            [{"role": "user", "content": f"Use the bash tool ({i})."}]
    segments, drift, _ = sess.segments()
    assert drift == 0 and sess.calls == 5
    assert sum(sess.causes.values()) == len(segments)
    assert np.array_equal(np.concatenate([s.token_ids[s.loss_mask] for s in segments]), np.concatenate(sampled))
    assert all(r.cause == "" or r.cause == "first" or r.cause.startswith("template_rewrote:") for r in sess.records), \
        [r.cause for r in sess.records]
    if on_rewrite == "repair":  # the ids the model saw are kept: one segment, the rewrites counted as mismatches
        assert len(segments) == 1 and dict(sess.causes) == {"first": 1}
        assert sess.counters().template_mismatches == (0 if template == "qwen3" and thinking else 4)
    elif template == "qwen3" and not thinking:  # the empty think block of each past turn is dropped
        assert sess.causes["template_rewrote:generation_prompt"] == 4
