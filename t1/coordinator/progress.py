"""Progress on the console: a live rich display on a terminal, a periodic log line otherwise.

It reads run status (stage, episodes, turns/s, trainer step, policy version, spool) and the eval
job in progress; it owns nothing and changes nothing. On a terminal, log records are printed
above the live bars so the two do not tear each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from t1.v1 import coordinator_pb2 as cpb

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EvalProgress:
    label: str
    finished: int
    total: int


def status_line(st: cpb.RunStatus, total_steps: int) -> str:
    """One line of run status (pure)."""
    return (f"{st.stage}: trainer step {st.trainer_step}/{total_steps}, policy v{st.policy_version}, "
            f"episodes {st.finished_episodes} done / {st.active_episodes} running, "
            f"{st.turns_per_second:.2f} turns/s, spool {st.spool_pending}, "
            f"infra {st.infra_failure_rate:.1%}")


class _ConsoleStream:
    """A file for logging.StreamHandler that prints through the live console."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def write(self, text: str) -> int:
        if text.strip():
            self._console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def _logs_through(console: Console) -> Iterator[None]:
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stderr]
    for h in handlers:
        h.setStream(_ConsoleStream(console))  # type: ignore[arg-type]
    try:
        yield
    finally:
        for h in handlers:
            h.setStream(sys.stderr)


class ProgressView:
    """`await run()` until cancelled."""

    def __init__(self, status: Callable[[], cpb.RunStatus], current_eval: Callable[[], EvalProgress | None],
                 total_steps: int, every_s: float = 1.0, log_every_s: float = 15.0,
                 console: Console | None = None) -> None:
        self._status = status
        self._eval = current_eval
        self._total_steps = total_steps
        self._every_s = every_s
        self._log_every_s = log_every_s
        self._console = console or Console(stderr=True)

    async def run(self) -> None:
        if not self._console.is_terminal:
            while True:
                await asyncio.sleep(self._log_every_s)
                log.info("progress: %s", status_line(self._status(), self._total_steps))
        columns = (TextColumn("{task.description:<14}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn())
        with _logs_through(self._console), Progress(*columns, console=self._console, refresh_per_second=4,
                                                     redirect_stdout=False, redirect_stderr=False) as progress:
            steps = progress.add_task("trainer steps", total=self._total_steps or None, info="")
            evals: dict[str, TaskID] = {}
            while True:
                self._refresh(progress, steps, evals)
                await asyncio.sleep(self._every_s)

    def _refresh(self, progress: Progress, steps: TaskID, evals: dict[str, TaskID]) -> None:
        st = self._status()
        info = (f"{st.stage} · v{st.policy_version} · {st.finished_episodes} episodes ({st.active_episodes} running)"
                f" · {st.turns_per_second:.2f} turns/s · spool {st.spool_pending}")
        progress.update(steps, completed=min(st.trainer_step, self._total_steps or st.trainer_step), info=info)
        ev = self._eval()
        if ev is not None:
            if ev.label not in evals:
                evals[ev.label] = progress.add_task(ev.label, total=ev.total, info="attempts")
            progress.update(evals[ev.label], completed=ev.finished, total=ev.total)
