"""A hostile OpenAI-compatible endpoint, served for real on loopback by a raw asyncio HTTP server: replies of a
gigabyte (declared or streamed without end), more ids than max_tokens, and every kind of malformed body. Each is
refused naming what was wrong, read no further than a bound derived from the request, and parsed off the loop."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import psutil
import pytest

from t1.config.inference import InferencePoolConfig
from t1.inference.openai.openai_pool import EndpointUnavailable, OpenAIPool
from t1.inference.openai.openai_reply import PARSE_INLINE_BYTES, decode_reply, reply_byte_bound
from t1.inference.types import ChatRequest, GenerateRequest, SamplingParams

GiB = 1 << 30
Reply = Callable[[dict[str, Any]], AsyncIterator[bytes]]  # the request's JSON -> the raw HTTP response, in pieces


@asynccontextmanager
async def hostile(reply: Reply) -> AsyncIterator[tuple[str, dict[str, int]]]:
    """An HTTP/1.1 server on 127.0.0.1 answering every POST with `reply(body)`; yields (base url, counters)."""
    seen = {"requests": 0, "bytes_sent": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = json.loads(await reader.readexactly(length)) if length else {}
                seen["requests"] += 1
                async for piece in reply(body):
                    writer.write(piece)
                    seen["bytes_sent"] += len(piece)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        server.close()
        await server.wait_closed()


def fixed(body: bytes, status: str = "200 OK") -> Reply:
    async def reply(_: dict[str, Any]) -> AsyncIterator[bytes]:
        yield (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
        yield body
    return reply


def endless(declare: int | None) -> Reply:
    """A reply that claims `declare` bytes (None: chunked) and streams JSON-looking bytes until the peer leaves."""
    async def reply(_: dict[str, Any]) -> AsyncIterator[bytes]:
        chunk = b'{"choices": [{"text": "' + b"A" * (1 << 20)
        if declare is not None:
            yield f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {declare}\r\n\r\n".encode()
            while True:
                yield chunk
        yield b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        while True:
            yield f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    return reply


def completion(ids: list[int], logprobs: list[float] | None = None, finish: str = "stop") -> bytes:
    lp = [-0.5] * len(ids) if logprobs is None else logprobs
    return json.dumps({"choices": [{"text": "x", "token_ids": ids, "finish_reason": finish,
                                    "logprobs": {"token_logprobs": lp}}]}).encode()


def pool_of(url: str, api: str = "completions") -> OpenAIPool:
    cfg = InferencePoolConfig.model_validate({"retries": 1, "backoff_s": 0.0, "unhealthy_s": 0.0,
                                              "openai": [{"base_url": url, "model": "m", "api": api}]})
    return OpenAIPool(cfg, vocab_size=1000)


def turn(max_tokens: int = 64) -> GenerateRequest:
    return GenerateRequest("s", np.asarray([1, 2, 3], np.int32), SamplingParams(max_tokens=max_tokens))


def chat_turn(max_tokens: int = 64) -> ChatRequest:
    return ChatRequest("s", ({"role": "user", "content": "hi"},), sampling=SamplingParams(max_tokens=max_tokens))


async def _refused(reply: Reply, api: str = "completions", max_tokens: int = 64) -> tuple[str, dict[str, int]]:
    async with hostile(reply) as (url, seen):
        pool = pool_of(url, api)
        try:
            with pytest.raises(EndpointUnavailable) as err:
                await (pool(turn(max_tokens)) if api == "completions" else pool.chat(chat_turn(max_tokens)))
        finally:
            await pool.close()
    return str(err.value), seen


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("declare", [GiB, None], ids=["declared-1GiB", "chunked-endless"])
async def test_a_gigabyte_reply_is_refused_at_the_bound_of_the_request(api: str, declare: int | None) -> None:
    rss = psutil.Process().memory_info().rss
    message, seen = await _refused(endless(declare), api)
    bound = reply_byte_bound(64, 3 + 64) if api == "completions" else reply_byte_bound(64)
    assert f"bound of {bound}" in message, message
    # Two attempts (retries: 1), each read at most one 1 MiB piece past the bound (none when declared).
    assert seen["requests"] == 2
    assert psutil.Process().memory_info().rss - rss < 200 << 20


async def test_two_million_ids_for_64_tokens_are_refused() -> None:
    message, _ = await _refused(fixed(completion(list(range(1000)) * 2000)))
    assert "bound of" in message  # 16 MB of ids: past the byte bound, refused unread
    message, _ = await _refused(fixed(completion([7] * 65)))  # within the byte bound: counted
    assert "reply.choices[0].token_ids: 65 sampled ids for max_tokens 64" in message, message


async def test_ids_up_to_max_tokens_are_taken() -> None:
    async with hostile(fixed(completion([7] * 64))) as (url, _):
        pool = pool_of(url)
        try:
            result = await pool(turn(64))
        finally:
            await pool.close()
    assert result.token_ids.tolist() == [7] * 64


MALFORMED = {
    "not JSON": (b"<html>hello</html>", "the reply is not JSON"),
    "truncated JSON": (completion([1, 2])[:-5], "the reply is not JSON"),
    "invalid UTF-8": (b'{"choices": [{"text": "\xff\xfe"}]}', "the reply is not JSON"),
    "nested too deep": (b"[" * 60_000 + b"]" * 60_000, "nests too deep"),
    "a list, not an object": (b"[1, 2, 3]", "reply.choices: missing"),
    "no choices": (b"{}", "reply.choices: missing"),
    "choices not a list": (b'{"choices": 5}', "reply.choices: expected list, got int"),
    "two choices": (b'{"choices": [{}, {}]}', "reply.choices: expected one choice object, got 2"),
    "a choice not an object": (b'{"choices": ["x"]}', "reply.choices: expected one choice object"),
    "no text": (b'{"choices": [{"token_ids": [1]}]}', "reply.choices[0].text: missing"),
    "ids as strings": (completion(["1"]), "token_ids: expected a list of integers"),  # type: ignore[list-item]
    "ids as floats": (completion([1.5]), "token_ids: expected a list of integers"),  # type: ignore[list-item]
    "ids as booleans": (completion([True]), "token_ids: expected a list of integers"),
    "a negative id": (completion([-1]), "token_ids: ids must be in [0, 1000)"),
    "an id past the vocabulary": (completion([10**18]), "token_ids: ids must be in [0, 1000)"),
    "a logprob above 0": (completion([1], [0.5]), "every logprob must be a finite number <= 0"),
    "a NaN logprob": (completion([1], [float("nan")]), "every logprob must be a finite number <= 0"),
    "logprobs of another length": (completion([1, 2], [-1.0]), "expected 2 logprobs"),
    "an unknown finish reason": (completion([1], finish="exploded"), "finish_reason: expected one of"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_every_malformed_completion_is_named(name: str) -> None:
    body, expected = MALFORMED[name]
    message, seen = await _refused(fixed(body))
    assert expected in message, message
    assert seen["requests"] == 2  # retried once, then an infra error naming the cause


CHAT_MALFORMED = {
    "no message": (b'{"choices": [{"finish_reason": "stop"}]}', "reply.choices[0].message: missing"),
    "content a number": (b'{"choices": [{"message": {"content": 5}, "finish_reason": "stop"}]}',
                         "message.content: expected text or null"),
    "tool_calls not a list": (b'{"choices": [{"message": {"content": "", "tool_calls": {"a": 1}}, "finish_reason": '
                              b'"stop"}]}',
                              "message.tool_calls: expected a list"),
}


@pytest.mark.parametrize("name", sorted(CHAT_MALFORMED))
async def test_every_malformed_chat_reply_is_named(name: str) -> None:
    body, expected = CHAT_MALFORMED[name]
    message, _ = await _refused(fixed(body), "chat")
    assert expected in message, message


async def test_a_large_reply_is_parsed_off_the_event_loop() -> None:
    raw = json.dumps({"pad": "x" * (2 * PARSE_INLINE_BYTES)}).encode()
    assert await decode_reply(raw, lambda _: threading.current_thread() is not threading.main_thread())
    assert not await decode_reply(b"{}", lambda _: threading.current_thread() is not threading.main_thread())
