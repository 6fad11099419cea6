"""A small OpenAI-compatible server on loopback (starlette under uvicorn), following vLLM 0.32's contract.

It stands in for a hosted API or a `vllm serve` fleet where neither can run: the Bearer key, a
scripted fault per request (429 with retry-after, 500, a malformed body, a reply without token
ids), /v1/completions with token-id prompts and `return_token_ids` (sampled ids and logprobs chosen
by the test, routed experts as base64 `.npy` from `routed_experts_prompt_start`), /v1/chat/completions,
and the dev-mode weight endpoints (/pause, /collective_rpc, ...), recorded in order.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

Sampler = Callable[[list[int]], list[int]]          # prompt ids -> the ids it "samples"
ChatReplier = Callable[[list[dict[str, Any]]], dict[str, Any]]  # messages -> the reply message


def logprob_of(token: int) -> float:
    """The logprob the stand-in reports for a sampled token (deterministic, < 0)."""
    return -0.01 * (token % 7 + 1)


def experts_of(position: int, layer: int, num_experts: int, top_k: int) -> list[int]:
    """The experts the stand-in says position `position` was routed to in `layer` (distinct)."""
    return [(position + layer + j) % num_experts for j in range(top_k)]


@dataclass
class StandIn:
    """What the server does; tests change these fields between requests."""

    sampler: Sampler = lambda prompt: [1, 2, 3]
    chat: ChatReplier = lambda messages: {"role": "assistant", "content": "hi"}
    api_key: str = ""
    faults: list[str] = field(default_factory=list)  # one per request, in order: 429 | 500 | malformed | text_only
    retry_after: str = "0.2"
    moe: tuple[int, int, int] | None = None  # (layers, experts, top_k): return routed experts
    bad_routing_row: int | None = None       # this returned row gets a duplicate expert
    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    admin: list[tuple[str, Any]] = field(default_factory=list)
    sampled: list[list[int]] = field(default_factory=list)
    weight_version: str = "0"
    current: str = ""  # the fault of the request being answered

    def _fault(self, request: Request) -> Response | None:
        self.headers.append(dict(request.headers))
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        fault = self.faults.pop(0) if self.faults else ""
        self.current = fault
        if fault == "429":
            return JSONResponse({"error": {"message": "rate limited"}}, status_code=429,
                                headers={"retry-after": self.retry_after})
        if fault == "500":
            return PlainTextResponse("internal error", status_code=500)
        if fault == "malformed":
            return PlainTextResponse('{"choices": [', status_code=200, media_type="application/json")
        if fault == "missing_fields":
            return JSONResponse({"id": "x", "choices": [{"index": 0}]})
        return None

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(("completions", body))
        fault = self._fault(request)
        if fault is not None:
            return fault
        prompt = body["prompt"]
        ids = self.sampler(prompt)[: body.get("max_tokens", 16)]
        self.sampled.append(ids)
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": "stop",
                                  "logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                                               "token_logprobs": [logprob_of(t) for t in ids],
                                               "top_logprobs": None, "text_offset": []}}
        if self.current != "text_only":
            choice["token_ids"] = ids
            choice["prompt_token_ids"] = prompt
        else:  # a server that ignores return_token_ids and return_tokens_as_token_ids
            choice["logprobs"]["tokens"] = ["tok"] * len(ids)
        if self.moe is not None:
            choice["routed_experts"] = self._routing(len(prompt) + len(ids) - 1,
                                                     int(body.get("routed_experts_prompt_start", 0)))
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                             "choices": [choice],
                             "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                       "total_tokens": len(prompt) + len(ids)}})

    def _routing(self, num_positions: int, start: int) -> str:
        assert self.moe is not None
        layers, experts, top_k = self.moe
        rows = [[experts_of(p, layer, experts, top_k) for layer in range(layers)] for p in range(start, num_positions)]
        arr = np.asarray(rows, np.uint8).reshape(len(rows), layers, top_k)
        if self.bad_routing_row is not None and self.bad_routing_row < len(arr):
            arr[self.bad_routing_row, 0, :] = arr[self.bad_routing_row, 0, 0]
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode("ascii")

    async def chat_completions(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(("chat", body))
        fault = self._fault(request)
        if fault is not None:
            return fault
        message = self.chat(body["messages"])
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return JSONResponse({"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                             "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

    async def admin_call(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        self.admin.append((request.url.path, body if body is not None else dict(request.query_params)))
        if request.url.path == "/update_weight_version":
            self.weight_version = body["new_version"]
        return JSONResponse({"ok": True})

    def app(self) -> Starlette:
        admin = [Route(p, self.admin_call, methods=["POST"]) for p in
                 ("/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version")]
        return Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"]),
                                 Route("/v1/chat/completions", self.chat_completions, methods=["POST"]), *admin])


@asynccontextmanager
async def serve(standin: StandIn, dev_mode: bool = True) -> AsyncIterator[str]:
    """Run the stand-in on 127.0.0.1 (a free port) in this event loop; yields its base URL (…/v1)."""
    import uvicorn

    app = standin.app()
    if not dev_mode:
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "").startswith("/v1/")]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task
        sock.close()
