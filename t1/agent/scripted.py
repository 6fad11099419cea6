"""A scripted policy: a GenerateFn that types a task's reference solution as the agent's actions.

It stands in for the model where a test needs known behaviour through the real episode path
(real tokenizer and chat template, real TITO buffer, real shell, real verifier): per phase it
replies with one action that writes the solution files and runs the solution script (or, where
the solution lists its turns, with one command per turn, as a policy would), then with `finish`. Replies are tokenized
with the real tokenizer and end with the end-of-turn
token, exactly as a sampler's would; logprobs are 0 (the script is deterministic).

Asked for a compaction summary (`rollout.compaction.mode: policy`: the prompt ends with the request), it
writes what a teacher would: how many commands ran and the last one, and the values the remaining commands
need that the machine has shown (words of the remaining commands that appear in the conversation but neither
in the instruction nor in the commands typed so far), each quoted in the line that showed it: the value follows
the same words as where it was shown, so writing the summary, and reading it later, copies a value after the
token it followed (the copy a small model learns best; bench/copy_probe.py); as many of those lines as fit the
summary's token budget. The summaries of a `lossy_share` of the episodes (drawn per task) drop those values: the
demonstrations then show summaries that lose what a later step needs, so SFT learns to write summaries and
RL learns which ones pay. (Drawn per episode, not per summary: an episode compacts 3-8 times, and a value lost
once is lost for good, so a per-summary share of 0.25 would lose it in most demonstrations.)

With `notes` each reply opens with a running note of the values still needed that the machine has shown
(`Still needed: target: pink`, then the action): the value an early step showed is typed late at the end of a
chain of copies, each from the reply before (a small model copies from close by, not from far back), and the
kept last turn carries the note over a compaction; a lossy episode keeps none.
"""

from __future__ import annotations

import base64
import json
import random
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from t1.agent.compaction import SUMMARY_REQUEST
from t1.agent.formats import AgentFormat, FormatName
from t1.inference.types import FinishReason, GenerateRequest, GenerateResult
from t1.tasks.spec import SolutionSpec, TaskSpec
from t1.tito import ChatRenderer

SOLUTION_DIRS = ("/solution", "/tmp/solution")
ASSISTANT_TURN = "<|im_start|>assistant"  # how the chat template opens an assistant turn (and the generation prompt)
STILL_NEEDED = "Still needed:"  # how a teacher summary opens its quotes of the values the rest of the task needs


def solution_command(solution: SolutionSpec) -> str:
    """One shell command that recreates the solution folder and runs it like the oracle runner.

    The folder is /solution, or /tmp/solution where the sandbox root is read-only (local sandboxes).
    """
    if solution.commands:
        files = {"solution.sh": ("\n".join(solution.commands) + "\n").encode()}
        script = "solution.sh"
    elif solution.files_dir is not None:
        files = {str(p.relative_to(solution.files_dir)): p.read_bytes()
                 for p in sorted(solution.files_dir.rglob("*")) if p.is_file()}
        script = solution.script.name
    else:
        files = {solution.script.name: solution.script.read_bytes()}
        script = solution.script.name
    parts = [f'S={SOLUTION_DIRS[0]}; {{ rm -rf "$S" && mkdir -p "$S"; }} 2>/dev/null || '
             f'{{ S={SOLUTION_DIRS[1]}; rm -rf "$S"; mkdir -p "$S"; }}']
    for rel, data in files.items():
        target = '"$S"/' + shlex.quote(rel)
        encoded = base64.b64encode(data).decode()
        parts.append(f'mkdir -p "$(dirname {target})"; echo {encoded} | base64 -d > {target}')
    env = "".join(f"export {k}={shlex.quote(v)}; " for k, v in solution.env)
    parts.append(f'( {env}bash "$S"/{shlex.quote(script)} ) < /dev/null 2>&1')
    return "; ".join(parts)


def oracle_actions(task: TaskSpec) -> list[str | None]:
    """Per phase: the solution command (or its turns, one command each), then None (finish)."""
    actions: list[str | None] = []
    for phase in task.phases():
        if phase.solution is not None and phase.solution.turns:
            actions.extend(phase.solution.turns)
        elif phase.solution is not None:
            actions.append(solution_command(phase.solution))
        actions.append(None)
    return actions


def render_action(fmt: AgentFormat, command: str | None) -> str:
    if fmt.name is FormatName.TOOL_CALLS:
        call = {"name": "finish", "arguments": {}} if command is None else \
            {"name": "bash", "arguments": {"command": command}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return json.dumps({"analysis": "scripted", "plan": "run the reference solution",
                       "commands": [] if command is None else [{"keystrokes": command + "\n", "duration": 30}],
                       "task_complete": command is None})


class ScriptedPolicy:
    """Makes each episode's scripted GenerateFn from its task (`for_episode`); `policy_version` is the
    version its replies carry (the coordinator sets it when weights change)."""

    def __init__(self, renderer: ChatRenderer, policy_version: int = 0, lossy_share: float = 0.0,
                 notes: bool = False) -> None:
        if not 0.0 <= lossy_share <= 1.0:
            raise ValueError(f"lossy_share must be in [0, 1], got {lossy_share}")
        self.renderer = renderer
        self.policy_version = policy_version
        self.lossy_share = lossy_share
        self.notes = notes

    def for_episode(self, task: TaskSpec, fmt: AgentFormat) -> ScriptedEpisode:
        return ScriptedEpisode(self, fmt, tuple(oracle_actions(task)), task.phases()[0].instruction, task.id)


@dataclass(eq=False)
class ScriptedEpisode:
    """One episode's scripted GenerateFn: the next action per call, then `finish` for ever."""

    policy: ScriptedPolicy
    fmt: AgentFormat
    actions: tuple[str | None, ...]
    instruction: str = ""
    task_id: str = ""
    calls: int = 0
    summaries: list[str] = field(default_factory=list)

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        renderer, version = self.policy.renderer, self.policy.policy_version
        tail = renderer.decode(request.prompt_ids[-256:].tolist())
        if SUMMARY_REQUEST in tail:
            text = self._summary(renderer.decode(request.prompt_ids.tolist()), request.sampling.max_tokens)
            self.summaries.append(text)
        else:
            # The turn is also read from the prompt (the assistant turns it holds), so a resumed episode (a restarted
            # coordinator, a new ScriptedEpisode) goes on with the action after its last journaled turn.
            self.calls = max(self.calls, renderer.decode(request.prompt_ids.tolist()).count(ASSISTANT_TURN) - 1)
            action = self.actions[self.calls] if self.calls < len(self.actions) else None
            self.calls += 1
            text = render_action(self.fmt, action)
            if self.policy.notes and not self.lossy:
                text = self._noted(renderer.decode(request.prompt_ids.tolist()), text, request.sampling.max_tokens)
        ids = np.asarray(renderer.encode(text) + list(renderer.end_of_turn_ids), np.int32)
        n = len(ids)
        return GenerateResult(token_ids=ids, logprobs=np.zeros(n, np.float32), finish_reason=FinishReason.STOP,
                              policy_version=version, token_versions=np.full(n, version, np.int32), routing=None,
                              prompt_tokens=len(request.prompt_ids))

    @property
    def lossy(self) -> bool:
        """This episode's teacher forgets: its summaries drop the values a later step needs, and it keeps no notes."""
        return random.Random(f"{self.task_id}/lossy").random() < self.policy.lossy_share

    def _summary(self, conversation: str, budget: int) -> str:
        """The teacher's summary: commands run, the last one, and (unless this episode's are lossy) the values the
        remaining commands need that the conversation shows and the instruction does not, each quoted in the line
        that showed it (`Still needed: ticket: olive (write it to black.txt ...)`), as many of those lines as fit
        the summary's token budget (the earliest first)."""
        done = [a for a in self.actions[:self.calls] if a is not None]
        text = f"I ran {len(done)} commands" + (f", the last: {done[-1]}." if done else ".")
        if self.lossy:
            return text
        quotes = [line for line, _ in self._quotes(conversation)]
        summaries = [f"{text} {STILL_NEEDED} {'; '.join(quotes[:n])}" for n in range(len(quotes), 0, -1)]
        return self._first_fitting(summaries, budget, text)

    def _noted(self, conversation: str, action: str, budget: int) -> str:
        """The reply `action` opened by the teacher's running note (`notes`): the values the remaining commands need
        that the machine has shown, each quoted in the line that showed it up to the last such value (`Still needed:
        target: pink`), earliest first, as many as fit the reply's budget. A value is so copied first from the
        output just above and then from the last reply, always from close by, never from where it was shown far
        back: the copy a small model gets right (bench/copy_probe.py); the kept last turn carries the note over a
        compaction."""
        quotes = [line[:end] for line, (_, end) in self._quotes(conversation)]
        noted = [f"{STILL_NEEDED} {'; '.join(quotes[:n])}\n{action}" for n in range(len(quotes), 0, -1)]
        return self._first_fitting(noted, budget, action)

    def _quotes(self, conversation: str) -> list[tuple[str, tuple[str, int]]]:
        """The lines of the conversation that show a value the remaining commands need (neither in the instruction
        nor typed yet), each value's last such line, in the conversation's order; with each line, its last needed
        value and where that value ends in the line."""
        done = [a for a in self.actions[:self.calls] if a is not None]
        later = [w for a in self.actions[self.calls:] if a for w in _WORD.findall(a)]
        known = set(_WORD.findall(self.instruction)).union(*(_WORD.findall(a) for a in done))
        specials = getattr(self.policy.renderer.tokenizer, "all_special_tokens", ())  # a Hugging Face tokenizer's
        shown = list(_shown_lines(conversation, specials))
        last: dict[int, tuple[str, int]] = {}  # line -> its last needed value and that value's end
        for value in {w for w in later if w not in known}:
            found = [(i, m.end()) for i, line in enumerate(shown)
                     for m in re.finditer(rf"\b{re.escape(value)}\b", line)]
            if found:
                i, end = found[-1]
                if end > last.get(i, ("", 0))[1]:
                    last[i] = (value, end)
        return list({shown[i]: last[i] for i in sorted(last)}.items())

    def _first_fitting(self, texts: list[str], budget: int, fallback: str) -> str:
        renderer = self.policy.renderer
        room = budget - len(renderer.end_of_turn_ids)
        return next((t for t in texts if len(renderer.encode(t)) <= room), fallback)


def _shown_lines(conversation: str, specials: Sequence[str]) -> Iterator[str]:
    """The conversation's lines as the teacher quotes them: an earlier summary's or note's quotes one by one (so a
    value carried through several keeps the words around it), every other line whole; never a line of the chat
    template's (one with a special token: `<|im_start|>user` shows `user`, the name of a config file a later
    command touches)."""
    for line in conversation.splitlines():
        if any(t in line for t in specials):
            continue
        _, sep, quotes = line.partition(f"{STILL_NEEDED} ")
        yield from (q.strip() for q in quotes.split("; ")) if sep else (line.strip(),)


_WORD = re.compile(r"[A-Za-z0-9_]+")
