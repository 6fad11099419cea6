"""The agent shell's working directory and exported variables: probed after a turn, restored in a new shell.

A resumed episode (t1/agent/resume_point.py) continues in its sandbox with a new shell: the
sandbox's files and processes are as the agent left them, but a shell's own state died with the
old connection. After a turn whose commands may have changed that state the journaled episode
probes the shell once (`PROBE`: `$PWD` quoted by bash's own `%q` and `export -p`, bash's
re-executable listing of every exported variable) and journals what it found when it changed; the
new shell runs `restore()`'s script: every exported variable it started with is unset, the
recorded ones are exported again, and the recorded directory is entered.

Which turns may change it (`StateWatch`): a program the shell runs is a child process and cannot
touch the shell's variables or directory; only the shell's own words can: an assignment (any `=`),
a builtin that sets, exports, reads or unsets variables or moves the directory, sourcing a file,
`eval`, `exec`, arithmetic, a `for` loop's variable. `may_change_state` reads a command's text
for those words, erring towards yes (a `=` inside an argument counts); once the episode has defined
a function or an alias (a name that can stand for any of them), set a trap or switched a shell
option or builtin, every later turn is probed. A builtin spelled with quotes or escapes (`ex''port`)
is not seen: like the probe itself, this is the agent's own state, and hiding it from the journal
only costs the agent its variables after a resume. Most turns of an agent (listing,
reading, building, testing) run programs only and cost no probe: a second round trip through the
sandbox's SSH connection in every turn was about a tenth of the coordinator's CPU at 10,000 episodes.

What cannot be restored: shell functions, aliases, `set`/`shopt` options, unexported variables,
traps, the directory stack, and the shell's jobs (background processes keep running, reparented,
but `jobs`, `%1` and `wait` no longer see them). The probe runs in the agent's own shell, so
what it reports is whatever the agent's shell says (a policy can redefine `builtin`): that costs
nothing but its own state, which is restored into the same sandbox as the same user. A probe
whose output is cut by the output cap records the directory only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from t1.sandbox.types import CommandResult, SandboxLost, Shell

log = logging.getLogger(__name__)

PROBE = r"""\builtin printf 'T1CWD %q\n' "$PWD"; \builtin export -p"""
PROBE_TIMEOUT_S = 10.0
_CWD = "T1CWD "


_STATE_WORDS = re.compile(
    r"=|\(\(|\$\[|(?<![\w.-])(?:export|declare|typeset|local|readonly|unset|read|readarray|mapfile|printf|let"
    r"|getopts|wait|for|select|source|eval|exec|fc|set|builtin|command|cd|pushd|popd)(?![\w.-])"
    r"|(?:^|[;&|({`\n!]|(?<![\w.-])(?:then|do|else|if|while|until|time))\s*\.\s", re.MULTILINE)  # `.` as a command
# After these, a later command's words no longer say what it does: a function's or alias's name, a trap that runs on
# every command, an option that turns a bare directory name into `cd`, a builtin switched off.
_STICKY = re.compile(r"\(\s*\)|(?<![\w.-])(?:function|alias|trap|shopt|enable)(?![\w.-])")


def may_change_state(command: str) -> bool:
    """Whether `command`, run by the shell, may change its exported variables or directory (erring towards yes)."""
    return _STATE_WORDS.search(command) is not None or _STICKY.search(command) is not None


@dataclass(slots=True)
class StateWatch:
    """Which turns to probe: those whose commands may change the shell's state; every turn once the episode has
    defined a function or an alias, set a trap or switched a shell option or builtin (`_STICKY`)."""

    sticky: bool = field(default=False)

    def wants_probe(self, commands: list[str]) -> bool:
        if not self.sticky and any(_STICKY.search(c) for c in commands):
            self.sticky = True
        return self.sticky or any(may_change_state(c) for c in commands)


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
