"""Chat-template rendering for TITO: the opening prompt and the text of each observation delta.

Only template text is ever tokenized here; sampled tokens stay ids in the buffer. The delta of new
messages is the text the template adds when they are appended (render with and without them, keep
the suffix), plus whatever the template writes after the last assistant turn's end-of-turn token
that the sampler did not produce (ChatML's newline after <|im_end|>).

The per-turn delta is rendered in a bounded anchor, not the whole history: a neutral user turn, the
last assistant message, then the new messages. Its cost does not grow with the context. What the
anchor cannot see (a template rewriting turns further back) is caught by the full-history check
(`history_matches`), which the buffer runs every few turns and when a segment ends.

Fast path (default; fast=False is the reference path it is measured and tested against): the anchor
renders go through a TemplateMemo (a learnt conversation shape renders by concatenation, verified
against the template; template_memo.py) and encode/decode call the `tokenizers` backend directly
when that is provably the transformers wrapper's computation (codec.py). The full-history check and
the opening prompt always render with the template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from t1.tito.template_memo import TemplateMemo
from t1.tito.tokenizer_fast_path import DirectCodec, direct_codec

Message = dict[str, Any]

# A neutral history ending in an assistant turn: the delta of new messages rendered after it is
# used when the real history is not prefix-stable under the template (it rewrites earlier turns).
_BASE: tuple[Message, ...] = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "x"})


class ChatTokenizer(Protocol):
    """What TITO needs from a Hugging Face tokenizer (PreTrainedTokenizerBase satisfies it)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...
    def encode(self, text: str, **kwargs: Any) -> list[int]: ...
    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True, slots=True)
class Delta:
    """Text to append after the buffer, and whether the anchor rendered as the buffer holds it."""

    text: str
    prefix_matched: bool   # the last assistant turn renders as the buffer's tokens decode
    history_stable: bool   # appending the messages left the anchor's rendering unchanged


class ChatRenderer:
    """Renders conversations with the tokenizer's chat template; tokenizes template text only."""

    def __init__(self, tokenizer: ChatTokenizer, *, end_of_turn: str, tools: Sequence[dict] | None = None,
                 template_kwargs: dict[str, Any] | None = None, fast: bool = True) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})
        self._codec: DirectCodec | None = direct_codec(tokenizer, end_of_turn) if fast else None
        self.memo: TemplateMemo | None = (TemplateMemo(tokenizer, self.render, self.tools, self.template_kwargs)
                                          if fast else None)
        self.end_of_turn_ids = tuple(self.encode(end_of_turn))
        if not self.end_of_turn_ids:
            raise ValueError(f"end-of-turn text {end_of_turn!r} tokenizes to nothing")

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            list(messages), tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt,
            **self.template_kwargs)
        if not isinstance(text, str):
            raise TypeError(f"chat template rendered {type(text).__name__}, expected str")
        return text

    def encode(self, text: str) -> list[int]:
        if self._codec is not None:
            return self._codec.encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if self._codec is not None:
            return self._codec.decode(ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _render_anchor(self, messages: Sequence[Message], add_generation_prompt: bool, fixed: int) -> str:
        """render() of a delta anchor whose first `fixed` messages are constants (memoised when fast)."""
        if self.memo is None:
            return self.render(messages, add_generation_prompt)
        return self.memo.render(messages, add_generation_prompt, fixed)

    def delta(self, last: Message, turn_text: str, new: Sequence[Message]) -> Delta:
        """The text that follows the buffer (ending in the assistant turn `last`, whose sampled and
        repaired tokens decode to `turn_text`) when `new` messages are appended, ending with the
        generation prompt. Rendered in the anchor [neutral user, last, *new]: O(anchor), not O(history).

        prefix_matched: the template renders `last` as the buffer holds it (text up to its end-of-turn).
        history_stable: appending `new` left the anchor's rendering of `last` unchanged.
        """
        anchor = [_BASE[0], last]
        prev = self._render_anchor(anchor, False, fixed=1)
        nxt = self._render_anchor([*anchor, *new], True, fixed=1)
        cut = prev.rfind(self.end_of_turn)
        matched = cut >= 0 and prev[:cut + len(self.end_of_turn)].endswith(turn_text)
        # What the template writes after the last turn's end-of-turn token, which was not sampled.
        gap = self._after_last_end_of_turn(prev)
        stable = nxt.startswith(prev)
        if stable:
            added = nxt[len(prev):]
        else:
            base_prev = self._render_anchor(_BASE, False, fixed=len(_BASE))
            base_next = self._render_anchor([*_BASE, *new], True, fixed=len(_BASE))
            if not base_next.startswith(base_prev):
                raise ValueError("the chat template is not prefix-stable even on a neutral history; "
                                 "cannot render an observation delta")
            added = base_next[len(base_prev):]
        return Delta(text=gap + added, prefix_matched=matched, history_stable=stable)

    def history_matches(self, messages: Sequence[Message], buffer_text: str) -> bool:
        """The full check, O(history): the whole conversation renders to text that starts with the
        buffer's (with the generation prompt when it does not end in an assistant turn)."""
        if not messages:
            return buffer_text == ""
        open_turn = messages[-1].get("role") != "assistant"
        return self.render(messages, add_generation_prompt=open_turn).startswith(buffer_text)

    def _after_last_end_of_turn(self, rendered: str) -> str:
        i = rendered.rfind(self.end_of_turn)
        return "" if i < 0 else rendered[i + len(self.end_of_turn):]
