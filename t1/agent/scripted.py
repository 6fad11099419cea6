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
in the instruction nor in the commands typed so far). A `lossy_share` of the summaries (drawn per task and summary)
drop those values: the
demonstrations then show summaries that lose what a later step needs, so SFT learns to write summaries and
RL learns which ones pay.
"""

from __future__ import annotations

import base64
import json
import random
import re
import shlex
from dataclasses import dataclass, field

import numpy as np

from t1.agent.compaction import SUMMARY_REQUEST
from t1.agent.formats import AgentFormat, FormatName
from t1.inference.types import FinishReason, GenerateRequest, GenerateResult
from t1.tasks.spec import SolutionSpec, TaskSpec
from t1.tito import ChatRenderer

SOLUTION_DIRS = ("/solution", "/tmp/solution")
ASSISTANT_TURN = "<|im_start|>assistant"  # how the chat template opens an assistant turn (and the generation prompt)


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

    def __init__(self, renderer: ChatRenderer, policy_version: int = 0, lossy_share: float = 0.0) -> None:
        if not 0.0 <= lossy_share <= 1.0:
            raise ValueError(f"lossy_share must be in [0, 1], got {lossy_share}")
        self.renderer = renderer
        self.policy_version = policy_version
        self.lossy_share = lossy_share

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
            text = self._summary(renderer.decode(request.prompt_ids.tolist()))
            self.summaries.append(text)
        else:
            # The turn is also read from the prompt (the assistant turns it holds), so a resumed episode (a restarted
            # coordinator, a new ScriptedEpisode) goes on with the action after its last journaled turn.
            self.calls = max(self.calls, renderer.decode(request.prompt_ids.tolist()).count(ASSISTANT_TURN) - 1)
            action = self.actions[self.calls] if self.calls < len(self.actions) else None
            self.calls += 1
            text = render_action(self.fmt, action)
        ids = np.asarray(renderer.encode(text) + list(renderer.end_of_turn_ids), np.int32)
        n = len(ids)
        return GenerateResult(token_ids=ids, logprobs=np.zeros(n, np.float32), finish_reason=FinishReason.STOP,
                              policy_version=version, token_versions=np.full(n, version, np.int32), routing=None,
                              prompt_tokens=len(request.prompt_ids))

    def _summary(self, conversation: str) -> str:
        """The teacher's summary: commands run, the last one, and (unless this one is lossy) the values the
        remaining commands need that the conversation shows and the instruction does not."""
        done = [a for a in self.actions[:self.calls] if a is not None]
        text = f"I ran {len(done)} commands" + (f", the last: {done[-1]}." if done else ".")
        lossy = random.Random(f"{self.task_id}/{len(self.summaries)}").random() < self.policy.lossy_share
        if lossy:
            return text
        later = [w for a in self.actions[self.calls:] if a for w in _WORD.findall(a)]
        known = set(_WORD.findall(self.instruction)).union(*(_WORD.findall(a) for a in done))
        values = list(
            dict.fromkeys(w for w in later if w not in known and re.search(rf"\b{re.escape(w)}\b", conversation))
        )
        return f"{text} Values still needed: {', '.join(values)}." if values else text


_WORD = re.compile(r"[A-Za-z0-9_]+")
