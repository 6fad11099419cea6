"""The harnesses of bench/peer_turn.py's `gateway` variant, in a process of their own (their CPU is not the
coordinator's): one OpenAI-style harness loop per gateway port, each call carrying the whole conversation
(the opening, every reply as the gateway gave it, a tool result per tool call), as harnesses do.

Each harness holds one keep-alive HTTP/1.1 connection of its own, as a harness process does, spoken on
asyncio streams: a load generator, not a client library. (An earlier driver shared one httpx client among
all harnesses; its connection pool scans every connection on each request and close, so at 1,000
sessions it, not the gateway, was the bound: 5.4 requests/s.)

    python -m bench.harness_driver --ports-file PORTS.json --key KEY
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from t1.agent.formats import FormatName, get_format

OBSERVATION = ("total 48\ndrwxr-xr-x 1 root root 4096 Jan  1 00:00 .\n-rw-r--r-- 1 root root  812 Makefile\n"
               "-rw-r--r-- 1 root root 2210 main.c\n[exit code 0]")


class Connection:
    """One keep-alive HTTP/1.1 connection to a gateway (responses with a content-length only, as it sends)."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self._head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
                      f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n").encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, payload: dict[str, Any]) -> Any:
        if self._writer is None or self._reader is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        body = json.dumps(payload).encode()
        self._writer.write(self._head + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        length = {k.strip().lower(): v.strip() for k, v in fields.items()}.get("content-length")
        if length is None:
            raise RuntimeError(f"gateway :{self.port}: a response without content-length ({head[0]})")
        data = await self._reader.readexactly(int(length))
        if status != 200:
            raise RuntimeError(f"gateway :{self.port}: HTTP {status}: {data[:500]!r}")
        return json.loads(data)


async def harness(port: int, key: str, instruction: str, max_tokens: int) -> None:
    fmt = get_format(FormatName.TOOL_CALLS)
    messages = fmt.first_messages(instruction)
    conn = Connection(port, key)
    while True:
        reply = (await conn.post({"model": "t1", "messages": messages, "tools": fmt.tools,
                                  "max_tokens": max_tokens}))["choices"][0]["message"]
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": OBSERVATION} for c in calls] or \
            [{"role": "user", "content": "Use the bash tool."}]


async def main_async(args: argparse.Namespace) -> None:
    ports = json.loads(Path(args.ports_file).read_text())
    await asyncio.gather(*(harness(p, args.key, args.instruction, args.max_tokens) for p in ports))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ports-file", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--instruction", default="Fix the build.")
    p.add_argument("--max-tokens", type=int, default=416)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
