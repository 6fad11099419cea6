# ruff: noqa: RUF001  (DeepSeek's special tokens are written with FULLWIDTH VERTICAL LINE)
"""The chat templates of the families teams train (tests/fixtures/chat_templates), and tool sessions run
through a TokenBuffer under each, with thinking on and off and with a user message mid-episode.

The sampler is a model that writes what its template writes: each turn's text is the template's own
rendering of the assistant message as the conversation's last one, after the generation prompt the buffer
gave it, up to its end-of-turn or stop text, tokenized canonically except one word that is sampled one
character per token (a real model samples such non-canonical splits; a re-tokenizing pipeline changes
them). Tokenizers are byte-level BPEs trained here with each family's special tokens, or, for the Qwen
families, the real Qwen tokenizer (t1.model.qwen_tokenizer) when given.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from t1.inference.types import FinishReason, GenerateResult
from t1.tito.buffer import MismatchPolicy, TokenBuffer
from t1.tito.diagnostics import retokenize_mismatch, segment_drift
from t1.tito.render import ChatRenderer, Message, turn_ends
from t1.trajectory.types import EpisodeStatus

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
QWEN_STOPS = ("<|im_end|>", "<|endoftext|>")
QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
                "</tool_response>", "<think>", "</think>")


@dataclass(frozen=True)
class RealFamily:
    name: str
    template: str                              # file stem under TEMPLATES
    special: tuple[str, ...]
    eos: str                                   # the tokenizer's eos token
    sampler_stops: tuple[str, ...] = ()        # what the sampler stops on (generation_config.json's eos ids)
    thinking: Callable[[bool], dict[str, Any]] | None = None  # template kwargs; None: no thinking switch
    reasoning_key: str = "reasoning_content"
    json_arguments: bool = False               # tool-call arguments as a JSON string (DeepSeek)
    content_with_tool_calls: bool = True       # gpt-oss: a tool-call turn's text is its analysis, not content
    close: Callable[[Message], str] | None = None  # the stop token a model samples after the template's text
    bos: str = ""                              # a template that writes bos_token (DeepSeek)
    qwen: bool = False                         # the Qwen vocabulary: the real Qwen tokenizer fits it

    def chat_template(self) -> str:
        return (TEMPLATES / f"{self.template}.jinja").read_text()


def _enable_thinking(on: bool) -> dict[str, Any]:
    return {"enable_thinking": on}


FAMILIES: dict[str, RealFamily] = {
    f.name: f
    for f in (
        RealFamily("qwen3", "qwen3", QWEN_SPECIAL, "<|im_end|>", QWEN_STOPS, thinking=_enable_thinking, qwen=True),
        RealFamily("qwen3.5", "qwen3_5", QWEN_SPECIAL, "<|im_end|>", QWEN_STOPS, thinking=_enable_thinking, qwen=True),
        RealFamily("qwen3-coder", "qwen3_coder", QWEN_SPECIAL, "<|im_end|>", QWEN_STOPS, qwen=True),
        RealFamily(
            "glm-4.6",
            "glm4_6",
            (
                "[gMASK]",
                "<sop>",
                "<|system|>",
                "<|user|>",
                "<|assistant|>",
                "<|observation|>",
                "<think>",
                "</think>",
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
                "<tool_response>",
                "</tool_response>",
                "<|endoftext|>",
            ),
            "<|endoftext|>",
            ("<|endoftext|>", "<|user|>", "<|observation|>"),
            thinking=_enable_thinking,
            close=lambda m: "<|observation|>" if m.get("tool_calls") else "<|user|>",
        ),
        RealFamily(
            "deepseek-v3.1",
            "deepseek_v3_1",
            (
                "<｜begin▁of▁sentence｜>",
                "<｜end▁of▁sentence｜>",
                "<｜User｜>",
                "<｜Assistant｜>",
                "<think>",
                "</think>",
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁calls▁end｜>",
                "<｜tool▁call▁begin｜>",
                "<｜tool▁call▁end｜>",
                "<｜tool▁sep｜>",
                "<｜tool▁output▁begin｜>",
                "<｜tool▁output▁end｜>",
            ),
            "<｜end▁of▁sentence｜>",
            thinking=lambda on: {"thinking": on},
            json_arguments=True,
            bos="<｜begin▁of▁sentence｜>",
        ),
        RealFamily(
            "kimi-k2",
            "kimi_k2",
            (
                "<|im_end|>",
                "<|im_user|>",
                "<|im_assistant|>",
                "<|im_system|>",
                "<|im_middle|>",
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
            ),
            "<|im_end|>",
        ),
        RealFamily(
            "gpt-oss",
            "gpt_oss",
            (
                "<|start|>",
                "<|end|>",
                "<|message|>",
                "<|channel|>",
                "<|constrain|>",
                "<|call|>",
                "<|return|>",
                "<|endoftext|>",
            ),
            "<|return|>",
            ("<|return|>", "<|endoftext|>", "<|call|>"),
            thinking=lambda on: {"reasoning_effort": "medium" if on else "low"},
            reasoning_key="thinking",
            content_with_tool_calls=False,
        ),
    )
}


class Scenario:
    TOOLS = "tools"              # five tool turns and a final answer, one user message
    USER_MID = "user_mid"        # two tool turns, an answer, a new user message, two tool turns, an answer


def make_tokenizer(fam: RealFamily, qwen_tokenizer: Any = None) -> Any:
    """A transformers tokenizer with the family's template: the real Qwen one when given (Qwen families),
    else a small byte-level BPE trained here with the family's special tokens."""
    import copy

    from tito_families import _train

    if fam.qwen and qwen_tokenizer is not None:
        tok = copy.copy(qwen_tokenizer)
        tok.chat_template = fam.chat_template()
        return tok
    tok = _train(list(fam.special), fam.chat_template(), fam.eos)
    if fam.bos:
        tok.add_special_tokens({"bos_token": fam.bos})
    return tok


@dataclass
class SessionResult:
    """What one scenario run produced, for the assertions and for docs/fidelity.md's table."""

    buffer: TokenBuffer
    renderer: ChatRenderer
    messages: list[Message]
    sampled: list[list[tuple[int, np.ndarray]]] = field(default_factory=list)  # per segment: (start, ids)
    drift: int = 0
    retokenized: tuple[int, int] = (0, 0)
    # per observation: the buffer's context decodes to the template's own rendering of the conversation
    equals_template: list[bool] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        c = self.buffer.counters.template_mismatches
        if c == 0:
            return "one segment"
        causes = ", ".join(f"{k.value} {v}" for k, v in sorted(self.buffer.mismatch_causes.items()))
        if self.buffer.on_mismatch is MismatchPolicy.NEW_SEGMENT:
            return f"{self.buffer.num_segments} segments ({causes})"
        return f"repaired ({causes})"


def _tool_call(fam: RealFamily, i: int) -> dict[str, Any]:
    args: Any = {"command": f"ls -la /work/step{i}"}
    return {
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps(args) if fam.json_arguments else args},
    }


def assistant_message(fam: RealFamily, i: int, thinking: bool, tool: bool) -> Message:
    text = f"I will list the files of step {i}." if tool else f"All files of step {i} are listed."
    m: Message = {"role": "assistant", "content": text}
    if tool:
        m["tool_calls"] = [_tool_call(fam, i)]
        if not fam.content_with_tool_calls:
            m["content"] = ""
    if thinking and fam.thinking is not None:
        m[fam.reasoning_key] = f"The user wants the files; step {i} comes next."
    return m


def sampled_text(fam: RealFamily, r: ChatRenderer, conversation: list[Message], message: Message) -> str:
    """What a model trained on the template samples for `message` after the buffer's generation prompt."""
    opening = r.render(conversation, True)
    full = r.render([*conversation, message], False)
    if not full.startswith(opening):  # the template rewrites history once it ends here (gpt-oss drops the
        #                                analysis of earlier tool calls): the turn as written after a user message
        neutral = [{"role": "user", "content": "x"}]
        opening, full = r.render(neutral, True), r.render([*neutral, message], False)
    if full.startswith(opening):
        text = full[len(opening):]
    elif opening.endswith("<think>") and full.startswith(opening[:-len("<think>")] + "</think>"):
        # DeepSeek-V3.1 thinking: the prompt opens a think block; the model closes it after its reasoning.
        text = str(message.get(fam.reasoning_key, "")) + full[len(opening) - len("<think>"):]
    else:
        raise AssertionError(f"{fam.name}: the template's turn does not follow its own generation prompt")
    m = r._ends.search(text)
    if m:
        return text[:m.end()]
    return text + (fam.close(message) if fam.close else r.end_of_turn)


def _sample_ids(r: ChatRenderer, text: str) -> list[int]:
    """Canonical ids, except the first word 'files' sampled one character per token."""
    at = text.find("files")
    if at < 0:
        return r.encode(text)
    return r.encode(text[:at]) + [i for c in "files" for i in r.encode(c)] + r.encode(text[at + 5:])


def family_renderer(fam: RealFamily, tokenizer: Any, thinking: bool) -> ChatRenderer:
    """The renderer of a family's sessions: its bash tool, its end of turn and stops as the coordinator finds them."""
    kwargs = fam.thinking(thinking) if fam.thinking is not None else {}
    tools = [{"type": "function", "function": {
        "name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                       "required": ["command"]}}}]
    eot, stops = turn_ends(tokenizer, fam.eos, fam.sampler_stops, kwargs)
    return ChatRenderer(tokenizer, end_of_turn=eot, stop_texts=stops, tools=tools, template_kwargs=kwargs)


def run_session(fam: RealFamily, tokenizer: Any, scenario: str, thinking: bool,
                policy: MismatchPolicy = MismatchPolicy.REPAIR) -> SessionResult:
    r = family_renderer(fam, tokenizer, thinking)
    opening: list[Message] = [{"role": "system", "content": "You are a shell agent."},
                              {"role": "user", "content": "List the files of every step."}]
    buf = TokenBuffer(r, opening, on_mismatch=policy, full_check_every=1)
    res = SessionResult(buf, r, list(opening))
    plan = ([("tool", None)] * 5 + [("answer", None)] if scenario == Scenario.TOOLS else
            [("tool", None)] * 2 + [("answer", "Now count them.")] + [("tool", None)] * 2 + [("answer", None)])
    records: list[list[tuple[int, np.ndarray]]] = [[]]
    for i, (kind, then_user) in enumerate(plan):
        message = assistant_message(fam, i, thinking, tool=kind == "tool")
        ids = _sample_ids(r, sampled_text(fam, r, res.messages, message))
        if len(records) < buf.num_segments:
            records.extend([] for _ in range(buf.num_segments - len(records)))
        records[-1].append((len(buf.prompt_ids()), np.asarray(ids, np.int32)))
        buf.append_generation(GenerateResult(
            token_ids=np.asarray(ids, np.int32), logprobs=np.full(len(ids), -0.5, np.float32),
            finish_reason=FinishReason.STOP, policy_version=1, token_versions=np.full(len(ids), 1, np.int32),
            routing=None, prompt_tokens=len(buf.prompt_ids())), message)
        res.messages.append(message)
        if i == len(plan) - 1:
            break
        obs: list[Message] = ([{"role": "tool", "content": f"a.txt\nb{i}.txt", "tool_call_id": f"call_{i}"}]
                              if kind == "tool" else [{"role": "user", "content": then_user}])
        buf.append_observation(obs)
        res.messages.extend(obs)
        res.equals_template.append(r.decode(buf.prompt_ids().tolist()) == r.render(res.messages, True))
    traj = buf.export(id="e", task_id="t", group_id="g", attempt=0, reward=1.0, status=EpisodeStatus.OK)
    records.extend([] for _ in range(buf.num_segments - len(records)))
    res.sampled = [rec for rec in records if rec]
    res.drift = sum(segment_drift(seg, rec) for seg, rec in zip(traj.segments, res.sampled, strict=True))
    changed = total = 0
    for seg in traj.segments:
        c, t = retokenize_mismatch(seg, r.encode, r.decode)
        changed, total = changed + c, total + t
    res.retokenized = (changed, total)
    return res
