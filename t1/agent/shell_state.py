"""The agent shell's working directory and exported variables: probed after a turn, restored in a new shell.

A resumed episode (t1/agent/resume_point.py) continues in its sandbox with a new shell: the
sandbox's files and processes are as the agent left them, but a shell's own state died with the
old connection. After each turn that ran a command the journaled episode probes the shell once
(`PROBE`: `$PWD` quoted by bash's own `%q` and `export -p`, bash's re-executable listing of every
exported variable) and journals what it found when it changed; the new shell runs `restore()`'s
script: every exported variable it started with is unset, the recorded ones are exported again,
and the recorded directory is entered.

What cannot be restored: shell functions, aliases, `set`/`shopt` options, unexported variables,
traps, the directory stack, and the shell's jobs (background processes keep running, reparented,
but `jobs`, `%1` and `wait` no longer see them). The probe runs in the agent's own shell, so
what it reports is whatever the agent's shell says (a policy can redefine `builtin`): that costs
nothing but its own state, which is restored into the same sandbox as the same user. A probe
whose output is cut by the output cap records the directory only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from t1.sandbox.types import CommandResult, SandboxLost, Shell

log = logging.getLogger(__name__)

PROBE = r"""\builtin printf 'T1CWD %q\n' "$PWD"; \builtin export -p"""
PROBE_TIMEOUT_S = 10.0
_CWD = "T1CWD "


@dataclass(frozen=True, slots=True)
class ShellState:
    """What a new shell takes over: the directory (shell-quoted) and the `export -p` listing ("" when unknown)."""

    cwd_quoted: str
    exports: str = ""

    def as_record(self) -> list[str]:
        return [self.cwd_quoted, self.exports]

    @classmethod
    def from_record(cls, record: object) -> ShellState | None:
        if not isinstance(record, list | tuple) or len(record) != 2 or not all(isinstance(x, str) for x in record):
            return None
        return cls(record[0], record[1]) if record[0] else None


def parse_probe(result: CommandResult) -> ShellState | None:
    """The state a PROBE reported, or None when it did not run as asked (timed out, failed, no directory line)."""
    if result.timed_out or result.exit_code != 0 or result.shell_restarted:
        return None
    first, _, rest = result.output.partition("\n")
    if not first.startswith(_CWD) or len(first) == len(_CWD):
        return None
    return ShellState(first[len(_CWD):], "" if result.truncated else rest)


def restore(state: ShellState) -> str:
    """Shell text that gives a fresh shell the recorded exported variables and directory."""
    parts = []
    if state.exports:
        parts.append("\\builtin unset -v $(\\builtin compgen -e) 2>/dev/null")
        parts.append(state.exports.rstrip("\n"))
    parts.append(f"\\builtin cd -- {state.cwd_quoted}")
    return "\n".join(parts) + "\n"


async def probe(shell: Shell) -> ShellState | None:
    """The shell's state now, or None when the probe did not answer as asked (best effort: a resume then keeps the
    last state it has). A lost sandbox propagates."""
    try:
        return parse_probe(await shell.run(PROBE, PROBE_TIMEOUT_S))
    except SandboxLost:
        raise
    except Exception as exc:  # the probe must never end the agent's episode
        log.debug("shell probe failed: %s", exc)
        return None
