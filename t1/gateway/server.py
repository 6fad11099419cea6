"""The gateway's HTTP/1.1 server for one episode: its routes, its key, on sockets T1 hands it.

    GET  /v1/models                 the one model (OpenAI list form)
    POST /v1/chat/completions       OpenAI Chat Completions (tools; stream or not)
    POST /v1/messages               Anthropic Messages (tools; stream or not)

Every request needs the episode's key (`Authorization: Bearer KEY` or `x-api-key: KEY`, compared in
constant time); a missing or wrong key is 401, any other path 404, both counted; at most
MAX_CONNECTIONS at once. There is nothing
else on it: no other episode, no weights, no trainer, no metrics. The socket is a loopback port
inside the episode's own sandbox (`t1.sandbox.loopback_port`), so nothing outside that sandbox reaches it.
HTTP is parsed by h11; a request body is capped (`MAX_BODY_BYTES`), and the server keeps no state of
its own beyond the session it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
from collections.abc import Iterable
from typing import Any

import h11

from t1.gateway import anthropic_api, openai_api
from t1.gateway.call import BadCall, ChatCall
from t1.gateway.session import GatewayInferenceFailed, GatewaySession
from t1.metrics import registry as m

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 << 20
MAX_HEADER_BYTES = 64 << 10
MAX_CONNECTIONS = 32  # per episode: a harness cannot hold the coordinator's descriptors
OFFLOAD_JSON_BYTES = 256 << 10  # bodies past this are parsed on a worker thread, not the event loop
READ_BYTES = 1 << 16
CLOSE_GRACE_S = 2.0
_JSON = [("content-type", "application/json")]
_SSE = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]


class _Reply:
    """A response: status, headers and a body (bytes, or chunks sent as they come)."""

    def __init__(self, status: int, body: bytes | Iterable[bytes], headers: list[tuple[str, str]]) -> None:
        self.status, self.body, self.headers = status, body, headers


def _json(status: int, obj: Any) -> _Reply:
    return _Reply(status, json.dumps(obj).encode(), _JSON)


class GatewayServer:
    """Serves one GatewaySession on the sockets given to `serve`."""

    def __init__(self, session: GatewaySession, key: str, model_name: str) -> None:
        if len(key) < 16:
            raise ValueError("a gateway key needs at least 16 characters")
        self.session = session
        self._key = key.encode()
        self.model = model_name
        self._servers: list[asyncio.Server] = []
        self._conns: set[asyncio.Task[None]] = set()
        self.refused: dict[str, int] = {}

    async def serve(self, sock: socket.socket) -> None:
        """Start answering on a listening socket (the server owns it from now on)."""
        sock.setblocking(False)
        self._servers.append(await asyncio.start_server(self._connection, sock=sock, limit=READ_BYTES))

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._conns):
            task.cancel()
        for server in self._servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), CLOSE_GRACE_S)
        self._servers.clear()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= MAX_CONNECTIONS:
            self._refuse("connections")
            writer.close()
            return
        self._conns.add(task)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        try:
            while await self._one_request(conn, reader, writer):
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # close(): the episode is over, a call still in flight is dropped
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _next(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await reader.read(READ_BYTES))

    async def _one_request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is done."""
        try:
            event = await self._next(conn, reader)
        except h11.RemoteProtocolError as exc:
            await self._send(conn, writer, _json(400, openai_api.error_body(400, f"bad HTTP: {exc}")))
            return False
        if not isinstance(event, h11.Request):
            return False
        body = bytearray()
        while True:
            part = await self._next(conn, reader)
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > MAX_BODY_BYTES:
                    await self._send(conn, writer, _json(413, openai_api.error_body(413, "request body too large")))
                    return False
            elif isinstance(part, h11.EndOfMessage):
                break
            else:
                return False
        reply = await self._answer(
            event.method.decode(),
            event.target.decode("latin-1").split("?")[0],
            dict((k.decode().lower(), v.decode("latin-1")) for k, v in event.headers),
            bytes(body),
        )
        await self._send(conn, writer, reply)
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, reply: _Reply) -> None:
        if conn.our_state is not h11.SEND_RESPONSE:
            return
        headers = list(reply.headers)
        if isinstance(reply.body, bytes):
            headers.append(("content-length", str(len(reply.body))))
        head = conn.send(h11.Response(status_code=reply.status, headers=headers)) or b""
        if isinstance(reply.body, bytes):  # one write: head, body and end together
            writer.write(head + (conn.send(h11.Data(data=reply.body)) or b"") + (conn.send(h11.EndOfMessage()) or b""))
            await writer.drain()
            return
        writer.write(head)
        for chunk in reply.body:
            writer.write(conn.send(h11.Data(data=chunk)) or b"")
            await writer.drain()
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        m.GATEWAY_REFUSED.labels(reason=reason).inc()

    def _authorised(self, headers: dict[str, str]) -> bool:
        given = headers.get("x-api-key", "")
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        return bool(given) and hmac.compare_digest(given.encode(), self._key)

    async def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> _Reply:
        anthropic = path.rstrip("/").endswith("/messages")
        errors = anthropic_api.error_body if anthropic else openai_api.error_body
        if not self._authorised(headers):
            self._refuse("key")
            return _json(401, errors(401, "missing or wrong key for this episode's gateway"))
        route = path.rstrip("/")
        if method == "GET" and route in ("/v1/models", "/models", f"/v1/models/{self.model}"):
            models = openai_api.models_body(self.model)
            return _json(200, models if route.endswith("models") else models["data"][0])
        if method != "POST" or route not in ("/v1/chat/completions", "/chat/completions", "/v1/messages"):
            self._refuse("path")
            return _json(404, errors(404, f"{method} {path}: not here (this gateway answers /v1/models, "
                                          "/v1/chat/completions and /v1/messages)"))
        try:
            payload = json.loads(body or b"null") if len(body) < OFFLOAD_JSON_BYTES else \
                await asyncio.to_thread(json.loads, body)
            call = anthropic_api.parse_messages(payload) if anthropic else openai_api.parse_chat(payload)
            return await self._complete(call, payload, anthropic)
        except json.JSONDecodeError as exc:
            self._refuse("bad_request")
            return _json(400, errors(400, f"the request body is not JSON: {exc}"))
        except BadCall as exc:
            self._refuse("bad_request")
            return _json(400, errors(400, str(exc)))
        except GatewayInferenceFailed as exc:
            return _json(503, errors(503, f"inference failed: {exc}"))
        except Exception as exc:  # a bug: loud in T1's log, a 500 to the harness, never a hung connection
            log.exception("gateway %s: %s %s failed", self.session.episode_id, method, path)
            self._refuse("error")
            return _json(500, errors(500, f"internal error: {type(exc).__name__}: {exc}"))

    async def _complete(self, call: ChatCall, payload: dict[str, Any], anthropic: bool) -> _Reply:
        done = await self.session.complete(call)
        model = call.model or self.model
        if anthropic:
            if call.stream:
                return _Reply(200, anthropic_api.message_events(done, model), _SSE)
            return _json(200, anthropic_api.message_body(done, model))
        if call.stream:
            usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            return _Reply(200, openai_api.completion_chunks(done, model, usage), _SSE)
        return _json(200, openai_api.completion_body(done, model))
