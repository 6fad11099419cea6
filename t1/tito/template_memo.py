"""Memoised chat-template rendering: once a conversation shape is learnt, a render is a string concatenation.

A shape is what a template may legitimately branch on: add_generation_prompt and, per message, its
role, its key order and whether its content is empty (the contents of the first `fixed` messages,
constant anchors, are part of the shape). Only messages with exactly `role` and `content` (str)
have a shape; anything else (tool calls, reasoning, names) is rendered by the template every time.

A shape is learnt from one render with tracer contents (a str subclass that records every use other
than being concatenated or written out: comparisons, `in`, len, slicing, iteration, any method,
formatting; truthiness is allowed, the shape fixes it; reading the clock, strftime_now, is recorded
too). It is memoised only when
- the traced render used no content in any other way, so its control flow and every value it
  computed, apart from the contents themselves, are the same for every content of the shape;
- it equals the tokenizer's own apply_chat_template output for the same (plain) contents;
- split at the tracers, its literal pieces refilled with a second, different set of contents (with
  every string constant of the template inside, and characters that escaping, trimming and case
  changes alter) equal apply_chat_template's output for those contents.
Otherwise the shape is marked refused (with the reason) and always rendered by the template.

What tracing cannot see, a plain string reading the content's buffer (`content in 'literal'`, a
`~` concatenation that is then inspected), is the full-history check's job: the buffer compares the
whole conversation's real rendering with its tokens every few turns and at export.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
RealRender = Callable[[Sequence[Message], bool], str]

MAX_SHAPES = 256  # conversations of one renderer use a handful; past this, new shapes are not learnt

_USES: list[str] = []            # what tracers were used for during the current traced render
_TRACE_LOCK = threading.Lock()   # one traced render at a time: _USES is shared


def _recording(name: str) -> Callable[..., Any]:
    base = getattr(str, name)

    def method(self: str, *args: Any, **kwargs: Any) -> Any:
        _USES.append(name)
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


class _Tracer(str):
    """Message content whose uses are recorded; concatenation keeps the result a tracer."""

    __slots__ = ()

    def __str__(self) -> str:  # what `{{ x }}`, `~` and `|string` call: written out unchanged
        return self

    def __bool__(self) -> bool:  # the shape fixes emptiness; tracers stand for non-empty contents
        return True

    def __add__(self, other: object) -> Any:
        return _Tracer(str.__add__(self, other)) if isinstance(other, str) else NotImplemented

    def __radd__(self, other: object) -> Any:
        return _Tracer(str.__add__(other, self)) if isinstance(other, str) else NotImplemented


_NOT_A_USE = {"__new__", "__init__", "__init_subclass__", "__subclasshook__", "__getattribute__", "__setattr__",
              "__delattr__", "__class__", "__str__", "__bool__", "__add__", "__radd__"}
for _name in dir(str):
    if _name not in _NOT_A_USE and callable(getattr(str, _name)):
        setattr(_Tracer, _name, _recording(_name))


@dataclass(frozen=True, slots=True)
class Pieces:
    """A learnt shape: literals[0] + content[slots[0]] + literals[1] + ... + literals[-1]."""

    literals: tuple[str, ...]
    slots: tuple[int, ...]   # message index whose content goes between literals[i] and literals[i + 1]

    def fill(self, messages: Sequence[Message]) -> str:
        lits = self.literals
        parts = [lits[0]]
        for i, slot in enumerate(self.slots):
            parts.append(messages[slot]["content"])
            parts.append(lits[i + 1])
        return "".join(parts)

    @classmethod
    def split(cls, text: str, sentinels: dict[int, str]) -> Pieces:
        by_text = {s: i for i, s in sentinels.items()}
        literals, slots, at = [], [], 0
        if by_text:
            for m in re.finditer("|".join(map(re.escape, by_text)), text):
                literals.append(text[at:m.start()])
                slots.append(by_text[m.group()])
                at = m.end()
        literals.append(text[at:])
        return cls(tuple(literals), tuple(slots))


def shape_of(messages: Sequence[Message], add_generation_prompt: bool, fixed: int) -> tuple | None:
    """The memo key of a conversation, None when a message has more than role and content (str)."""
    key: list[Any] = [add_generation_prompt]
    for i, m in enumerate(messages):
        if type(m) is not dict or len(m) != 2:
            return None
        role, content = m.get("role"), m.get("content")
        if type(role) is not str or type(content) is not str:
            return None
        key.append((role, content if i < fixed else content != "", next(iter(m)) == "role"))
    return tuple(key)


class TemplateMemo:
    """Per-renderer memo of learnt shapes (see module docstring). `real` renders with apply_chat_template.
    The tokenizer's chat template, special tokens, the tools and template kwargs are read once: a
    renderer's tokenizer must not be given another template afterwards."""

    def __init__(self, tokenizer: Any, real: RealRender, tools: list[dict] | None,
                 template_kwargs: dict[str, Any]) -> None:
        self._real = real
        self._shapes: dict[tuple, Pieces | str] = {}
        self.disabled = ""  # why no shape can be learnt ("" when they can)
        try:
            self._setup(tokenizer, tools, template_kwargs)
        except Exception as e:  # a tokenizer without transformers' chat template machinery
            self.disabled = f"{type(e).__name__}: {e}"

    def _setup(self, tokenizer: Any, tools: list[dict] | None, template_kwargs: dict[str, Any]) -> None:
        from transformers.utils.chat_template_utils import (
            _compile_jinja_template,
            _plain_template_data,
        )

        own = {name for name, p in inspect.signature(tokenizer.apply_chat_template).parameters.items()
               if p.kind is not inspect.Parameter.VAR_KEYWORD}
        if own & set(template_kwargs):
            raise ValueError(f"template_kwargs set apply_chat_template options {sorted(own & set(template_kwargs))}")
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise ValueError("tools given as callables")
        source = tokenizer.get_chat_template(None, tools)
        self._template = _compile_jinja_template(source)
        # What apply_chat_template passes to the template besides the conversation.
        self._variables = dict(tools=_plain_template_data(tools), documents=None,
                               **_plain_template_data({**tokenizer.special_tokens_map, **template_kwargs}))
        env = self._template.environment
        constants = {n.value for n in env.parse(source).find_all(_jinja_const()) if isinstance(n.value, str)}
        self._constants = "".join(sorted(constants))

    def render(self, messages: Sequence[Message], add_generation_prompt: bool, fixed: int = 0) -> str:
        """What `real` renders, by concatenation when the shape is learnt; `fixed`: how many leading
        messages are constants (their content is part of the shape)."""
        key = shape_of(messages, add_generation_prompt, fixed)
        if key is None:
            return self._real(messages, add_generation_prompt)
        pieces = self._shapes.get(key)
        if pieces is None:
            if self.disabled or len(self._shapes) >= MAX_SHAPES:
                return self._real(messages, add_generation_prompt)
            pieces = self._shapes[key] = self._learn(messages, add_generation_prompt, fixed)
        if isinstance(pieces, str):
            return self._real(messages, add_generation_prompt)
        return pieces.fill(messages)

    def refusal(self, messages: Sequence[Message], add_generation_prompt: bool, fixed: int = 0) -> str | None:
        """Why this conversation is rendered by the template (None: it is memoised); learns its shape."""
        key = shape_of(messages, add_generation_prompt, fixed)
        if key is None:
            return "a message has fields other than role and content (str)"
        if self.disabled:
            return f"memo disabled: {self.disabled}"
        if key not in self._shapes:
            self._shapes[key] = self._learn(messages, add_generation_prompt, fixed)
        pieces = self._shapes[key]
        return pieces if isinstance(pieces, str) else None

    def _clock(self, fmt: str) -> str:
        """The template's strftime_now, recorded: a render that reads the clock is not memoisable."""
        _USES.append("strftime_now")
        return str(self._template.environment.globals["strftime_now"](fmt))

    def _learn(self, messages: Sequence[Message], agp: bool, fixed: int) -> Pieces | str:
        slots = [i for i in range(fixed, len(messages)) if messages[i]["content"]]
        # Both sets: leading/trailing whitespace, both cases, quotes, backslash, newline, markup, braces,
        # non-ASCII; the second also holds every string constant of the template.
        first = {i: f" \x1e{i}A\x1f<Tr\"ac'e&r\\{{0}}é>\n " for i in slots}
        second = {i: f"\n\x1f{i}b\x1e[{self._constants}]<Mé&\"'\\{{}}ß>\t" for i in slots}

        def with_contents(contents: dict[int, str], cls: type[str] = str) -> list[Message]:
            return [{**m, "content": cls(contents[i])} if i in contents else dict(m) for i, m in enumerate(messages)]

        try:
            with _TRACE_LOCK:
                _USES.clear()
                traced = self._template.render(messages=with_contents(first, _Tracer), add_generation_prompt=agp,
                                               **self._variables, strftime_now=self._clock)
                uses = sorted(set(_USES))
                _USES.clear()
            if uses:
                return f"the template uses message content beyond concatenation: {', '.join(uses)}"
            if traced != self._real(with_contents(first), agp):
                return "the traced render differs from apply_chat_template's"
            pieces = Pieces.split(str.__str__(traced), first)
            if pieces.fill(with_contents(second)) != self._real(with_contents(second), agp):
                return "the output with other contents is not the same pieces around them"
        except Exception as e:  # a template that fails on these contents: not memoisable
            return f"rendering failed: {type(e).__name__}: {e}"
        return pieces


def _jinja_const() -> type:
    from jinja2 import nodes

    return nodes.Const
