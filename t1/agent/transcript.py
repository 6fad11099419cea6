"""Per-episode transcripts a person can read: one Markdown file, written turn by turn (tail -f works).

Writes are held in a list of pending strings (no fixed-size buffer and no open descriptor per episode:
thousands of episodes run at once; each flush opens, appends and closes): a turn's text reaches the file
at the latest FLUSH_EVERY_S after it was written,
and at once for the rare events that explain an episode (notes, verifier results, the result). The
episode closes its transcript however it ends (finished, failed or cancelled), so nothing written
is lost with the episode; a killed process loses at most the last FLUSH_EVERY_S of turns.

What the agent wrote or a command printed can never be read as the transcript's structure (the
viewer parses it back, t1/view/transcripts.py): a fenced block's fence is longer than any run of
backticks in its text (`fence_for`), and a field kept on one line (a command, a note, a verifier's
detail) has its line breaks and other control characters written as escapes (`one_line`). The file's
lines are split on "\n" only, by the writer and the parser alike.
"""

from __future__ import annotations

import re
import time
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from t1.metrics.write_faults import WriteFaults

MIN_FENCE = 4
FLUSH_EVERY_S = 2.0
_BACKTICKS = re.compile(r"`+")


def fence_for(text: str) -> str:
    """A fence of backticks longer than every run of backticks in `text` (at least MIN_FENCE) (pure)."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    return "`" * max(MIN_FENCE, longest + 1)


def _escaped(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def one_line(text: str) -> str:
    """`text` on one line: line breaks, other control characters and bidi/format characters (categories Cc,
    Cf, Zl, Zp) written as `\\xNN` / `\\uNNNN` escapes (pure)."""
    return "".join(_escaped(ch) if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in text)


def fenced(text: str) -> str:
    fence = fence_for(text)
    return f"{fence}\n{text}\n{fence}\n"


class Transcript:
    """Writes `<dir>/<task_id>/<episode_id>.md`; a no-op when dir is None.

    A write that fails (a full disk) stops the transcript there, never the episode: what was
    written stays, the rest is dropped, and `faults` (when given) hears of it."""

    def __init__(self, directory: Path | None, task_id: str, episode_id: str,
                 faults: WriteFaults | None = None, append: bool = False) -> None:
        """`append`: continue the file (a resumed episode's) instead of starting it."""
        self.path: Path | None = None
        self._writing = False  # no descriptor is held between flushes: 10,000 live episodes are 10,000 files
        self._pending: list[str] = []
        self._faults = faults
        if directory is not None:
            self.path = directory / task_id.replace("/", "__") / f"{episode_id}.md"
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("ab" if append else "wb", buffering=0):
                    pass
                self._writing = True
            except OSError as exc:
                self._failed(exc)
        self._t0 = self._flushed = time.monotonic()

    def _failed(self, exc: OSError) -> None:
        self._writing = False
        self._pending.clear()
        if self._faults is not None:
            self._faults.failed("transcripts", exc)

    def _w(self, text: str, flush: bool = False) -> None:
        if not self._writing:
            return
        self._pending.append(text)
        now = time.monotonic()
        if flush or now - self._flushed >= FLUSH_EVERY_S:
            self._flush(now)

    def _flush(self, now: float) -> bool:
        """Append what is pending (open, write, close); False when the transcript has failed."""
        if self._writing and self._pending and self.path is not None:
            data = "".join(self._pending).encode("utf-8", "replace")
            self._pending.clear()
            try:
                with self.path.open("ab", buffering=0) as f:
                    if f.write(data) != len(data):
                        raise OSError(f"{self.path}: short write of {len(data)} bytes (the disk is full?)")
            except OSError as exc:
                self._failed(exc)
        self._flushed = now
        return self._writing

    def header(self, task_id: str, episode_id: str, agent_format: str, instruction: str, prompt_tokens: int) -> None:
        self._w(f"# Episode {episode_id}\n\n- task: {task_id}\n- format: {agent_format}\n"
                f"- opening prompt: {prompt_tokens} tokens\n\n## Instruction\n\n{instruction.strip()}\n\n", flush=True)

    def turn(self, turn: int, reply: str, sampled: int, context: int, version: int, finish: str) -> None:
        self._w(f"## Turn {turn}  (t={time.monotonic() - self._t0:.1f}s, sampled {sampled} tokens, context "
                f"{context}, policy v{version}, {one_line(finish)})\n\n### Model\n\n{fenced(reply.strip())}\n")

    def command(self, command: str, output: str, exit_code: int | None, duration_s: float, timed_out: bool) -> None:
        flag = " TIMED OUT" if timed_out else ""
        first = command.strip().split("\n", 1)[0][:200]
        self._w(f"### $ {one_line(first)}\n\nexit {exit_code}, {duration_s:.2f}s{flag}\n\n{fenced(output.rstrip())}\n")

    def note(self, text: str) -> None:
        self._w(f"> {one_line(text)}\n\n", flush=True)

    def verifier(self, label: str, passed: int, total: int, detail: str = "") -> None:
        tail = f" - {one_line(detail)}" if detail else ""
        self._w(f"### Verifier ({one_line(label)}): {passed}/{total} passed{tail}\n\n", flush=True)

    def footer(self, status: str, reward: float, turns: int, tokens: int, duration_s: float,
               turn_rewards: dict[int, float]) -> None:
        rewards = ", ".join(f"t{k}: {v:g}" for k, v in sorted(turn_rewards.items()) if v)
        self._w(f"## Result\n\n- status: {one_line(status)}\n- reward: {reward:g}\n- turns: {turns}\n"
                f"- tokens: {tokens}\n"
                f"- duration: {duration_s:.1f}s\n" + (f"- turn rewards: {rewards}\n" if rewards else ""), flush=True)

    def close(self) -> None:
        """Flush and close; safe to call more than once."""
        if self._writing and self._flush(time.monotonic()):
            self._writing = False
            if self._faults is not None:
                self._faults.recovered("transcripts")
