"""Transcripts (t1/agent/transcript.py's Markdown) parsed back into turns for the episode page.

The writer's layout is the contract: `## Turn N  (...)` opens a turn, `### Model` and a fence
hold the reply, `### $ command` then `exit C, Ds[ TIMED OUT]` and a fence hold a command's output,
`> note` lines mark compaction points and other events, `### Verifier (label): p/t passed` is a
checkpoint, `## Result` closes. A fence is a line of at least four backticks, closed by the same
line: the writer makes it longer than any run of backticks in its text, so nothing the agent wrote
closes it. Lines are split on "\n" only (a U+2028 or a lone CR in the agent's output is no line
break here, as in the writer). A transcript cut short (a live episode) parses as far as it goes.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from markupsafe import Markup, escape

_FENCE = re.compile(r"^`{4,}$")
_TURN = re.compile(r"^## Turn (\d+)\s*\((.*)\)\s*$")
_EXIT = re.compile(r"^exit (\S+), ([\d.]+)s( TIMED OUT)?$")
_VERIFIER = re.compile(r"^### Verifier \((.*?)\): (\d+)/(\d+) passed(?: - (.*))?$")


def _hidden(ch: str) -> bool:
    return ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def show_controls(text: object) -> Markup:
    """`text` as HTML (escaped) with every invisible character shown as a mark naming it: bidi overrides and
    isolates (U+202A-U+202E, U+2066-U+2069), zero-width and other format characters, control characters
    other than newline and tab, line and paragraph separators. What a person audits is what the agent wrote,
    not what a renderer reordered or hid (pure)."""
    out: list[str] = []
    for ch in str(text):
        if _hidden(ch):
            out.append(f'<span class="ctl" title="{unicodedata.name(ch, "control character")}">'
                       f"&lt;U+{ord(ch):04X}&gt;</span>")
        else:
            out.append(str(escape(ch)))
    return Markup("".join(out))


@dataclass(slots=True)
class CommandRun:
    command: str
    exit_code: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    output: str = ""


@dataclass(slots=True)
class Checkpoint:
    label: str
    passed: int
    total: int
    detail: str = ""


@dataclass(slots=True)
class Turn:
    index: int
    info: str
    reply: str = ""
    commands: list[CommandRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)


@dataclass(slots=True)
class ParsedTranscript:
    instruction: str = ""
    header: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # before the first turn
    turns: list[Turn] = field(default_factory=list)
    result: list[str] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)  # after the last turn (the final verifier)


def _fenced(lines: list[str], i: int) -> tuple[str, int]:
    """The text of the fence opening at or after line i, and the line after its close (the same fence)."""
    while i < len(lines) and not _FENCE.match(lines[i]):
        i += 1
    fence = lines[i] if i < len(lines) else ""
    body: list[str] = []
    i += 1
    while i < len(lines) and lines[i] != fence:
        body.append(lines[i])
        i += 1
    return "\n".join(body), i + 1


def parse_transcript(text: str) -> ParsedTranscript:
    out = ParsedTranscript()
    lines = text.split("\n")
    turn: Turn | None = None
    section = "header"
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _TURN.match(line)
        if m:
            turn = Turn(int(m.group(1)), m.group(2))
            out.turns.append(turn)
            section = "turn"
        elif line == "## Instruction":
            section = "instruction"
        elif line == "## Result":
            section = "result"
        elif line == "### Model" and turn is not None:
            turn.reply, i = _fenced(lines, i + 1)
            continue
        elif line.startswith("### $ ") and turn is not None:
            run = CommandRun(line[len("### $ "):])
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            e = _EXIT.match(lines[j]) if j < len(lines) else None
            if e:
                run.exit_code, run.duration_s, run.timed_out = e.group(1), float(e.group(2)), bool(e.group(3))
                run.output, i = _fenced(lines, j + 1)
            else:
                i = j
            turn.commands.append(run)
            continue
        elif (v := _VERIFIER.match(line)) is not None:
            cp = Checkpoint(v.group(1), int(v.group(2)), int(v.group(3)), v.group(4) or "")
            (turn.checkpoints if turn is not None and section == "turn" else out.checkpoints).append(cp)
        elif line.startswith("> "):
            (turn.notes if turn is not None else out.notes).append(line[2:])
        elif section == "instruction":
            out.instruction += line + "\n"
        elif section == "result" and line.startswith("- "):
            out.result.append(line[2:])
        elif section == "header" and line.startswith("- "):
            out.header.append(line[2:])
        i += 1
    out.instruction = out.instruction.strip()
    return out


def read_transcript(path: Path) -> ParsedTranscript | None:
    return parse_transcript(path.read_text(encoding="utf-8", errors="replace")) if path.is_file() else None
