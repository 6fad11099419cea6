"""Which turns probe the shell's state for a resume: those whose commands may change it, by their words."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from test_episode import _says, _task, limits

from t1.agent.episode import Episode, EpisodeSpec, acquire_from
from t1.agent.formats import FormatName, get_format
from t1.agent.shell_state import PROBE, StateWatch, may_change_state
from t1.agent.transcript import Transcript
from t1.coordinator.spool.journal import Journal, read_events
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams
from t1.tasks.formats.dataset import load_task

PROGRAMS_ONLY = ["true", "ls -la /app", "cat f | grep -n x > out.txt", "python3 -m pytest -q", "make -j4",
                 "find . -name '*.py'", "grep -rn foo .", "git commit -m 'a message'", "sed -i s/a/b/ f", "./run.sh",
                 "echo hi > .env", "cat a.b 2>&1 | tail -5", "ls ./x && wc -l ./y"]
SHELL_STATE = ["cd /tmp", "export X=1", "X=1 make", "PATH=/opt/bin:$PATH", ". ./env.sh", "ls && . env",
               "if true; then . x; fi", "source venv/bin/activate", "echo $((n+1))", "((n++))", "read X < f",
               "unset HOME", "declare -x Y", "eval \"$(ssh-agent)\"", "pushd /srv", "for PATH in a; do :; done",
               "printf -v X %s y", "mapfile -t L < f", "exec bash", "set -a", "builtin cd /", "command cd /",
               "ls\n. env"]


@pytest.mark.parametrize("command", PROGRAMS_ONLY)
def test_a_command_that_only_runs_programs_cannot_change_the_shell(command: str) -> None:
    assert not may_change_state(command)


@pytest.mark.parametrize("command", SHELL_STATE)
def test_a_command_the_shell_itself_acts_on_may_change_it(command: str) -> None:
    assert may_change_state(command)


@pytest.mark.parametrize("definition", ["f() { export A=1; }", "function f { cd /; }", "alias ls=cd",
                                        "trap 'export A=1' DEBUG", "shopt -s autocd", "enable -n echo"])
def test_after_a_definition_every_turn_is_probed(definition: str) -> None:
    """A function's or alias's name, a trap, autocd: later words no longer say what a command does."""
    watch = StateWatch()
    assert not watch.wants_probe(["ls"])
    assert watch.wants_probe([definition])
    assert watch.wants_probe(["f"]) and watch.wants_probe(["ls"])


async def test_a_journaled_episode_probes_only_the_turns_that_may_change_the_shell(tmp_path: Path, provider,
                                                                                  renderers) -> None:
    """Turn 0 runs programs only: no probe (the shell ran one command), nothing journaled; turn 1 moves and exports:
    its probe is journaled and a resume would restore it; turn 2 runs a program again: no probe."""
    task = load_task(_task(tmp_path, "echo-task", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    replies = ["ls /", "mkdir -p /tmp/w && cd /tmp/w && export T1_KEPT=yes", "cat /etc/hostname"]
    ran: list[str] = []

    async def policy(req: GenerateRequest) -> GenerateResult:
        command = replies[min(len(ran), len(replies) - 1)]
        ran.append(command)
        return _says(renderer, f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{command}"}}}}\n'
                               "</tool_call>", req)

    probes: list[int] = []

    class Watched:
        """The agent's shell, with every probe it runs noted (at which turn)."""

        def __init__(self, inner) -> None:
            self.inner = inner

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        async def run(self, command: str, timeout_s: float | None = None):
            if command == PROBE:
                probes.append(len(ran) - 1)
            return await self.inner.run(command, timeout_s)

    class WatchedSandbox:
        def __init__(self, inner) -> None:
            self.inner = inner

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        async def open_shell(self, **kwargs):
            return Watched(await self.inner.open_shell(**kwargs))

    @contextlib.asynccontextmanager
    async def acquire(request):
        async with acquire_from(provider)(request) as sandbox:
            yield WatchedSandbox(sandbox)

    journal = Journal.open(tmp_path / "journal", fsync_window_s=0)
    try:
        spec = EpisodeSpec("ep-1", task, "g-1", 0, get_format(FormatName.TOOL_CALLS), SamplingParams(max_tokens=64),
                           limits("rollout.max_turns=3"))
        ep = journal.episode("ep-1")
        await Episode(spec, policy, acquire, renderer, Transcript(None, task.id, "x"), journal=ep).run()
        turns = [f for k, f in read_events(journal.path_of("ep-1"))[0] if k == "turn"]
    finally:
        journal.close()
    assert len(turns) == 3 and probes == [1]
    assert turns[0]["shell"] is None and turns[2]["shell"] is None
    cwd, exports = turns[1]["shell"]
    assert "/tmp/w" in cwd and "T1_KEPT" in exports
