"""Per-episode transcripts a person can read: one Markdown file, written turn by turn (tail -f works)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO

_FENCE = "````"


class Transcript:
    """Writes `<dir>/<task_id>/<episode_id>.md`; a no-op when dir is None."""

    def __init__(self, directory: Path | None, task_id: str, episode_id: str) -> None:
        self.path: Path | None = None
        self._file: IO[str] | None = None
        if directory is not None:
            self.path = directory / task_id.replace("/", "__") / f"{episode_id}.md"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")
        self._t0 = time.monotonic()

    def _w(self, text: str) -> None:
        if self._file is not None:
            self._file.write(text)
            self._file.flush()

    def header(self, task_id: str, episode_id: str, agent_format: str, instruction: str, prompt_tokens: int) -> None:
        self._w(f"# Episode {episode_id}\n\n- task: {task_id}\n- format: {agent_format}\n"
                f"- opening prompt: {prompt_tokens} tokens\n\n## Instruction\n\n{instruction.strip()}\n\n")

    def turn(self, turn: int, reply: str, sampled: int, context: int, version: int, finish: str) -> None:
        self._w(f"## Turn {turn}  (t={time.monotonic() - self._t0:.1f}s, sampled {sampled} tokens, context "
                f"{context}, policy v{version}, {finish})\n\n### Model\n\n{_FENCE}\n{reply.strip()}\n{_FENCE}\n\n")

    def command(self, command: str, output: str, exit_code: int | None, duration_s: float, timed_out: bool) -> None:
        flag = " TIMED OUT" if timed_out else ""
        self._w(f"### $ {command.strip().splitlines()[0][:200] if command.strip() else ''}\n\n"
                f"exit {exit_code}, {duration_s:.2f}s{flag}\n\n{_FENCE}\n{output.rstrip()}\n{_FENCE}\n\n")

    def note(self, text: str) -> None:
        self._w(f"> {text}\n\n")

    def verifier(self, label: str, passed: int, total: int, detail: str = "") -> None:
        self._w(f"### Verifier ({label}): {passed}/{total} passed{(' - ' + detail) if detail else ''}\n\n")

    def footer(self, status: str, reward: float, turns: int, tokens: int, duration_s: float,
               turn_rewards: dict[int, float]) -> None:
        rewards = ", ".join(f"t{k}: {v:g}" for k, v in sorted(turn_rewards.items()) if v)
        self._w(f"## Result\n\n- status: {status}\n- reward: {reward:g}\n- turns: {turns}\n- tokens: {tokens}\n"
                f"- duration: {duration_s:.1f}s\n" + (f"- turn rewards: {rewards}\n" if rewards else ""))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
