"""A scripted policy: a GenerateFn that types a task's reference solution as the agent's actions.

It stands in for the model where a test needs known behaviour through the real episode path
(real tokenizer and chat template, real TITO buffer, real shell, real verifier): per phase it
replies with one action that writes the solution files and runs the solution script (or, where
the solution lists its turns, with one command per turn, as a policy would), then with `finish`. Replies are tokenized with the real tokenizer and end with the end-of-turn
token, exactly as a sampler's would; logprobs are 0 (the script is deterministic).
"""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import dataclass

import numpy as np

from t1.agent.formats import AgentFormat, FormatName
from t1.inference.types import FinishReason, GenerateRequest, GenerateResult
from t1.tasks.spec import SolutionSpec, TaskSpec
from t1.tito import ChatRenderer

SOLUTION_DIRS = ("/solution", "/tmp/solution")


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

    def __init__(self, renderer: ChatRenderer, policy_version: int = 0) -> None:
        self.renderer = renderer
        self.policy_version = policy_version

    def for_episode(self, task: TaskSpec, fmt: AgentFormat) -> ScriptedEpisode:
        return ScriptedEpisode(self, fmt, tuple(oracle_actions(task)))


@dataclass(eq=False)
class ScriptedEpisode:
    """One episode's scripted GenerateFn: the next action per call, then `finish` for ever."""

    policy: ScriptedPolicy
    fmt: AgentFormat
    actions: tuple[str | None, ...]
    calls: int = 0

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        action = self.actions[self.calls] if self.calls < len(self.actions) else None
        self.calls += 1
        renderer, version = self.policy.renderer, self.policy.policy_version
        ids = np.asarray(renderer.encode(render_action(self.fmt, action)) + list(renderer.end_of_turn_ids), np.int32)
        n = len(ids)
        return GenerateResult(token_ids=ids, logprobs=np.zeros(n, np.float32), finish_reason=FinishReason.STOP,
                              policy_version=version, token_versions=np.full(n, version, np.int32), routing=None,
                              prompt_tokens=len(request.prompt_ids))
