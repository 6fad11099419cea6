"""The model's chat renderer for each tool list a harness sends, shared by every session of a run.

A harness sends its tools with every call; the template renders them into the prompt, so each distinct
tool list needs a renderer of its own (made once: the constructor probes the template, and its memo
learns conversation shapes). Sessions share them as T1's own loop shares one renderer per agent
format. The cache is bounded (least recently used out): a harness that sends new tools on every call
costs a renderer per call, never memory without end; a buffer keeps the renderer it was made with.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from t1.gateway.call import BadCall
from t1.tito import ChatRenderer

MAX_TOOL_LISTS = 64


class ToolRenderers:
    """Renderers of one model (its tokenizer, end of turn, stop texts, template variables) by tool list."""

    def __init__(self, base: ChatRenderer, max_entries: int = MAX_TOOL_LISTS) -> None:
        self.base = base
        self._max = max_entries
        self._by_tools: OrderedDict[str, ChatRenderer] = OrderedDict()

    def get(self, tools: tuple[dict[str, Any], ...]) -> tuple[ChatRenderer, str]:
        """The renderer for `tools`, and the key that names the tool list."""
        key = json.dumps(tools, sort_keys=True)
        r = self._by_tools.get(key)
        if r is not None:
            self._by_tools.move_to_end(key)
            return r, key
        base = self.base
        try:
            r = ChatRenderer(base.tokenizer, end_of_turn=base.end_of_turn, tools=list(tools),
                             template_kwargs=base.template_kwargs, stop_texts=base.stop_texts)
        except ValueError as exc:  # the template refuses these tools (probed on construction)
            raise BadCall(f"the model's chat template cannot render these tools: {exc}") from None
        self._by_tools[key] = r
        if len(self._by_tools) > self._max:
            self._by_tools.popitem(last=False)
        return r, key
