"""Reading an OpenAI-compatible server's reply as an adversary might write it: bounded, and parsed off the loop.

A reply is streamed and refused once it passes a byte bound derived from the request
(`reply_byte_bound`): a server that answers a 64-token request with a gigabyte is a MalformedReply
after its first few hundred kilobytes, not a process that dies of it. A `Content-Length` over the
bound is refused before any byte is read. The JSON of a reply larger than PARSE_INLINE_BYTES is
decoded and checked in a worker thread, so one big reply does not stall the other episodes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from t1.inference.openai.openai_wire import MalformedReply
from t1.inference.routing_capture import MoeShape

T = TypeVar("T")

REPLY_BASE_BYTES = 64 << 10
"""The envelope of any reply: ids, usage, finish reason, the fields a server adds of its own."""
REPLY_BYTES_PER_TOKEN = 1024
"""Per token asked for: its id, its logprob in two or three forms, its text JSON-escaped (6 bytes a
character), a tool call's JSON escaped twice. vLLM's replies take under 200."""
ROUTING_BYTES_PER_VALUE = 11
"""Routed experts come as base64 of an `.npy` array: at most 8 bytes a value, 4/3 for base64."""
PARSE_INLINE_BYTES = 64 << 10
ERROR_BODY_BYTES = 4096
"""Read of an error reply: enough for its message."""


def reply_byte_bound(max_tokens: int, routed_positions: int = 0, moe: MoeShape | None = None) -> int:
    """The most bytes a well-formed reply to a request for `max_tokens` tokens can take (pure); routed
    experts for `routed_positions` positions of a model of shape `moe` add their own."""
    routing = 0 if moe is None else routed_positions * moe.num_layers * moe.top_k * ROUTING_BYTES_PER_VALUE
    return REPLY_BASE_BYTES + max(max_tokens, 1) * REPLY_BYTES_PER_TOKEN + routing


async def read_bounded(reply: httpx.Response, limit: int) -> bytes:
    """The body of a streamed reply, or MalformedReply naming the bound once it passes `limit` bytes."""
    declared = reply.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise MalformedReply(f"the reply declares {int(declared)} bytes, over the bound of {limit} "
                             "for this request")
    chunks: list[bytes] = []
    size = 0
    async for chunk in reply.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise MalformedReply(f"the reply passed the bound of {limit} bytes for this request "
                                 "(refused unread past it)")
        chunks.append(chunk)
    return b"".join(chunks)


async def error_text(reply: httpx.Response) -> str:
    """The start of an error reply's body, read no further."""
    data = b""
    async for chunk in reply.aiter_bytes():
        data += chunk
        if len(data) >= ERROR_BODY_BYTES:
            break
    return data[:ERROR_BODY_BYTES].decode("utf-8", "replace")


def _decode_then(raw: bytes, parse: Callable[[Any], T]) -> T:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise MalformedReply(f"the reply is not JSON ({exc}): {raw[:300]!r}") from None
    except RecursionError:
        raise MalformedReply("the reply nests too deep to be JSON of the API") from None
    return parse(body)


async def decode_reply(raw: bytes, parse: Callable[[Any], T]) -> T:
    """`parse(json of raw)`, in a worker thread when the reply is large; MalformedReply when it is not JSON."""
    if len(raw) <= PARSE_INLINE_BYTES:
        return _decode_then(raw, parse)
    return await asyncio.to_thread(_decode_then, raw, parse)
