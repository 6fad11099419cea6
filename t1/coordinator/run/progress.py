"""Progress on the console: a live rich display on a terminal, plain lines otherwise (CI, pipes: no escape codes).

It reads run status (stage, trainer step, episodes), the training episodes' tallies and the eval job in
progress; it owns nothing and changes nothing. Each stage change prints one line ("t1: stage ...");
on a terminal the live bars show trainer step of N and the running eval with solve rate so far and an
ETA, and log records are printed above them so the two do not tear each other; without a terminal a
progress line is printed when something moved (at most every `line_every_s`; unchanged, every ten times that). The
lines are records of the `t1.console` logger: the
terminal shows them even when it is quiet, and the log file keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from t1.v1 import coordinator_pb2 as cpb

# Stage and progress lines: the quiet console shows this logger's records (t1.logsetup), the log file keeps them.
say = logging.getLogger("t1.console")


@dataclass(frozen=True, slots=True)
class EvalProgress:
    label: str
    finished: int
    total: int
    resolved: int = 0   # of the finished attempts that were scored (infra errors are not)
    scored: int = 0


def eta_s(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left at the pace so far (pure); None before the first unit is done or without a total."""
    if done <= 0 or total <= 0 or elapsed_s <= 0:
        return None
    return max(0.0, elapsed_s * (total - done) / done)


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA -"
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"ETA {h}h{m:02d}m" if h else f"ETA {m}m{s:02d}s"


def _rate(resolved: float, scored: float) -> str:
    return f"solve rate {resolved / scored:.2f} of {int(scored)}" if scored else "solve rate -"


def progress_line(st: cpb.RunStatus, total_steps: int, training: Mapping[str, float], ev: EvalProgress | None,
                  eta: float | None) -> str:
    """One plain line of progress (pure): the eval in progress, else the trainer and its episodes."""
    if ev is not None:
        return (f"{st.stage}: {ev.label} {ev.finished}/{ev.total} attempts, {_rate(ev.resolved, ev.scored)}"
                f" so far, {format_eta(eta)}")
    return (f"{st.stage}: trainer step {st.trainer_step}/{total_steps}, {st.finished_episodes} episodes "
            f"({st.active_episodes} running), training "
            f"{_rate(training.get('resolved', 0), training.get('episodes', 0))}"
            f", {format_eta(eta)}")


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


@dataclass(slots=True)
class _Pace:
    """Where the current unit of work (a stage's trainer steps, an eval job's attempts) started."""

    key: str = ""
    t0: float = 0.0
    done0: int = 0

    def eta(self, key: str, done: int, total: int) -> float | None:
        now = time.monotonic()
        if key != self.key:
            self.key, self.t0, self.done0 = key, now, done
        return eta_s(done - self.done0, total - self.done0, now - self.t0)


class ProgressView:
    """`await run()` until cancelled."""

    def __init__(self, status: Callable[[], cpb.RunStatus], current_eval: Callable[[], EvalProgress | None],
                 total_steps: int | Callable[[], int], training: Callable[[], Mapping[str, float]] | None = None,
                 every_s: float = 1.0, line_every_s: float = 30.0, console: Console | None = None) -> None:
        self._status = status
        self._eval = current_eval
        # a callable: the plan changes when SFT ends before its cap (steered SFT)
        self._total = total_steps if callable(total_steps) else (lambda: total_steps)
        self._training = training or dict
        self._every_s = every_s
        self._line_every_s = line_every_s
        self._console = console or Console(stderr=True)
        self._stage = ""
        self._pace = _Pace()

    def _snapshot(self) -> tuple[cpb.RunStatus, EvalProgress | None, str]:
        """Status and eval now; prints the stage line when the stage changed."""
        st, ev = self._status(), self._eval()
        if st.stage != self._stage:
            self._stage = st.stage
            say.info("t1: stage %s%s", st.stage, f" ({ev.label}, {ev.total} attempts)" if ev is not None else "")
        if ev is not None:
            eta = self._pace.eta(f"eval {ev.label}", ev.finished, ev.total)
        else:
            eta = self._pace.eta(f"steps {st.stage}", st.trainer_step, self._total())
        return st, ev, progress_line(st, self._total(), self._training(), ev, eta)

    async def run(self) -> None:
        if not self._console.is_terminal:
            last, said = 0.0, ""
            while True:
                *_, line = self._snapshot()
                now, news = time.monotonic(), line.rsplit(", ETA", 1)[0]
                # a line when something moved (at most every line_every_s), else a heartbeat now and then
                if now - last >= self._line_every_s and (news != said or now - last >= 10 * self._line_every_s):
                    last, said = now, news
                    say.info("t1: %s", line)
                await asyncio.sleep(self._every_s)
        columns = (TextColumn("{task.description:<14}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn())
        with _logs_through(self._console), Progress(*columns, console=self._console, refresh_per_second=4,
                                                     redirect_stdout=False, redirect_stderr=False) as progress:
            steps = progress.add_task("trainer steps", total=self._total() or None, info="")
            evals: dict[str, TaskID] = {}
            while True:
                self._refresh(progress, steps, evals)
                await asyncio.sleep(self._every_s)

    def _refresh(self, progress: Progress, steps: TaskID, evals: dict[str, TaskID]) -> None:
        st, ev, _ = self._snapshot()
        tr = self._training()
        info = (f"{st.stage} · v{st.policy_version} · {st.finished_episodes} episodes ({st.active_episodes} running)"
                f" · training {_rate(tr.get('resolved', 0), tr.get('episodes', 0))}")
        total = self._total()
        progress.update(steps, total=total or None, completed=min(st.trainer_step, total or st.trainer_step), info=info)
        if ev is not None:
            if ev.label not in evals:
                evals[ev.label] = progress.add_task(ev.label, total=ev.total, info="")
            progress.update(evals[ev.label], completed=ev.finished, total=ev.total,
                            info=f"attempts · {_rate(ev.resolved, ev.scored)}")
