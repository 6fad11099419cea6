"""Compaction written by the policy (`rollout.compaction.mode: policy`) through real parts: a local sandbox over
SSH, the tiny model's chat template, TITO. The summary's sampled tokens close their segment as a generation of
their own (trained, no turn of the episode's: process rewards stay on the turns that earned them), the next
segment opens with it, and a malformed summary falls back to the rule's note."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_episode import _says, _task, limits

from t1.agent.compaction import NOTE_HEAD, SUMMARY_REQUEST
from t1.agent.episode import Episode, EpisodeSpec, acquire_from
from t1.agent.formats import FormatName, get_format
from t1.agent.scripted import STILL_NEEDED
from t1.agent.transcript import Transcript
from t1.coordinator.spool.journal import Journal, read_events
from t1.inference.types import GenerateRequest, GenerateResult, SamplingParams
from t1.metrics import registry as m
from t1.tasks.formats.dataset import load_task
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus

SUMMARY = "I listed the folders and wrote the word hello to /app/answer.txt; the padding is all that remains."


def _call(command: str) -> str:
    return f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{command}"}}}}\n</tool_call>'


def _policy(renderer, summary: str):
    """Pads the context with long listings, writes the answer at its third command, and answers every summary
    request with `summary`."""
    asked: list[str] = []

    async def policy(req: GenerateRequest) -> GenerateResult:
        prompt = renderer.decode(req.prompt_ids.tolist())
        if prompt.rstrip().endswith(SUMMARY_REQUEST) or SUMMARY_REQUEST in prompt[-len(SUMMARY_REQUEST) - 80:]:
            asked.append("summary")
            return _says(renderer, summary, req)
        n = sum(1 for a in asked if a != "summary")
        asked.append(f"turn {n}")
        command = "echo hello > /app/answer.txt" if n == 2 else f"seq 1 {50 + 5 * n}"
        return _says(renderer, _call(command), req)

    return policy, asked


def _spec(task, *overrides: str) -> EpisodeSpec:
    return EpisodeSpec("ep-c", task, "g", 0, get_format("tool_calls"), SamplingParams(max_tokens=96),
                       limits("rollout.max_turns=9", "rollout.max_context_tokens=1500",
                              "rollout.compaction.keep_last_turns=1", "reward.process_every_k_turns=1",
                              *overrides))


async def test_policy_summary_closes_its_segment_and_opens_the_next(tmp_path: Path, provider, renderers) -> None:
    task = load_task(_task(tmp_path, "t", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    policy, asked = _policy(renderer, SUMMARY)
    before = m.COMPACTIONS.labels(note="policy")._value.get()
    spec = _spec(task, "rollout.compaction.mode=policy")
    result = await Episode(
        spec, policy, acquire_from(provider), renderer, Transcript(tmp_path / "tx", task.id, "ep-c")
    ).run()
    assert result.status is EpisodeStatus.OK and result.report.resolved, result.failure_mode
    segs = result.trajectory.segments
    summaries = asked.count("summary")
    assert summaries >= 2 and len(segs) == summaries + 1, (asked, len(segs))
    assert m.COMPACTIONS.labels(note="policy")._value.get() - before == summaries
    assert result.turns == 9 and sum(len(s.turns) for s in segs) == 9 + summaries
    for seg, nxt in itertools.pairwise(segs):
        last = seg.turns[-1]
        # the summary is the closing generation: sampled (loss mask on), its own span, no reward of its own
        assert renderer.decode(seg.token_ids[last.start:last.end].tolist()).startswith(SUMMARY)
        assert seg.loss_mask[last.start:last.end].all() and last.reward == 0.0
        opening = renderer.decode(nxt.token_ids[:nxt.turns[0].start].tolist())
        assert f"Your summary of them:]\n{SUMMARY}" in opening and SUMMARY_REQUEST not in opening
    # process rewards sit on the command turns that earned them: the answer at the third command (+1 check)
    rewarded = [(i, j, t.reward) for i, s in enumerate(segs) for j, t in enumerate(s.turns) if t.reward]
    assert len(rewarded) == 1 and rewarded[0][2] == pytest.approx(1.0), rewarded
    i, j, _ = rewarded[0]
    text = renderer.decode(segs[i].token_ids[segs[i].turns[j].start:segs[i].turns[j].end].tolist())
    assert "echo hello" in text, text
    assert result.drift_tokens == 0
    loss = np.concatenate([s.token_ids[s.loss_mask] for s in segs])
    assert len(loss) == sum(t.end - t.start for s in segs for t in s.turns)  # every sampled token, once


async def test_a_summary_has_its_own_budget_beyond_a_turns(tmp_path: Path, provider, renderers) -> None:
    """`summary_max_tokens` above the turns' `max_tokens`: the summary request asks for the summary's budget (a
    summary longer than a command is not cut off); the turns keep theirs."""
    task = load_task(_task(tmp_path, "t", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    inner, asked = _policy(renderer, SUMMARY)
    budgets: list[int] = []

    async def policy(req: GenerateRequest) -> GenerateResult:
        budgets.append(req.sampling.max_tokens)
        return await inner(req)

    spec = replace(_spec(task, "rollout.compaction.mode=policy", "rollout.compaction.summary_max_tokens=100"),
                   sampling=SamplingParams(max_tokens=48))
    result = await Episode(spec, policy, acquire_from(provider), renderer, Transcript(None, task.id, "ep-c")).run()
    assert result.status is EpisodeStatus.OK and result.report.resolved
    kinds = [a == "summary" for a in asked]
    assert sum(kinds) >= 2 and {b for b, s in zip(budgets, kinds, strict=True) if s} == {100}, (asked, budgets)
    assert {b for b, s in zip(budgets, kinds, strict=True) if not s} == {48}


async def test_a_malformed_summary_falls_back_to_the_rule(tmp_path: Path, provider, renderers) -> None:
    task = load_task(_task(tmp_path, "t", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    policy, asked = _policy(renderer, _call("cat /app/answer.txt"))  # an action, not a summary
    before = m.COMPACTIONS.labels(note="fallback")._value.get()
    result = await Episode(_spec(task, "rollout.compaction.mode=policy"), policy, acquire_from(provider), renderer,
                           Transcript(None, task.id, "ep-c")).run()
    assert result.status is EpisodeStatus.OK and result.report.resolved
    segs = result.trajectory.segments
    assert asked.count("summary") >= 1 and len(segs) == asked.count("summary") + 1
    assert m.COMPACTIONS.labels(note="fallback")._value.get() - before == asked.count("summary")
    opening = renderer.decode(segs[1].token_ids[:segs[1].turns[0].start].tolist())
    assert "Commands run so far:" in opening and "Your summary" not in opening


async def test_rule_mode_asks_for_no_summary(tmp_path: Path, provider, renderers) -> None:
    task = load_task(_task(tmp_path, "t", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    policy, asked = _policy(renderer, SUMMARY)
    result = await Episode(
        _spec(task), policy, acquire_from(provider), renderer, Transcript(None, task.id, "ep-c")
    ).run()
    assert "summary" not in asked and len(result.trajectory.segments) >= 2 and result.drift_tokens == 0
    last = result.trajectory.segments[-1]
    assert renderer.decode(last.token_ids[:last.turns[0].start].tolist()).count(NOTE_HEAD) == 1  # not piled up
    assert sum(len(s.turns) for s in result.trajectory.segments) == result.turns == 9


@pytest.mark.slow
async def test_journaled_policy_compaction_exports_what_memory_does(tmp_path: Path, provider, renderers) -> None:
    """The summaries go through the journal as generations marked `summary`: the export from disk equals the
    in-memory one byte for byte, process rewards included, and every note replaces the one before it."""
    task = load_task(_task(tmp_path, "t", "hello"))
    renderer = renderers[FormatName.TOOL_CALLS]
    journal = Journal.open(tmp_path / "journal", fsync_window_s=0.05)
    payloads = []
    try:
        for name, j in (("plain", None), ("journaled", journal.episode("ep-c"))):
            policy, _ = _policy(renderer, SUMMARY)
            result = await Episode(_spec(task, "rollout.compaction.mode=policy"), policy, acquire_from(provider),
                                   renderer, Transcript(None, task.id, name), journal=j).run()
            assert result.status is EpisodeStatus.OK and result.drift_tokens == 0
            last = result.trajectory.segments[-1]
            assert renderer.decode(last.token_ids[:last.turns[0].start].tolist()).count(NOTE_HEAD) == 1
            payloads.append(encode_trajectory(replace(result.trajectory, timings=())))
        assert payloads[0] == payloads[1]
        gens = [f for k, f in read_events(journal.path_of("ep-c"))[0] if k == "gen"]
        assert sum(bool(f.get("summary")) for f in gens) >= 2
    finally:
        journal.close()


def test_the_teachers_summary_quotes_what_fits_its_budget(tmp_path: Path, renderers) -> None:
    """The teacher quotes each needed value in the line that showed it, earliest first, as many lines as fit the
    summary's budget; an earlier summary's quotes are quoted again one by one."""
    import random as _random

    from t1.agent.scripted import ScriptedPolicy
    from t1.tasks.synth.base import write_task
    from t1.tasks.synth.long_tier import job_queue

    synth = job_queue(_random.Random(3))
    ticket, target = synth.turns[-1].removeprefix("echo ").split(" > ")
    value, path = synth.turns[1].removeprefix("echo ").split(" > ")
    ticket_line = f"ticket: {ticket} (write it to {target} when the queue is empty)"
    job_line = f"job {path.removeprefix('out/').removesuffix('.txt')}: write {value} to {path}"
    first = synth.turns[0]
    renderer = renderers[FormatName.TOOL_CALLS]
    task = load_task(write_task(synth, tmp_path, "queue", "train", 3))
    teacher = ScriptedPolicy(renderer).for_episode(task, get_format("tool_calls"))
    teacher.calls = 1  # `bash next.sh` ran and showed the ticket and the first job
    conversation = f"Work through the job queue.\n{first}\n{ticket_line}\n{job_line}\n[exit code 0]\n"
    full = teacher._summary(conversation, 200)
    assert full == f"I ran 1 commands, the last: {first}. {STILL_NEEDED} {ticket_line}; {job_line}"
    head = f"I ran 1 commands, the last: {first}."
    fit = len(renderer.encode(f"{head} {STILL_NEEDED} {ticket_line}")) + len(renderer.end_of_turn_ids)
    assert teacher._summary(conversation, fit) == f"{head} {STILL_NEEDED} {ticket_line}"
    assert teacher._summary(conversation, fit - 1) == head
    # after a compaction the ticket is shown only by the last summary: quoted from it, as it was shown
    teacher.calls = 2
    later = f"[Earlier turns were compacted.]\n{full}\n{synth.turns[1]}\n[exit code 0]\n"
    assert teacher._summary(later, 200) == f"I ran 2 commands, the last: {synth.turns[1]}. {STILL_NEEDED} {ticket_line}"


def _chain(tmp_path: Path):
    """A file_chain task of the long tier, and the target its first file names."""
    import random as _random

    from t1.tasks.synth.base import write_task
    from t1.tasks.synth.long_tier import file_chain

    synth = file_chain(_random.Random(5))
    task = load_task(write_task(synth, tmp_path, "chain", "train", 5))
    return synth, task, synth.turns[-1].split("> ")[1].removesuffix(".txt")


@pytest.mark.parametrize("lossy", [0.0, 1.0])
async def test_the_teacher_writes_summaries_some_lossy(tmp_path: Path, provider, renderers, lossy: float) -> None:
    """The oracle teacher answers a summary request with what the rest of the task needs that the machine showed
    (file_chain: the target only its first file names); a lossy summary drops it. The episode resolves either way
    (the teacher knows its commands): what the summary carries is what a learning policy would need."""
    _, task, target = _chain(tmp_path)
    renderer = renderers[FormatName.TOOL_CALLS]
    from t1.agent.scripted import ScriptedPolicy

    scripted = ScriptedPolicy(renderer, lossy_share=lossy).for_episode(task, get_format("tool_calls"))
    spec = EpisodeSpec("ep-t", task, "g", 0, get_format("tool_calls"), SamplingParams(max_tokens=96),
                       limits("rollout.max_turns=40", "rollout.max_context_tokens=1500",
                              "rollout.compaction.mode=policy", "rollout.compaction.keep_last_turns=1",
                              "rollout.compaction.max_segments=30"))
    result = await Episode(
        spec, scripted, acquire_from(provider), renderer, Transcript(tmp_path / "tx", task.id, "t")
    ).run()
    assert result.status is EpisodeStatus.OK and result.report.resolved and result.drift_tokens == 0
    assert len(scripted.summaries) >= 2 and len(result.trajectory.segments) == len(scripted.summaries) + 1
    # the target is quoted as the first file showed it (`target: red`), in every summary after it was shown
    carried = [f"{STILL_NEEDED} target: {target}" in s for s in scripted.summaries if STILL_NEEDED in s]
    if lossy:
        assert not any(STILL_NEEDED in s for s in scripted.summaries), scripted.summaries
    else:
        assert carried and all(carried), scripted.summaries


@pytest.mark.parametrize(("mode", "window"), [("rule", 3000), ("policy", 1500)])  # the rule's note lists every command
async def test_the_teachers_notes_carry_an_early_value_reply_to_reply(tmp_path: Path, provider, renderers,
                                                                       mode: str, window: int) -> None:
    """With notes, every reply after the first file's output opens with the target quoted as that file showed it,
    up to the reply that types it, across compactions (the kept last turn carries the note): the demonstrations
    copy it from the output just above, then from the reply before, never from far back."""
    synth, task, target = _chain(tmp_path)
    renderer = renderers[FormatName.TOOL_CALLS]
    from t1.agent.scripted import ScriptedPolicy

    scripted = ScriptedPolicy(renderer, notes=True).for_episode(task, get_format("tool_calls"))
    spec = EpisodeSpec("ep-n", task, "g", 0, get_format("tool_calls"), SamplingParams(max_tokens=96),
                       limits("rollout.max_turns=40", f"rollout.max_context_tokens={window}",
                              f"rollout.compaction.mode={mode}", "rollout.compaction.keep_last_turns=1",
                              "rollout.compaction.max_segments=30"))
    result = await Episode(
        spec, scripted, acquire_from(provider), renderer, Transcript(tmp_path / "tx", task.id, "t")
    ).run()
    assert result.status is EpisodeStatus.OK and result.report.resolved and result.drift_tokens == 0
    assert len(result.trajectory.segments) >= 2
    replies = []
    for seg in result.trajectory.segments:
        spans = np.split(np.arange(len(seg.token_ids)), np.nonzero(np.diff(seg.loss_mask.astype(np.int8)))[0] + 1)
        replies += [renderer.decode(seg.token_ids[s].tolist()) for s in spans if seg.loss_mask[s[0]]]
    actions = [r for r in replies if "<tool_call>" in r]  # the summaries (policy mode) are no actions
    note = f"{STILL_NEEDED} target: {target}\n<tool_call>"
    assert len(actions) == len(synth.turns) + 1
    assert STILL_NEEDED not in actions[0]  # the target is shown by the first output
    assert all(note in r for r in actions[1:len(synth.turns) - 1]), actions
    assert not any(STILL_NEEDED in r for r in actions[len(synth.turns) - 1:])  # the echo types it; then finish


def test_the_teacher_quotes_the_machine_never_the_chat_template(renderers) -> None:
    """A later command touches `user.cfg`: the teacher quotes the output that named it, not `<|im_start|>user`."""
    from t1.agent.scripted import ScriptedEpisode, ScriptedPolicy

    renderer = renderers[FormatName.TOOL_CALLS]
    fmt = get_format("tool_calls")
    teacher = ScriptedEpisode(ScriptedPolicy(renderer, notes=True), fmt, ("bash svc.sh sync", "ls", "touch user.cfg"),
                              "Bring the service up.", "t")
    teacher.calls = 2
    conversation = renderer.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Bring the service up."},
         {"role": "assistant", "content": _call("bash svc.sh sync")},
         {"role": "tool", "content": "error: sync needs user.cfg\n[exit code 1]"},
         {"role": "assistant", "content": _call("ls")}, {"role": "tool", "content": "svc.sh\n[exit code 0]"}],
        tokenize=False, add_generation_prompt=True)
    assert [line for line in conversation.splitlines() if "user" in line][-1] == "<|im_start|>user"  # shown last
    assert teacher._noted(conversation, "ACTION", 200) == f"{STILL_NEEDED} error: sync needs user.cfg\nACTION"
    assert teacher._summary(conversation, 200).endswith(f"{STILL_NEEDED} error: sync needs user.cfg")
