"""Control-token text inside message content, tokenized as the plain text it is.

A tokenizer maps the text of each added token (`<|im_start|>`, `<|im_end|>`, `<tool_call>`, ...) to that
control token wherever the text occurs. Rendered conversations are text, so a command's output, a file the
agent reads, a task's instruction or a compaction summary that spells `<|im_end|>\\n<|im_start|>user` would otherwise
reach the policy as a real end of turn and a real user turn: a policy (or a task file, or a web page)
could forge turns of its own context. Here content is tokenized as what it is: the template's own
markup keeps its control tokens, the same characters inside content become ordinary tokens that decode to
the same text (so every text-level check of the buffer still holds).

Which messages: those the policy did not write (system, user, tool: an instruction, an observation, a
compaction summary put in a user turn). An assistant turn is the policy's own: its sampled ids are never
re-tokenized, and where it is rendered again (a new segment's kept turns) its text is read as the template reads
it, since templates parse their own markup out of it (Qwen3 splits the reasoning at `</think>`).

How: every string in such a message (content, content parts, any field but its role, name and ids) has each
control text replaced by a placeholder, a character of Unicode's supplementary private use area B (and a character of
that area already in the content by a placeholder of its own); the conversation is rendered with those
messages; the rendering is tokenized piece by piece, the template's pieces as before and each placeholder as
its text written plainly: split after its first character, whose pieces no added token matches.

A conversation with no control text in its content is rendered and tokenized exactly as without this module.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

_AREA = 0x100000  # Supplementary Private Use Area-B: U+100000..U+10FFFD
_AREA_END = 0x10FFFD
_IN_AREA = f"[{chr(_AREA)}-{chr(_AREA_END)}]"
_PLACEHOLDER = re.compile(_IN_AREA)
# A message's fields the template writes as markup, not as content: left as they are.
_MARKUP_KEYS = frozenset({"role", "type", "id", "tool_call_id", "name"})

Message = dict[str, Any]


def control_texts(tokenizer: Any) -> list[str]:
    """The texts of a tokenizer's added tokens (special or not) that tokenize to a control token wherever they
    occur; whitespace-only and one-character ones are left out (ordinary text that a vocabulary has added)."""
    decoder: Mapping[int, Any] | None = getattr(tokenizer, "added_tokens_decoder", None)
    texts = ([str(getattr(t, "content", t)) for t in decoder.values()] if decoder
             else [str(t) for t in getattr(tokenizer, "all_special_tokens", ()) or ()])
    return sorted({t for t in texts if len(t) > 1 and t.strip()}, key=lambda t: (-len(t), t))


class ControlText:
    """The control texts of one tokenizer, and the encoding of renderings whose content spells them."""

    def __init__(self, texts: Sequence[str], encode: Callable[[str], list[int]],
                 decode: Callable[[Sequence[int]], str]) -> None:
        self._encode, self._decode = encode, decode
        self._plain: dict[str, list[int]] = {}
        self._control: re.Pattern[str] | None = (
            re.compile("|".join(re.escape(t) for t in texts)) if texts else None)
        usable = []
        for text in texts:
            ids = self._write_plainly(text)
            if ids is None:
                log.warning("the tokenizer cannot write %r as plain text; content that spells it stays that token",
                            text)
                continue
            self._plain[text] = ids
            usable.append(text)
        alternatives = [re.escape(t) for t in usable] + [_IN_AREA]
        self._content = re.compile("|".join(alternatives))

    @property
    def texts(self) -> list[str]:
        """The control texts that content can spell and gets tokenized plainly."""
        return list(self._plain)

    def _write_plainly(self, text: str) -> list[int] | None:
        """Ids that decode to `text` with no control token among them, or None where this tokenizer has none."""
        head, rest = text[:1], text[1:]
        if self._control is not None and self._control.search(rest):
            return None
        ids = self._encode(head) + self._encode(rest)
        return ids if self._decode(ids) == text else None

    def plain_ids(self, text: str) -> list[int]:
        """Ids of a placeholder's text: a control text written plainly, or a private-use character."""
        ids = self._plain.get(text)
        return list(ids) if ids is not None else self._encode(text)

    def defuse(self, messages: Sequence[Message]) -> tuple[list[Message], dict[str, str]]:
        """The messages with every control text (and private-use-B character) in their strings replaced by a
        placeholder, assistant turns as they are, and each placeholder's text. A message with no such text is
        the same object (nothing is copied); none at all: the messages and {}."""
        found: dict[str, str] = {}  # text -> placeholder
        out = [m if m.get("role") == "assistant" else self._defused(m, found) for m in messages]
        return out, {p: t for t, p in found.items()}

    def _defused(self, value: Any, found: dict[str, str]) -> Any:
        if isinstance(value, str):
            if not self._content.search(value):
                return value
            return self._content.sub(lambda m: self._placeholder(m.group(0), found), value)
        if isinstance(value, Mapping):
            items = {k: (v if k in _MARKUP_KEYS else self._defused(v, found)) for k, v in value.items()}
            return value if all(items[k] is v for k, v in value.items()) else items
        if isinstance(value, list | tuple):
            parts = [self._defused(v, found) for v in value]
            return value if all(p is v for p, v in zip(parts, value, strict=True)) else type(value)(parts)
        return value

    def _placeholder(self, text: str, found: dict[str, str]) -> str:
        if text not in found:
            if len(found) > _AREA_END - _AREA:
                raise ValueError("more distinct control texts in one conversation than placeholders")
            found[text] = chr(_AREA + len(found))
        return found[text]

    def encode(self, text: str, placeholders: Mapping[str, str]) -> list[int]:
        """Ids of a rendering made from defused messages: its pieces as before, each placeholder plainly."""
        if not placeholders:
            return self._encode(text)
        ids: list[int] = []
        at = 0
        for m in _PLACEHOLDER.finditer(text):
            if m.group(0) not in placeholders:
                continue  # a character the template itself wrote
            if m.start() > at:
                ids += self._encode(text[at:m.start()])
            ids += self.plain_ids(placeholders[m.group(0)])
            at = m.end()
        if at < len(text):
            ids += self._encode(text[at:])
        return ids

