"""The sandbox service's control wire (pure but for the socket): JSON lines, requests, socket paths."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from t1.sandbox.types import SandboxRequest

MAX_LINE = 16 << 20
"""The longest control line either side reads (a `list` of 10,000 sandboxes is about 170 KB)."""
UNIX_PATH_MAX = 107
"""sun_path holds 108 bytes with its terminating NUL."""


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next JSON object, or None at end of stream; ValueError for a line that is not one."""
    line = await reader.readline()
    if not line:
        return None
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError(f"control message is not a JSON object: {line[:200]!r}")
    return message


async def write_message(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


def request_to_json(request: SandboxRequest) -> dict[str, Any]:
    """What a local sandbox uses of a request (image and build context are other providers')."""
    return {"allow_network": request.allow_network, "cpus": request.cpus, "memory_mb": request.memory_mb,
            "storage_mb": request.storage_mb, "env": [list(kv) for kv in request.env]}


def request_from_json(data: object) -> SandboxRequest:
    """The request `request_to_json` wrote; ValueError naming the field that is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"create: 'request' must be a JSON object, got {type(data).__name__}")
    env = data.get("env", [])
    if not isinstance(env, list) or not all(
        isinstance(kv, list) and len(kv) == 2 and all(isinstance(x, str) for x in kv) for kv in env
    ):
        raise ValueError(f"create: 'env' must be a list of [name, value] strings, got {env!r}")
    for key in ("cpus", "memory_mb", "storage_mb"):
        if data.get(key) is not None and not isinstance(data[key], int | float):
            raise ValueError(f"create: {key!r} must be a number or null, got {data[key]!r}")
    return SandboxRequest(allow_network=bool(data.get("allow_network", False)), cpus=data.get("cpus"),
                          memory_mb=data.get("memory_mb"), storage_mb=data.get("storage_mb"),
                          env=tuple((k, v) for k, v in env))


@contextlib.contextmanager
def unix_path(path: Path) -> Iterator[str]:
    """A name for binding or connecting to the unix socket `path` that fits sun_path: the path itself, or,
    for a deep run dir, the same file through a descriptor of its folder (/proc/self/fd/N/NAME)."""
    if len(os.fsencode(str(path))) <= UNIX_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        short = f"/proc/self/fd/{fd}/{path.name}"
        if len(os.fsencode(short)) > UNIX_PATH_MAX:
            raise ValueError(f"socket name {path.name!r} is too long for a unix socket")
        yield short
    finally:
        os.close(fd)


def answers(path: Path) -> bool:
    """Whether a process serves the unix socket `path` (blocking; a connect, closed at once)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with unix_path(path) as name:
            probe.connect(name)
        return True
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        probe.close()
