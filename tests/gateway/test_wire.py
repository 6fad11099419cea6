"""The gateway's two dialects through their official clients (the `openai` and `anthropic` SDKs) and the
session's segment rules, on a host-loopback socket with replies scripted as the template writes them."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator

import anthropic
import numpy as np
import openai
import pytest

from t1.config.rollout import HarnessConfig, HarnessSamplingConfig
from t1.gateway.anthropic_api import parse_messages
from t1.gateway.call import BadCall, ChatCall, normal_message
from t1.gateway.openai_api import parse_chat
from t1.gateway.server import GatewayServer
from t1.gateway.session import GatewaySession
from t1.inference.types import FinishReason, GenerateRequest, GenerateResult, SamplingParams

KEY = "test-key-" + "x" * 32
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls /app"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


class Scripted:
    """The replies to give, in order (text as the template writes it), and the requests seen."""

    def __init__(self, renderer, replies: list[str]) -> None:
        self.renderer, self.replies, self.requests = renderer, replies, []

    async def __call__(self, req: GenerateRequest) -> GenerateResult:
        self.requests.append(req)
        text = self.replies[(len(self.requests) - 1) % len(self.replies)]
        ids = np.asarray(self.renderer.encode(text) + list(self.renderer.end_of_turn_ids), np.int32)
        return GenerateResult(ids, np.full(len(ids), -0.25, np.float32), FinishReason.STOP, 3,
                              np.full(len(ids), 3, np.int32), None, len(req.prompt_ids))


def session(renderer, replies: list[str], **cfg) -> tuple[GatewaySession, Scripted]:
    gen = Scripted(renderer, replies)
    return GatewaySession("ep", gen, renderer, SamplingParams(temperature=1.0, max_tokens=64),
                          HarnessConfig(command="x", **cfg), 4096, 0), gen


@pytest.fixture()
async def served(renderers) -> AsyncIterator[tuple[str, GatewaySession, Scripted]]:
    renderer = next(iter(renderers.values()))
    sess, gen = session(renderer, [CALL, "All done."])
    server = GatewayServer(sess, KEY, "t1")
    sock = socket.create_server(("127.0.0.1", 0))
    await server.serve(sock)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", sess, gen
    await server.close()


async def test_openai_sdk_tools_streamed_and_not(served) -> None:
    url, sess, gen = served
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id async for m in client.models.list()] == ["t1"]
    messages: list = [{"role": "user", "content": "list /app"}]
    first = await client.chat.completions.create(model="t1", messages=messages, tools=TOOLS, max_tokens=32)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "bash"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"command": "ls /app"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "a.txt"}]
    stream = await client.chat.completions.create(model="t1", messages=messages, tools=TOOLS, stream=True,
                                                  stream_options={"include_usage": True})
    text, usage = "", None
    async for chunk in stream:
        usage = chunk.usage or usage
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert text == "All done." and usage is not None and usage.completion_tokens > 0
    # The second call continued the first's segment: only its delta was new.
    assert [r.cause for r in sess.records] == ["first", ""]
    assert usage.prompt_tokens == len(gen.requests[1].prompt_ids)
    await client.close()
    segments, drift, _ = sess.segments()
    assert len(segments) == 1 and drift == 0 and len(segments[0].turns) == 2


async def test_anthropic_sdk_tools_streamed_and_not(served) -> None:
    url, sess, _ = served
    client = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0)
    tools = [{"name": "bash", "description": "run",
              "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    messages: list = [{"role": "user", "content": "list /app"}]
    first = await client.messages.create(model="t1", max_tokens=32, messages=messages, tools=tools)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "bash" and use.input == {"command": "ls /app"}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]}]
    async with client.messages.stream(model="t1", max_tokens=32, messages=messages, tools=tools) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[0].text == "All done."
    assert [r.cause for r in sess.records] == ["first", ""]
    await client.close()


async def test_keys_and_paths_refused_with_the_dialects_errors(served) -> None:
    url, sess, _ = served
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="nope" * 8, max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
    async with anthropic.AsyncAnthropic(base_url=url, api_key="nope" * 8, max_retries=0) as wrong_a:
        with pytest.raises(anthropic.AuthenticationError):
            await wrong_a.messages.create(model="t1", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as right:
        with pytest.raises(openai.BadRequestError, match="messages must be a non-empty list"):
            await right.chat.completions.create(model="t1", messages=[])
    assert sess.calls == 0


async def test_segment_causes(renderers) -> None:
    renderer = next(iter(renderers.values()))
    sess, _ = session(renderer, [CALL])
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    r1 = await sess.complete(ChatCall(tuple(opening), tuple(TOOLS)))
    reply = r1.message()
    tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "out"}
    convo = [*opening, reply, tool]
    r2 = await sess.complete(ChatCall(tuple(convo), tuple(TOOLS)))                 # continues
    convo2 = [*convo, r2.message(), {**tool, "tool_call_id": r2.tool_calls[0].id}]
    await sess.complete(ChatCall(tuple(convo2), tuple(TOOLS)))                     # continues
    r4 = await sess.complete(ChatCall(tuple(convo2), tuple(TOOLS)))                # the same call again
    edited = [*convo2, {**r4.message(), "content": "edited"}, {**tool, "tool_call_id": r4.tool_calls[0].id}]
    await sess.complete(ChatCall(tuple(edited), tuple(TOOLS)))                     # the reply rewritten
    await sess.complete(ChatCall((opening[1], tool), tuple(TOOLS)))                # compacted
    await sess.complete(ChatCall(tuple(opening), ()))                              # tools changed
    assert [r.cause for r in sess.records] == ["first", "", "", "no_reply", "reply_rewritten", "history_rewritten",
                                               "tools_changed"]
    segments, drift, _ = sess.segments()
    assert len(segments) == 5 and drift == 0
    assert [len(s.turns) for s in segments] == [3, 1, 1, 1, 1]


async def test_limits_and_sampling_bounds(renderers) -> None:
    renderer = next(iter(renderers.values()))
    sess, gen = session(renderer, ["ok"], max_calls=2,
                        sampling=HarnessSamplingConfig(honour="request", max_temperature=1.2, min_top_p=0.5))
    call = parse_chat({"messages": [{"role": "user", "content": "u"}], "temperature": 5, "top_p": 0.1,
                       "max_tokens": 1000, "seed": 4})
    await sess.complete(call)
    s = gen.requests[0].sampling
    assert (s.temperature, s.top_p, s.seed, s.max_tokens) == (1.2, 0.5, 4, 64)
    assert sess.records[0].asked == {"temperature": 5.0, "top_p": 0.1, "max_tokens": 1000, "seed": 4}
    small, _ = session(renderer, ["ok"])
    small._max_context = 5
    with pytest.raises(BadCall, match="context_length_exceeded"):
        await small.complete(call)
    await sess.complete(call)
    with pytest.raises(BadCall, match="call limit"):
        await sess.complete(call)


def test_bad_requests_name_what_is_wrong() -> None:
    with pytest.raises(BadCall, match=r"messages\[0\].role"):
        parse_chat({"messages": [{"role": "wizard", "content": "x"}]})
    with pytest.raises(BadCall, match="only text content"):
        parse_chat({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    with pytest.raises(BadCall, match="n must be 1"):
        parse_chat({"messages": [{"role": "user", "content": "x"}], "n": 2})
    with pytest.raises(BadCall, match="temperature must be a number"):
        parse_chat({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})
    with pytest.raises(BadCall, match="not supported in a user turn"):
        parse_messages({"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 4})
    # Fields the template does not use are dropped, so an SDK's echo equals the reply as given.
    assert normal_message({"role": "assistant", "content": None, "refusal": None, "audio": None,
                           "tool_calls": [{"id": "c", "type": "function",
                                           "function": {"name": "bash", "arguments": "{}"}}]}, "m") == \
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                            "function": {"name": "bash", "arguments": "{}"}}]}


async def test_connections_are_capped_per_episode(served) -> None:
    import asyncio

    from t1.gateway.server import MAX_CONNECTIONS

    url, _, _ = served
    host, port = url.removeprefix("http://").split(":")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(MAX_CONNECTIONS)]
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection(host, int(port))
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once
    for _, w in [*held, (reader, writer)]:
        w.close()
    await asyncio.sleep(0.2)
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
        assert [m.id async for m in client.models.list()] == ["t1"]  # served again once they are gone


async def test_a_segment_start_without_a_generation_is_not_counted(renderers) -> None:
    renderer = next(iter(renderers.values()))
    sess, _ = session(renderer, ["ok"])
    sess._max_context = 200
    await sess.complete(ChatCall(({"role": "user", "content": "u"},)))
    with pytest.raises(BadCall, match="context_length_exceeded"):  # starts a segment, gets no generation
        await sess.complete(ChatCall(({"role": "user", "content": "long " * 400},)))
    await sess.complete(ChatCall(({"role": "user", "content": "v"},)))
    segments, drift, _ = sess.segments()
    assert dict(sess.causes) == {"first": 1, "no_reply": 1} and len(segments) == 2 and drift == 0


def test_tool_renderers_are_shared_and_bounded(renderers) -> None:
    from t1.gateway.renderers import ToolRenderers

    cache = ToolRenderers(next(iter(renderers.values())), max_entries=2)
    tools = [(dict(TOOLS[0], function={**TOOLS[0]["function"], "name": f"t{i}"}),) for i in range(3)]
    first, _ = cache.get(tools[0])
    assert cache.get(tools[0])[0] is first  # made once, shared
    cache.get(tools[1])
    cache.get(tools[2])  # the least recently used (tools[0]) leaves
    assert cache.get(tools[0])[0] is not first
    assert "t2" in cache.get(tools[2])[0].render([{"role": "user", "content": "x"}], True)
