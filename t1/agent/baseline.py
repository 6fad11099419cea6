"""The process reward's baseline (passing verifiers before the agent's first turn), measured once per group.

The attempts of a group start from the same task in the same state, so the verifier run before their
first turns gives one answer: the first attempt to need it measures it in its own sandbox, the others
wait for that answer instead of running the verifier again (one run in about four of a training
episode's). The policy cannot touch it: it is measured before any of the group's turns. If the
measuring attempt fails or is cancelled, the next one measures in its own sandbox. A task whose set-up
is not deterministic wants a baseline per attempt: `reward.shared_baseline: false`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable


class SharedBaselines:
    """Group id -> its baseline (an asyncio future while the first attempt measures it); the last `keep` groups."""

    def __init__(self, keep: int = 4096) -> None:
        self._known: OrderedDict[str, asyncio.Future[int]] = OrderedDict()
        self._keep = keep
        self.measured = 0  # verifier runs made for baselines
        self.shared = 0    # baselines handed to an attempt without a run of its own

    async def get(self, group_id: str, measure: Callable[[], Awaitable[int]]) -> int:
        """The group's baseline: measured by this call if no attempt of the group has it or is measuring it."""
        while True:
            known = self._known.get(group_id)
            if known is None:
                return await self._measure(group_id, measure)
            try:
                value = await asyncio.shield(known)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if known.cancelled() and not (task is not None and task.cancelling()):
                    continue  # the measuring attempt failed: this one measures in its own sandbox
                raise
            self.shared += 1
            return value

    async def _measure(self, group_id: str, measure: Callable[[], Awaitable[int]]) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._known[group_id] = future
        try:
            value = await measure()
        except BaseException:
            if self._known.get(group_id) is future:
                del self._known[group_id]
            future.cancel()
            raise
        self.measured += 1
        future.set_result(value)
        while len(self._known) > self._keep:
            self._known.popitem(last=False)
        return value
