"""Run the main coroutine on uvloop where it is installed, else on the default asyncio loop.

Before the loop starts, every object that exists (imported modules, config, compiled templates)
is moved out of the collector's reach with `gc.freeze()`: they live as long as the process, and a
full collection would otherwise walk them all while the event loop stands still. A service that
builds long-lived state inside the loop calls `freeze_long_lived()` once it is built.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def freeze_long_lived() -> None:
    """Exempt everything alive now from future collections (collect first, so no garbage is frozen)."""
    gc.collect()
    gc.freeze()


def run(main: Coroutine[Any, Any, T]) -> T:
    freeze_long_lived()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
