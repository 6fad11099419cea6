"""What a crashed coordinator left: a fatal signal's traceback in <run_dir>/logs/crash.txt, so that the
eval jobs it was running are not resumed into the same crash.

`CrashWatch.arm` points Python's faulthandler at the file: a fatal signal (SIGSEGV, SIGABRT from a
native library's failed allocation, SIGBUS, SIGFPE, SIGILL) writes every thread's traceback there
before the process dies. The next coordinator on the run dir reads it (`previous`) before it resumes
anything: the jobs that were running are marked FAILED with the crash named, instead of resuming
and crashing the process again. kill -9 (an operator, the OOM killer) leaves no file: those jobs
resume, as after any restart. A clean stop removes the empty file.
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path
from typing import TextIO

CRASH_FILE = "crash.txt"
SHOWN_CHARS = 600  # of the traceback, in a job's error


class CrashWatch:
    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "logs" / CRASH_FILE
        self._file: TextIO | None = None
        self._was_enabled = False

    def previous(self) -> str | None:
        """The traceback a crashed predecessor left (its start), or None when it did not crash."""
        try:
            text = self.path.read_text(errors="replace").strip()
        except FileNotFoundError:
            return None
        return text[:SHOWN_CHARS] if text else None

    def arm(self) -> None:
        """From now on a fatal signal leaves its traceback in the file (emptied here)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._was_enabled = faulthandler.is_enabled()
        self._file = self.path.open("w")
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
