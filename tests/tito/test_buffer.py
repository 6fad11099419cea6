"""TokenBuffer behaviour on hand-built turns: exact deltas, repairs, template mismatches, compaction, errors."""

from __future__ import annotations

import numpy as np
import pytest
from tito_families import get_family

from t1.inference.types import FinishReason, GenerateResult
from t1.tito.buffer import MismatchPolicy, TokenBuffer
from t1.tito.render import ChatRenderer
from t1.trajectory.types import EpisodeStatus

OPENING = [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": "List files."}]


def renderer_for(name: str) -> ChatRenderer:
    fam = get_family(name)
    return ChatRenderer(fam.tokenizer, end_of_turn=fam.end_of_turn)


def sampled(r: ChatRenderer, text: str, stop: bool = True, prompt_len: int = 0) -> GenerateResult:
    """A generation whose tokens are the canonical tokenization of text (+ end of turn when stopped)."""
    ids = r.encode(text) + (list(r.end_of_turn_ids) if stop else [])
    return GenerateResult(token_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.5, np.float32),
                          finish_reason=FinishReason.STOP if stop else FinishReason.LENGTH, policy_version=1,
                          token_versions=np.full(len(ids), 1, np.int32), routing=None, prompt_tokens=prompt_len)


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_clean_episode_is_the_canonical_rendering(name):
    r = renderer_for(name)
    buf = TokenBuffer(r, OPENING)
    msgs = list(OPENING)
    for i in range(3):
        buf.append_generation(sampled(r, f"I will run ls number {i}.", prompt_len=len(buf.prompt_ids())))
        msgs.append({"role": "assistant", "content": f"I will run ls number {i}."})
        obs = [{"role": "tool" if name == "chatml" else "ipython", "content": f"a.txt\nb{i}.txt"}]
        buf.append_observation(obs)
        msgs.extend(obs)
        assert r.decode(buf.prompt_ids().tolist()) == r.render(msgs, add_generation_prompt=True)
    assert buf.counters.repaired_turns == 0 and buf.counters.template_mismatches == 0


def test_length_stop_gets_end_of_turn_appended_masked():
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING)
    buf.append_generation(sampled(r, "cut off mid", stop=False))
    buf.append_observation([{"role": "tool", "content": "ok"}])
    buf.append_generation(sampled(r, "next", prompt_len=len(buf.prompt_ids())))
    seg = buf.segments()[0]
    t = seg.turns[0]
    eot = list(r.end_of_turn_ids)
    assert seg.token_ids[t.end:t.end + len(eot)].tolist() == eot
    assert not seg.loss_mask[t.end:seg.turns[1].start].any()
    assert buf.counters.repaired_turns == 1 and buf.counters.masked_tokens == len(eot)
    assert r.decode(seg.token_ids.tolist()).endswith(
        "cut off mid<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nnext<|im_end|>")


def test_stripped_reasoning_is_kept_and_counted_under_repair():
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING)
    text = "<think>\nlook first\n</think>\n\nls -la"
    buf.append_generation(sampled(r, text))
    buf.append_observation([{"role": "user", "content": "now count them"}])
    decoded = r.decode(buf.prompt_ids().tolist())
    assert "look first" in decoded  # the sampled reasoning stays in the exact context
    assert decoded.endswith("ls -la<|im_end|>\n<|im_start|>user\nnow count them<|im_end|>\n<|im_start|>assistant\n")
    assert buf.counters.template_mismatches == 1
    assert len(buf.segments()) == 1


def test_stripped_reasoning_starts_a_new_segment_under_new_segment_policy():
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING, on_mismatch=MismatchPolicy.NEW_SEGMENT)
    text = "<think>\nlook first\n</think>\n\nls -la"
    buf.append_generation(sampled(r, text))
    buf.append_observation([{"role": "user", "content": "now count them"}])
    assert buf.num_segments == 2 and buf.counters.template_mismatches == 1
    rerendered = r.decode(buf.prompt_ids().tolist())
    buf.append_generation(sampled(r, "3", prompt_len=len(buf.prompt_ids())))
    segs = buf.segments()
    assert "look first" in r.decode(segs[0].token_ids.tolist())
    assert "look first" not in rerendered and segs[1].loss_mask.sum() == 2
    assert rerendered == r.render([*OPENING, {"role": "assistant", "content": text},
                                   {"role": "user", "content": "now count them"}], add_generation_prompt=True)


def test_reserialised_tool_call_is_a_counted_mismatch_and_keeps_sampled_ids():
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING)
    raw = '<tool_call>\n{"name":"bash","arguments":{"cmd":"ls"}}\n</tool_call>'
    res = sampled(r, raw)
    parsed = {"role": "assistant", "content": "", "tool_calls": [{"name": "bash", "arguments": {"cmd": "ls"}}]}
    buf.append_generation(res, parsed)
    buf.append_observation([{"role": "tool", "content": "a.txt"}])
    seg = buf.segments()[0]
    t = seg.turns[0]
    assert np.array_equal(seg.token_ids[t.start:t.end], res.token_ids)
    assert buf.counters.template_mismatches == 1


def test_compaction_starts_a_segment_and_turn_rewards_are_episode_wide():
    r = renderer_for("llama3")
    buf = TokenBuffer(r, OPENING)
    buf.append_generation(sampled(r, "first"))
    buf.compact([OPENING[0], {"role": "user", "content": "Summary: ran ls."}])
    buf.append_generation(sampled(r, "second"))
    buf.append_observation([{"role": "user", "content": "done?"}])
    traj = buf.export(id="e", task_id="t", group_id="g", attempt=1, reward=2.0, status=EpisodeStatus.OK,
                      turn_rewards={0: 0.5, 1: 1.5})
    assert [s.turns[0].reward for s in traj.segments] == [0.5, 1.5]
    assert r.decode(traj.segments[1].token_ids.tolist()).startswith(r.render(
        [OPENING[0], {"role": "user", "content": "Summary: ran ls."}], add_generation_prompt=True))


def test_bad_calls_are_rejected_with_clear_errors():
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING)
    with pytest.raises(ValueError, match="follow an assistant turn"):
        buf.append_observation([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="prompt"):
        buf.append_generation(sampled(r, "x", prompt_len=3))
    with pytest.raises(ValueError, match="opening message"):
        TokenBuffer(r, [])


THINK = "<think>\nplan the listing\n</think>\n\nls"


def deep_rewrite_episode(buf: TokenBuffer, r: ChatRenderer) -> None:
    """Reasoning in a turn three turns before a new user query: Qwen3-style templates strip it then,
    outside the anchor (the last two assistant turns), so only the full-history check can see it."""
    buf.append_generation(sampled(r, THINK, prompt_len=len(buf.prompt_ids())))
    buf.append_observation([{"role": "tool", "content": "a.txt"}])
    buf.append_generation(sampled(r, "more", prompt_len=len(buf.prompt_ids())))
    buf.append_observation([{"role": "tool", "content": "b.txt"}])
    buf.append_generation(sampled(r, "done", prompt_len=len(buf.prompt_ids())))
    buf.append_observation([{"role": "user", "content": "and now?"}])


@pytest.mark.parametrize("check_every", [1, 0])
def test_rewrite_beyond_the_anchor_is_counted_by_the_full_check(check_every):
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING, full_check_every=check_every)
    deep_rewrite_episode(buf, r)
    assert buf.counters.template_mismatches == (1 if check_every else 0)  # 0: not checked before export
    assert "plan the listing" in r.decode(buf.prompt_ids().tolist())      # the sampled tokens stay
    buf.append_generation(sampled(r, "ok", prompt_len=len(buf.prompt_ids())))
    buf.export(id="e", task_id="t", group_id="g", attempt=0, reward=0.0, status=EpisodeStatus.OK)
    assert buf.counters.template_mismatches == 1  # counted once per divergence, at export at the latest


def test_rewrite_beyond_the_anchor_starts_a_new_segment_under_new_segment_policy():
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING, on_mismatch=MismatchPolicy.NEW_SEGMENT, full_check_every=1)
    deep_rewrite_episode(buf, r)
    assert buf.num_segments == 2 and buf.counters.template_mismatches == 1
    assert r.decode(buf.prompt_ids().tolist()) == r.render(
        [*OPENING, {"role": "assistant", "content": THINK}, {"role": "tool", "content": "a.txt"},
         {"role": "assistant", "content": "more"}, {"role": "tool", "content": "b.txt"},
         {"role": "assistant", "content": "done"}, {"role": "user", "content": "and now?"}], add_generation_prompt=True)


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_anchored_deltas_equal_the_full_rendering_over_a_long_mixed_episode(name):
    r = renderer_for(name)
    buf = TokenBuffer(r, OPENING, full_check_every=1)
    msgs = list(OPENING)
    tool = "tool" if name == "chatml" else "ipython"
    for i in range(12):
        buf.append_generation(sampled(r, f"step {i}", prompt_len=len(buf.prompt_ids())))
        msgs.append({"role": "assistant", "content": f"step {i}"})
        obs = ([{"role": "user", "content": f"go on {i}"}] if i % 3 == 2 else
               [{"role": tool, "content": f"out {i}"}, {"role": tool, "content": "more"}][:1 + i % 2])
        buf.append_observation(obs)
        msgs.extend(obs)
    assert r.decode(buf.prompt_ids().tolist()) == r.render(msgs, add_generation_prompt=True)
    assert buf.counters.template_mismatches == 0


def test_prompt_ids_is_a_read_only_view_that_later_turns_do_not_change():
    r = renderer_for("llama3")
    buf = TokenBuffer(r, OPENING)
    before = buf.prompt_ids()
    kept = before.copy()
    assert before.dtype == np.int32 and not before.flags.writeable
    for i in range(40):  # past the first capacity doubling
        buf.append_generation(sampled(r, f"echo {i} " * 8, prompt_len=len(buf.prompt_ids())))
        buf.append_observation([{"role": "user", "content": "again " * 10}])
    assert np.array_equal(before, kept) and np.array_equal(buf.prompt_ids()[:len(kept)], kept)
    assert buf.prompt_ids().base is buf.prompt_ids().base  # a view of the same storage, not a copy per call
    with pytest.raises(ValueError):
        buf.prompt_ids()[0] = 1
    with pytest.raises(ValueError, match="full_check_every"):
        TokenBuffer(r, OPENING, full_check_every=-1)


def test_ids_handed_out_never_change_in_the_array_they_view():
    """The contract SentContexts trusts: a view's base array keeps its ids up to the view's end, through
    appends, capacity growth, a repaired mismatch, a NEW_SEGMENT mismatch and a compaction."""
    r = renderer_for("chatml")
    buf = TokenBuffer(r, OPENING, on_mismatch=MismatchPolicy.NEW_SEGMENT)
    handed: list[tuple[np.ndarray, np.ndarray]] = []

    def hand_out() -> None:
        view = buf.prompt_ids()
        assert isinstance(view.base, np.ndarray) and view.ctypes.data == view.base.ctypes.data
        handed.append((view, view.copy()))

    for i in range(30):
        hand_out()
        text = "<think>\nhmm\n</think>\n\nls" if i == 10 else f"echo {i} " * 6  # i == 10: stripped reasoning
        buf.append_generation(sampled(r, text, prompt_len=len(buf.prompt_ids())))
        buf.append_observation([{"role": "user", "content": f"output {i} " * 8}])
        if i == 20:
            buf.compact([OPENING[0], {"role": "user", "content": "Summary so far."}])
    hand_out()
    assert buf.num_segments == 3 and buf.counters.template_mismatches == 1
    for view, kept in handed:
        assert np.array_equal(view, kept)
        assert np.array_equal(view.base[:len(kept)], kept)
