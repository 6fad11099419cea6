"""One call of the policy for a turn: exact tokens from a GenerateFn, or text from a chat endpoint.

A chat endpoint (ChatGenerateFn with `text_level`) gets the conversation as messages and answers with
text; the turn's ids are then T1's tokenization of that text, closed with the end-of-turn tokens, with
NaN logprobs and no routing: good for evals, never for training (the config refuses it).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from t1.inference.types import (
    ChatGenerateFn,
    ChatReply,
    ChatRequest,
    GenerateFn,
    GenerateRequest,
    GenerateResult,
)
from t1.tito import ChatRenderer


def is_text_level(generate: GenerateFn) -> bool:
    """A chat endpoint that answers with text (a ChatGenerateFn whose `text_level` is true). Read as an attribute,
    not by `isinstance` against the protocol: that walks the protocol's members on every call (every turn)."""
    return getattr(generate, "text_level", False) is True and callable(getattr(generate, "chat", None))


def text_result(reply: ChatReply, renderer: ChatRenderer) -> GenerateResult:
    """A chat reply as a turn of the buffer: T1's tokens of the server's text, closed, no logprobs."""
    ids = np.asarray([*renderer.encode(reply.text), *renderer.end_of_turn_ids], np.int32)
    return GenerateResult(ids, np.full(len(ids), np.nan, np.float32), reply.finish_reason, 0,
                          np.zeros(len(ids), np.int32), None)


async def call_policy(generate: GenerateFn, request: GenerateRequest, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None, renderer: ChatRenderer
                      ) -> tuple[GenerateResult, str | None]:
    """The turn's result, and the server's text when the policy answers with text (else None)."""
    if not is_text_level(generate):
        return await generate(request), None
    chat = cast(ChatGenerateFn, generate)
    reply = await chat.chat(ChatRequest(request.session_id, tuple(messages), tools, request.sampling))
    return text_result(reply, renderer), reply.text
