"""Children die with their parent: `python -m t1.coordinator.local.lifeline PARENT_PID -- ARGV...` arms the
parent-death signal, then becomes ARGV (same pid) with exec.

Linux keeps PR_SET_PDEATHSIG across exec, so when the coordinator dies, kill -9 included, the
kernel sends each child service SIGTERM: it stops the way an operator's SIGTERM stops it. If the
parent is already gone when the signal is armed, the child exits at once instead of starting.
Done in a tiny exec step rather than a preexec hook, which is unsafe in a threaded parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def lifeline_argv(argv: list[str]) -> list[str]:
    """`argv`, started so that it dies with this process."""
    return [sys.executable, "-m", "t1.coordinator.local.lifeline", str(os.getpid()), "--", *argv]


def main(args: list[str]) -> None:
    parent, sep, argv = args[0], args[1], args[2:]
    if sep != "--" or not argv:
        raise SystemExit("usage: python -m t1.coordinator.local.lifeline PARENT_PID -- ARGV...")
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            raise SystemExit(f"lifeline: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != int(parent):  # the parent died before the signal was armed
        raise SystemExit(1)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
