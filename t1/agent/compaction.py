"""Context compaction as pure functions: keep the opening, a note of what was done, and the last turns verbatim.

The compacted conversation starts a new TITO segment (docs/design.md). The note is the rule's
(`compact_messages`: older observations trimmed to a list of the commands that ran and their exit
codes) or the policy's own summary (`summary_compacted`, `rollout.compaction.mode: policy`): asked
with SUMMARY_REQUEST in the model's own chat template, its sampled tokens close the segment and are
trained with the episode's return; a malformed one (`summary_of` says None) falls back to the rule.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

Message = dict[str, Any]
MAX_NOTE_CHARS = 4000
NOTE_HEAD = "[Earlier turns were compacted to fit the context."  # how every note opens (a later one replaces it)
SUMMARY_REQUEST = ("The context is nearly full: earlier turns will be cleared. Summarize what you have done and "
                   "everything the rest of the task still needs (names, values, what remains). Reply with the "
                   "summary only, no command.")


def command_line(command: str, exit_code: int | None) -> str:
    """A command's line in the compaction note."""
    return f"$ {command.strip().splitlines()[0][:160] if command.strip() else ''}  -> exit {exit_code}"


class RecentCommands:
    """The commands an episode ran, as note lines, holding no more than the note can show (O(1) memory
    however long the episode: the note keeps its last MAX_NOTE_CHARS)."""

    def __init__(self) -> None:
        self._lines: deque[str] = deque()
        self._chars = -1  # len("\n".join(lines))
        self.count = 0

    def append(self, command: str, exit_code: int | None) -> None:
        line = command_line(command, exit_code)
        self._lines.append(line)
        self._chars += len(line) + 1
        self.count += 1
        # Drop the oldest while what is left is still longer than the note: its last chars do not change.
        while len(self._lines) > 1 and self._chars - len(self._lines[0]) - 1 > MAX_NOTE_CHARS:
            self._chars -= len(self._lines.popleft()) + 1

    def __bool__(self) -> bool:
        return self.count > 0

    def lines(self) -> list[str]:
        return list(self._lines)


def compact_messages(messages: Sequence[Message], num_opening: int, keep_last_turns: int,
                     commands_run: Iterable[tuple[str, int | None]] | RecentCommands) -> list[Message]:
    """A shorter conversation ending where `messages` ends (after an observation), with the rule's note.

    messages: the current segment's conversation, opening messages first.
    num_opening: how many leading messages are the opening (system + instruction), kept as is.
    commands_run: (command, exit code) of every command of the episode so far, oldest first (or the
    episode's RecentCommands).
    """
    lines = commands_run.lines() if isinstance(commands_run, RecentCommands) else \
        [command_line(cmd, code) for cmd, code in commands_run]
    note = "\n".join(lines)
    if len(note) > MAX_NOTE_CHARS:
        note = "...\n" + note[-MAX_NOTE_CHARS:]
    summary = (f"{NOTE_HEAD} Commands run so far:]\n" + (note or "(none)") +
               "\n[Continue the task from the current state of the machine.]")
    return _with_note(messages, num_opening, keep_last_turns, summary)


def summary_compacted(messages: Sequence[Message], num_opening: int, keep_last_turns: int,
                      summary: str) -> list[Message]:
    """A shorter conversation as `compact_messages`, with the summary the policy wrote instead of the rule's note
    (`rollout.compaction.mode: policy`). `messages` end before the summary request."""
    note = f"{NOTE_HEAD} Your summary of them:]\n{summary}\n" \
           "[Continue the task from the current state of the machine.]"
    return _with_note(messages, num_opening, keep_last_turns, note)


def summary_of(text: str, truncated: bool, has_action: bool, max_chars: int = MAX_NOTE_CHARS) -> str | None:
    """The policy's summary as the next segment shows it, or None when it is malformed (empty, cut off at its
    token budget, an action instead of prose, longer than the note may be): the caller falls back to the rule."""
    body = text.strip()
    if not body or truncated or has_action or len(body) > max_chars:
        return None
    return body


def _with_note(messages: Sequence[Message], num_opening: int, keep_last_turns: int, note: str) -> list[Message]:
    """The opening (its last message's earlier note replaced: notes never pile up), the note, the last turns."""
    if num_opening < 1 or num_opening > len(messages):
        raise ValueError(f"num_opening must be in 1..{len(messages)}, got {num_opening}")
    opening = list(messages[:num_opening])
    content = str(opening[-1]["content"])
    if (cut := content.find(f"\n\n{NOTE_HEAD}")) >= 0:
        opening[-1] = {**opening[-1], "content": content[:cut]}
    body = list(messages[num_opening:])
    starts = [i for i, m in enumerate(body) if m.get("role") == "assistant"]
    kept = body[starts[-keep_last_turns]:] if keep_last_turns and len(starts) >= keep_last_turns else \
        (body[starts[0]:] if keep_last_turns and starts else [])
    # The note goes into the opening user message so roles keep alternating.
    opening[-1] = {**opening[-1], "content": f"{opening[-1]['content']}\n\n{note}"}
    return opening + kept
