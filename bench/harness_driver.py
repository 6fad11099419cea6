"""The harnesses of bench/peer_turn.py's `gateway` variant, in a process of their own (their CPU is not the
coordinator's): one OpenAI-style harness loop per gateway port, each call carrying the whole conversation
(the opening, every reply as the gateway gave it, a tool result per tool call), as harnesses do.

    python -m bench.harness_driver --ports-file PORTS.json --key KEY
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import httpx

from t1.agent.formats import FormatName, get_format

OBSERVATION = ("total 48\ndrwxr-xr-x 1 root root 4096 Jan  1 00:00 .\n-rw-r--r-- 1 root root  812 Makefile\n"
               "-rw-r--r-- 1 root root 2210 main.c\n[exit code 0]")


async def harness(client: httpx.AsyncClient, port: int, key: str, instruction: str, max_tokens: int) -> None:
    fmt = get_format(FormatName.TOOL_CALLS)
    messages = fmt.first_messages(instruction)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    while True:
        resp = await client.post(url, headers={"authorization": f"Bearer {key}"},
                                 json={"model": "t1", "messages": messages, "tools": fmt.tools, "max_tokens": max_tokens})
        resp.raise_for_status()
        reply = resp.json()["choices"][0]["message"]
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": OBSERVATION} for c in calls] or \
            [{"role": "user", "content": "Use the bash tool."}]


async def main_async(args: argparse.Namespace) -> None:
    ports = json.loads(Path(args.ports_file).read_text())
    limits = httpx.Limits(max_connections=len(ports), max_keepalive_connections=len(ports))
    async with httpx.AsyncClient(limits=limits, timeout=600.0) as client:
        await asyncio.gather(*(harness(client, p, args.key, args.instruction, args.max_tokens) for p in ports))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ports-file", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--instruction", default="Fix the build.")
    p.add_argument("--max-tokens", type=int, default=416)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
