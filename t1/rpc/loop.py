"""Run the main coroutine on uvloop where it is installed, else on the default asyncio loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
