"""How the previous coordinator on a run dir ended, so that the eval jobs it was running are not
resumed into the same death forever.

`CrashWatch.arm` creates <run_dir>/logs/crash.txt and points Python's faulthandler at it; a clean
stop (`disarm`) removes it. So the next coordinator on the run dir (`previous`) finds:

- no file: the last process stopped cleanly (`ExitKind.CLEAN`);
- a traceback: it died of a fatal signal (SIGSEGV, SIGABRT from a native library's failed
  allocation, SIGBUS, SIGFPE, SIGILL), which faulthandler wrote before the process died
  (`ExitKind.CRASHED`): the jobs it was running are marked FAILED with the crash named;
- the file, empty: it died without a word (`ExitKind.KILLED`): kill -9 by an operator, the OOM
  killer, a power cut, an exception that skipped the clean stop. One such death is no proof
  against a job (an operator's kill -9 must not fail it), so a job running at it is resumed, at
  most `coordinator.eval.max_unclean_resumes` times (`t1.coordinator.evals.eval_jobs`); the next such death
  marks it FAILED naming why.
"""

from __future__ import annotations

import faulthandler
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TextIO

CRASH_FILE = "crash.txt"
SHOWN_CHARS = 600  # of the traceback, in a job's error


class ExitKind(StrEnum):
    CLEAN = "clean"
    CRASHED = "crashed"
    """A fatal signal, its traceback written."""
    KILLED = "killed"
    """Gone without a word: SIGKILL (an operator, the OOM killer), power lost, a stop that skipped the clean end."""


@dataclass(frozen=True, slots=True)
class PreviousExit:
    """How the last coordinator on the run dir ended; `traceback`: the start of a CRASHED one's."""

    kind: ExitKind
    traceback: str = ""

    @property
    def unclean(self) -> bool:
        return self.kind is not ExitKind.CLEAN


CLEAN_EXIT = PreviousExit(ExitKind.CLEAN)


class CrashWatch:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "logs" / CRASH_FILE
        self._file: TextIO | None = None
        self._was_enabled = False

    def previous(self) -> PreviousExit:
        """How the predecessor on this run dir ended (read before `arm`)."""
        try:
            text = self.path.read_text(errors="replace").strip()
        except FileNotFoundError:
            return CLEAN_EXIT
        if not text:
            return PreviousExit(ExitKind.KILLED)
        return PreviousExit(ExitKind.CRASHED, text[:SHOWN_CHARS])

    def arm(self) -> None:
        """From now on the file says this process runs; a fatal signal leaves its traceback there."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._was_enabled = faulthandler.is_enabled()
        self._file = self.path.open("w")
        self._file.flush()
        faulthandler.enable(self._file, all_threads=True)

    def disarm(self) -> None:
        """A clean end: nothing crashed, the file goes."""
        if self._file is None:
            return
        faulthandler.disable()
        if self._was_enabled:  # whoever had it on before (pytest, PYTHONFAULTHANDLER) gets it back on stderr
            faulthandler.enable(sys.__stderr__ or sys.stderr, all_threads=True)
        self._file.close()
        self._file = None
        if self.path.stat().st_size == 0:
            self.path.unlink()
