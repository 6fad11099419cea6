"""Chat-template rendering for TITO: the opening prompt and the text of each observation delta.

Only template text is ever tokenized here; sampled tokens stay ids in the buffer. Content of messages the
policy did not write that spells a control token's text is tokenized as plain text (control_text.py). The delta of new
messages is the text the template writes after the last assistant turn once they are appended, up to
and including the generation prompt. The turn itself is the sampler's: the delta starts where the
sampled tokens stopped (after the end-of-turn text, or after a stop text such as GLM's `<|observation|>`
that also opens the next message).

The delta is rendered in a bounded anchor, not the whole history: the turn's context (the previous
assistant turn and what followed it, after a neutral user message; on the first turn, the opening
messages), the last assistant message, then the new messages. The context is real, so a template whose
generation prompt depends on what came before (DeepSeek-V3.1 writes none after a tool result) renders
the prompt the sampler saw. Its cost does not grow with the context. What the anchor cannot see (a
template rewriting turns further back) is caught by the full-history check (`history_matches`), which
the buffer runs every few turns and when a segment ends.

A template that renders the turn differently from the sampled text (drops its reasoning, writes an
empty think block in the prompt but not in the history, re-serialises tool calls) gives a Delta with a
MismatchCause; its text is still the rendering of the new messages, found after the turn's end text
in the anchor, so the buffer can keep its tokens and continue. No delta raises on a template that
passed the load-time probe (`ChatRenderer.__init__`): a template that cannot render an observation
after an assistant turn at all is refused there, with the reason.

Fast path (default; fast=False is the reference path it is measured and tested against): the anchor
renders go through a TemplateMemo (a learnt conversation shape renders by concatenation, verified
against the template; template_memo.py) and encode/decode call the `tokenizers` backend directly
when that is provably the transformers wrapper's computation (codec.py). The full-history check and
the opening prompt always render with the template.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from t1.tito.control_text import ControlText, control_texts
from t1.tito.template_memo import TemplateMemo
from t1.tito.tokenizer_fast_path import DirectCodec, direct_codec

Message = dict[str, Any]

# The neutral user turn an anchor starts with when the real context is a later turn.
NEUTRAL: Message = {"role": "user", "content": "x"}
# Message fields templates read reasoning from (Qwen3, GLM: reasoning_content; gpt-oss: thinking).
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_THINK = re.compile(r"<think>(.*?)</think>", re.S)


class MismatchCause(StrEnum):
    """Why the template's rendering differs from the buffer's tokens (counted per cause)."""

    GENERATION_PROMPT = "generation_prompt"  # the turn opens differently in history than in the prompt
    #                                          sampled on (Qwen3 thinking off: an empty think block)
    REASONING = "reasoning"                  # the turn's reasoning dropped or rewritten
    TOOL_CALLS = "tool_calls"                # the turn's tool calls re-serialised
    TURN = "turn"                            # the turn's text otherwise re-rendered (whitespace, its close)
    HISTORY = "history"                      # earlier turns rewritten (the full-history check)


class ChatTokenizer(Protocol):
    """What TITO needs from a Hugging Face tokenizer (PreTrainedTokenizerBase satisfies it)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...
    def encode(self, text: str, **kwargs: Any) -> list[int]: ...
    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True, slots=True)
class Delta:
    """Text to append after the buffer, and why the template renders the turn otherwise (None: it does not)."""

    text: str
    cause: MismatchCause | None = None


class ChatRenderer:
    """Renders conversations with the tokenizer's chat template; tokenizes template text only.

    end_of_turn: the text that closes an assistant turn (appended, masked, to a turn that stopped
    without it). stop_texts: other texts a turn may end with (gpt-oss `<|return|>`, GLM `<|user|>`).
    Raises ValueError when the template cannot render an observation after an assistant turn (probed
    here, at load, so that no episode meets it midway)."""

    def __init__(self, tokenizer: ChatTokenizer, *, end_of_turn: str, tools: Sequence[dict] | None = None,
                 template_kwargs: dict[str, Any] | None = None, fast: bool = True,
                 stop_texts: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        self.stop_texts = tuple(s for s in stop_texts if s and s != end_of_turn)
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})
        self._codec: DirectCodec | None = direct_codec(tokenizer, end_of_turn) if fast else None
        self.control = ControlText(control_texts(tokenizer), self.encode, self.decode)
        self.memo: TemplateMemo | None = (TemplateMemo(tokenizer, self.render, self.tools, self.template_kwargs)
                                          if fast else None)
        self.end_of_turn_ids = tuple(self.encode(end_of_turn))
        if not self.end_of_turn_ids:
            raise ValueError(f"end-of-turn text {end_of_turn!r} tokenizes to nothing")
        self.stop_ids = tuple(tuple(self.encode(s)) for s in self.stop_texts)
        self._ends = re.compile("|".join(map(re.escape, (end_of_turn, *self.stop_texts))))
        self._probe()

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt,
            **self.template_kwargs)
        if not isinstance(text, str):
            raise TypeError(f"chat template rendered {type(text).__name__}, expected str")
        return text

    def encode_conversation(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        """The ids of a rendered conversation, control texts its messages spell tokenized as plain text
        (t1/tito/control_text.py): an opening, a new segment."""
        safe, placeholders = self.control.defuse(messages)
        return self.control.encode(self.render(safe, add_generation_prompt), placeholders)

    def encode(self, text: str) -> list[int]:
        """Template text as the tokenizer reads it: a control token's text is that token."""
        if self._codec is not None:
            return self._codec.encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if self._codec is not None:
            return self._codec.decode(ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def end_length(self, ids: Sequence[int]) -> int:
        """How many of the last ids are the end-of-turn text or a stop text (0: the turn did not end)."""
        for end in (self.end_of_turn_ids, *self.stop_ids):
            n = len(end)
            if n and len(ids) >= n and tuple(int(i) for i in ids[len(ids) - n:]) == end:
                return n
        return 0

    def _render_anchor(self, messages: Sequence[Message], add_generation_prompt: bool, fixed: int) -> str:
        """render() of a delta anchor whose first `fixed` messages are constants (memoised when fast)."""
        if self.memo is None:
            return self.render(messages, add_generation_prompt)
        return self.memo.render(messages, add_generation_prompt, fixed)

    def delta(self, context: Sequence[Message], last: Message, turn_text: str, new: Sequence[Message]) -> Delta:
        """The text that follows the buffer (ending in the assistant turn `last`, whose sampled and
        repaired tokens decode to `turn_text`) when `new` messages are appended, ending with the
        generation prompt. Rendered in the anchor [*context, last, *new]: `context` is what preceded
        `last` (see anchor_context), O(anchor), not O(history).

        cause None: the anchor renders as the buffer holds it (the context with its generation prompt,
        then exactly the sampled turn). Otherwise the text is what the template writes after the
        turn's end text, and the cause says what differed."""
        fixed = 1 if context and context[0] is NEUTRAL else 0
        opening = self._render_anchor(context, True, fixed)
        nxt = self._render_anchor([*context, last, *new], True, fixed)
        held = opening + turn_text
        if nxt.startswith(held):
            return Delta(nxt[len(held):])
        return Delta(self._after_turn(context, last, opening, nxt, fixed), self._cause(context, last, opening, nxt))

    def _after_turn(self, context: Sequence[Message], last: Message, opening: str, nxt: str, fixed: int) -> str:
        """What the template writes after `last`'s end text in nxt: the (k+1)-th end text, k the number in
        the opening; else (the template closes the turn with another text once messages follow it, as
        gpt-oss's final answer) after the close of the turn rendered alone, less the first token there."""
        k = _count(self._ends, opening)
        for i, m in enumerate(self._ends.finditer(nxt)):
            if i == k:
                return nxt[m.end():]
        alone = self._render_anchor([*context, _without_reasoning(last)], False, fixed)
        n = _common_prefix(alone, nxt)
        for m in self._ends.finditer(alone):  # a close that shares its first characters with nxt's
            if m.start() <= n < m.end():
                n = m.start()
        rest = nxt[n:]
        if self._ends.fullmatch(alone[n:]) and rest:
            return self.decode(self.encode(rest)[1:])
        return rest

    def _cause(self, context: Sequence[Message], last: Message, opening: str, nxt: str) -> MismatchCause:
        reasoning = _reasoning(last)
        if reasoning and reasoning not in nxt:
            return MismatchCause.REASONING
        if not nxt.startswith(opening):
            before = self._render_anchor(context, False, 1 if context and context[0] is NEUTRAL else 0)
            return MismatchCause.GENERATION_PROMPT if nxt.startswith(before) else MismatchCause.HISTORY
        return MismatchCause.TOOL_CALLS if last.get("tool_calls") else MismatchCause.TURN

    def _probe_render(self, conversation: list[Message]) -> tuple[str, str]:
        """The opening and the rendering of a probe conversation after the neutral user turn; for a
        template that refuses it, after a system message as well (some want one first)."""
        try:
            return self.render([NEUTRAL], True), self.render([NEUTRAL, *conversation], True)
        except Exception:
            head = [{"role": "system", "content": "probe"}, NEUTRAL]
            return self.render(head, True), self.render([*head, *conversation], True)

    def history_matches(self, messages: Sequence[Message], buffer_text: str) -> bool:
        """The full check, O(history): the whole conversation renders to text that starts with the
        buffer's (with the generation prompt when it does not end in an assistant turn)."""
        if not messages:
            return buffer_text == ""
        open_turn = messages[-1].get("role") != "assistant"
        return self.render(messages, add_generation_prompt=open_turn).startswith(buffer_text)

    def _probe(self) -> None:
        """Refuse, at load, a template that cannot render an observation after an assistant turn: it
        raises on a user message and on a tool result after one, or (with tools) on every tool-call
        turn, or never writes the end-of-turn or a stop text after one."""
        def call(arguments: Any) -> Message:
            return {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "probe", "arguments": arguments}}]}

        turn = {"role": "assistant", "content": "probe"}
        tool = {"role": "tool", "content": "probe", "tool_call_id": "call_0"}
        # Tool-call arguments as a mapping or as a JSON string, as templates differ; a template that
        # renders no tool call is refused only when the renderer has tools.
        groups = {"an assistant turn": [[turn, {"role": "user", "content": "probe"}], [turn, tool]],
                  "an assistant turn with tool calls": [[call({"a": "b"}), tool], [call('{"a": "b"}'), tool]]}
        located = False
        for what, conversations in groups.items():
            errors = []
            for conversation in conversations:
                try:
                    opening, nxt = self._probe_render(conversation)
                except Exception as e:  # the template's own refusal of this conversation
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                located |= _count(self._ends, nxt) > _count(self._ends, opening)
            if len(errors) == len(conversations) and (self.tools or "tool calls" not in what):
                raise ValueError(f"the chat template cannot render {what} followed by a message, so no "
                                 f"observation delta can be rendered: {'; '.join(errors)}")
        if not located:
            ends = ", ".join(repr(e) for e in (self.end_of_turn, *self.stop_texts))
            raise ValueError(f"the chat template never writes the end-of-turn text ({ends}) after an assistant "
                             "turn, so the buffer cannot tell where a sampled turn ends in its rendering; "
                             "give the renderer the text the template closes a turn with")


def turn_ends(tokenizer: ChatTokenizer, eos: str, stops: Sequence[str],
              template_kwargs: dict[str, Any] | None = None) -> tuple[str, tuple[str, ...]]:
    """A renderer's end_of_turn and stop_texts for a model whose sampler stops on `eos` (the tokenizer's
    eos token) and `stops` (its other stop tokens, generation_config.json's eos ids): the end of turn is
    the first of them the template writes after an assistant turn (a user message or a tool result
    after it); the stop texts are the others it writes there, and `eos` when it is not the end of turn.
    Qwen3: <|im_end|>; gpt-oss: <|call|> and <|return|>; GLM: <|user|> and <|observation|>. None
    written: `eos` (the renderer then refuses the template, saying so)."""
    turn: Message = {"role": "assistant", "content": "probe"}
    call: Message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "probe", "arguments": {"a": "b"}}}]}
    tool: Message = {"role": "tool", "content": "probe", "tool_call_id": "call_0"}
    written = ""
    for conversation in ([turn, {"role": "user", "content": "probe"}], [turn, tool], [call, tool]):
        try:
            opening = str(tokenizer.apply_chat_template([NEUTRAL], tokenize=False, add_generation_prompt=True,
                                                        **(template_kwargs or {})))
            text = str(tokenizer.apply_chat_template([NEUTRAL, *conversation], tokenize=False,
                                                     add_generation_prompt=True, **(template_kwargs or {})))
        except Exception:  # a conversation the template refuses: the renderer's probe reports it
            continue
        written += text[_common_prefix(opening, text):] + "\n"
    candidates = list(dict.fromkeys(t for t in (eos, *stops) if t))
    found = [t for t in candidates if t in written]
    if not found:
        return eos, ()
    return found[0], tuple(t for t in candidates if t != found[0] and (t in found or t == eos))


def anchor_context(messages: Sequence[Message]) -> list[Message]:
    """The context of the last message (an assistant turn) in a delta anchor: the neutral user turn,
    the previous assistant turn and the messages after it; on the first turn, all messages before it."""
    for i in range(len(messages) - 2, -1, -1):
        if messages[i].get("role") == "assistant":
            return [NEUTRAL, *messages[i:-1]]
    return list(messages[:-1])


def _reasoning(message: Message) -> str:
    for key in _REASONING_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    content = message.get("content")
    found = _THINK.search(content) if isinstance(content, str) else None
    return found.group(1).strip() if found else ""


def _without_reasoning(message: Message) -> Message:
    plain = {k: v for k, v in message.items() if k not in _REASONING_KEYS}
    content = plain.get("content")
    if isinstance(content, str) and "</think>" in content:
        plain["content"] = content.split("</think>")[-1].lstrip("\n")
    return plain


def _count(pattern: re.Pattern[str], text: str) -> int:
    return sum(1 for _ in pattern.finditer(text))


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
