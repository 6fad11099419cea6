"""The framed-shell protocol as pure functions: sentinels, the supervisor script, frame scanning and output capping.

A framed shell is two bash processes on the remote side. The *supervisor* reads length-prefixed
messages from the SSH channel's stdin and forwards command text to the *worker* (`bash
--noprofile --norc`, whose cwd, environment and jobs persist). After each command the worker
writes `"<exit> <%q-quoted cwd>\n"` to a status pipe (fd 4, closed for the command itself); the
supervisor's status reader turns it into the frame `"\n" + TOKEN + "<exit> <cwd>\n"` on the
channel; when the worker dies the supervisor prints `"\n" + TOKEN + "X<status>\n"` and exits.
TOKEN is random per shell and known only to the supervisor: it arrives as the first line of the
channel's stdin (never in an argv, an environment or the worker's input), so output the agent
prints cannot forge a frame. Where the sandbox offers an execute-only bash
(`t1.sandbox.isolation.supervisor_bin`, local sandboxes) the supervisor runs it and is not dumpable: its
memory and descriptors are closed even to processes of the same uid. Because the supervisor,
not the worker, reads the channel, it can interrupt a busy worker: `I` sends SIGINT to the
process trees the current command started, `K` sends SIGKILL, `R` kills the worker and exits.

Messages to the supervisor: first `<left> <right>\n` (the token), then `C<n>\n<n bytes of worker
input>`, `I\n`, `K\n`, `R\n`.
"""

from __future__ import annotations

import re
import secrets
import shlex
from dataclasses import dataclass

TRUNCATION_NOTE = "\n[... {skipped} bytes of output truncated ...]\n"

_SUPERVISOR = r"""
IFS=' ' read -r A B || exit 1
exec 4> >(while IFS= read -r s; do printf '\n%s%s%s\n' "$A" "$B" "$s"; done)
exec 3> >(bash --noprofile --norc; s=$?; exec 4>&-; printf '\n%s%sX%d\n' "$A" "$B" "$s"; kill -TERM $$ 2>/dev/null)
w=$!; wp=; pre=
LC_ALL=C
kids() { K=(); if [[ -r /proc/$1/task/$1/children ]]; then read -r -a K < "/proc/$1/task/$1/children"; else K=($(pgrep -P "$1")); fi; }
worker() { [[ -n $wp ]] || { kids "$w"; wp=${K[0]}; }; }
tree() { local p; local -a k; for p; do T+=("$p"); kids "$p"; k=("${K[@]}"); ((${#k[@]})) && tree "${k[@]}"; done; }
sig() { worker; [[ -n $wp ]] || return 0; kids "$wp"; local p; local -a new=(); for p in "${K[@]}"; do [[ " $pre " == *" $p "* ]] || new+=("$p"); done; T=(); ((${#new[@]})) && tree "${new[@]}"; ((${#T[@]})) && kill "-$1" "${T[@]}" 2>/dev/null; return 0; }
while IFS= read -r m; do
  case $m in
    C*) IFS= read -r -N "${m#C}" b || break; worker; if [[ -n $wp ]]; then kids "$wp"; pre="${K[*]}"; fi; printf '%s' "$b" >&3 ;;
    I) sig INT ;;
    K) sig KILL ;;
    R) worker; T=(); [[ -n $wp ]] && tree "$wp"; ((${#T[@]})) && kill -KILL "${T[@]}" 2>/dev/null; exit 0 ;;
  esac
done
"""  # noqa: E501

_WORKER_INIT = (
    "exec 2>&1; export TERM=dumb PAGER=cat GIT_PAGER=cat MANPAGER=cat SYSTEMD_PAGER= "
    "DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1\n"
)

_ANSI_RE = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    rb"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC
    rb"|\x1b[PX^_][^\x1b]*\x1b\\"  # DCS, SOS, PM, APC
    rb"|\x1b[@-Z\\-_]"  # two-byte escapes
    rb"|\x1b[ -/][0-~]"  # charset selection
)
_CONTROL_RE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_NEEDS_CLEANING_RE = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")  # controls, ESC and CR: all `clean_output` changes


@dataclass(frozen=True, slots=True)
class Token:
    """A per-shell sentinel, stored as the two halves the remote side prints back to back."""

    left: str
    right: str

    @classmethod
    def new(cls) -> Token:
        return cls(secrets.token_hex(12), secrets.token_hex(12))

    @property
    def marker(self) -> bytes:
        return ("\n" + self.left + self.right).encode()


@dataclass(frozen=True, slots=True)
class Frame:
    """The end of a command: its exit status and the worker's cwd, or the worker's death."""

    exit_code: int | None
    cwd: str | None
    worker_died: bool


SUPERVISOR_BASH = "/run/t1-bin/bash"
"""An execute-only bash where the sandbox has one (`t1.sandbox.isolation.supervisor_bin`); plain bash elsewhere."""


def supervisor_command() -> str:
    """The exec command line that starts the supervisor (and through it the worker); it holds no token."""
    return (f"S={SUPERVISOR_BASH}; [ -x $S ] || S=bash; exec $S --noprofile --norc -c "
            + shlex.quote(_SUPERVISOR))


def token_message(token: Token) -> bytes:
    """The supervisor's first input: the token it frames the worker's statuses with."""
    return f"{token.left} {token.right}\n".encode()


def worker_message(body: str) -> bytes:
    """Frame worker input for the supervisor."""
    data = body.encode()
    return b"C%d\n" % len(data) + data


def command_body(command: str) -> str:
    """Worker input that runs `command` in the worker itself (state persists), stdin from /dev/null
    and the status pipe closed, then reports its status. The command is single-quoted for eval, so
    unbalanced quotes are a syntax error of that command only."""
    if "\x00" in command:
        raise ValueError("command contains a NUL byte, which bash cannot represent")
    quoted = "'" + command.replace("'", "'\\''") + "'"
    return f"eval {quoted} </dev/null 4>&-; {STATUS_PRINTF}\n"


STATUS_PRINTF = "printf '%d %q\\n' \"$?\" \"$PWD\" >&4"
"""What the worker runs after each command: its status, to the supervisor's status reader."""


def init_body(cwd: str | None = None) -> str:
    """First worker input: merge stderr, set a non-interactive environment, restore cwd after a restart."""
    cd = f"cd -- {cwd} 2>/dev/null\n" if cwd else ""
    return _WORKER_INIT + cd + STATUS_PRINTF + "\n"


def _parse_status(line: bytes) -> Frame:
    text = line.decode("utf-8", "replace")
    if text.startswith("X"):
        return Frame(int(text[1:]) if text[1:].isdigit() else None, None, True)
    code, _, cwd = text.partition(" ")
    return Frame(int(code) if code.lstrip("-").isdigit() else None, cwd or None, False)


class CappedOutput:
    """Keeps the first and last bytes of a stream within a fixed budget, counting what it drops."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self._head_cap = cap_bytes // 2
        self._tail_cap = cap_bytes - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0

    def add(self, data: bytes | bytearray | memoryview) -> None:
        self.total_bytes += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self._tail_cap:
                del self._tail[: len(self._tail) - self._tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total_bytes > self.cap_bytes

    def render(self) -> str:
        """Head and tail, decoded (UTF-8 with replacement) and cleaned for an observation."""
        tail = bytes(self._tail[-self._tail_cap :]) if self._tail_cap else b""
        if not self.truncated:
            return clean_output(bytes(self._head) + tail)
        skipped = self.total_bytes - len(self._head) - len(tail)
        return clean_output(bytes(self._head)) + TRUNCATION_NOTE.format(skipped=skipped) + clean_output(tail)


def clean_output(raw: bytes) -> str:
    """Strip ANSI sequences and control bytes, resolve carriage returns as a terminal would, decode."""
    if _NEEDS_CLEANING_RE.search(raw) is None:  # most output: one scan, no copies
        return raw.decode("utf-8", "replace")
    data = _ANSI_RE.sub(b"", raw)
    data = data.replace(b"\r\n", b"\n")
    if b"\r" in data:
        data = b"\n".join(line.rsplit(b"\r", 1)[-1] if b"\r" in line else line for line in data.split(b"\n"))
    data = _CONTROL_RE.sub(b"", data)
    return data.decode("utf-8", "replace")


class FrameScanner:
    """Splits the worker's byte stream into command output and frames, in bounded memory."""

    _MAX_STATUS = 65536

    def __init__(self, token: Token, cap_bytes: int) -> None:
        self._marker = token.marker
        self._cap = cap_bytes
        self._pending = bytearray()
        self.output = CappedOutput(cap_bytes)
        self.frame: Frame | None = None

    def reset(self) -> None:
        """Start the next command; bytes already past the last frame count as its output."""
        self.output = CappedOutput(self._cap)
        self.frame = None
        if self._pending:
            leftover, self._pending = bytes(self._pending), bytearray()
            self.feed(leftover)

    def feed(self, data: bytes) -> None:
        if self.frame is not None:
            self._pending += data  # belongs to the next command
            return
        buf = self._pending + data if self._pending else data
        marker = self._marker
        idx = buf.find(marker)
        if idx < 0:
            keep = min(len(buf), len(marker) - 1)
            self.output.add(memoryview(buf)[: len(buf) - keep])
            self._pending = bytearray(buf[len(buf) - keep :])
            return
        self.output.add(memoryview(buf)[:idx])
        status = idx + len(marker)
        end = buf.find(b"\n", status)
        if end < 0:
            if len(buf) - status > self._MAX_STATUS:
                raise ValueError("malformed frame from the remote shell (status line too long)")
            self._pending = bytearray(buf[idx:])
            return
        self.frame = _parse_status(bytes(buf[status:end]))
        self._pending = bytearray(buf[end + 1 :])
