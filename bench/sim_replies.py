"""What the simulated inference server says: tokenized agent replies with a tool call, logprobs and routing.

Replies are made once at start-up from the policy's own tokenizer (tokenizer.json of a T1 model
folder), so the agent format decodes and parses them exactly as it would a real model's output:
some analysis prose, then `<tool_call>{"name": "bash", "arguments": {"command": ...}}</tool_call>`
and `<|im_end|>`. Reply lengths are drawn per turn; the prose is cut to fit, after a token that does not
end in whitespace (a model trained on its template writes none before a tool call, and a template that trims
content would render such a turn otherwise: a harness gateway would count a template rewrite). Routing rows come from
a pre-drawn pool of distinct top-k expert ids, so a turn costs a slice, not a sampling pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from t1.routing.block import RoutingBlock, routing_dtype


class CommandMix(StrEnum):
    FAST = "fast"   # a trivial command: measures the coordinator and SSH path, not the shell's work
    BASH = "bash"   # a mix of real shell commands an agent runs (listing, grep, awk, python)


FAST_COMMANDS = ("true",)
BASH_COMMANDS = (
    "ls -la /usr/bin | head -40",
    "cat /etc/os-release",
    "seq 1 2000 | awk '{s+=$1} END {print s}'",
    "find /usr/share -maxdepth 2 -type d 2>/dev/null | head -60",
    "grep -rn 'def ' /usr/lib/python3*/json/__init__.py | head -30",
    "python3 -c 'import sys, platform; print(sys.version, platform.machine())'",
    "mkdir -p /tmp/work && cd /tmp/work && printf 'a\\nb\\nc\\n' > f.txt && wc -l f.txt",
    "ps aux | head -20",
    "env | sort | head -20",
    "cd / && pwd && ls",
    "echo $((6 * 7)) && date +%s",
    "head -c 4000 /usr/share/common-licenses/GPL-3 2>/dev/null || head -c 4000 /etc/services",
)

PROSE = (
    "Let me look at the current state of the working directory before I change anything. "
    "The task asks for a small fix, so I will first list the files, then read the failing test "
    "and check which function it calls. If the output is long I will narrow it down with grep. "
    "After that I will make the edit, run the tests again and confirm that the result matches "
    "what the instructions describe. "
)


@dataclass(frozen=True, slots=True)
class ReplySettings:
    """Shape of the simulated replies."""

    min_tokens: int = 50
    max_tokens: int = 400
    commands: CommandMix = CommandMix.FAST
    tool_name: str = "bash"
    argument_name: str = "command"

    def __post_init__(self) -> None:
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"need 1 <= min_tokens <= max_tokens, got {self.min_tokens}..{self.max_tokens}")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The MoE shape whose routing the simulator emits (production: 48 layers, 128 experts, top-8)."""

    num_layers: int = 48
    num_experts: int = 128
    top_k: int = 8
    vocab_size: int = 1024
    max_context_tokens: int = 262144

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"need 1 <= top_k <= num_experts, got top_k={self.top_k} num_experts={self.num_experts}")


class ReplyBook:
    """Tokenized replies: ids for any length in [min_tokens, max_tokens], ending in a tool call and EOS."""

    def __init__(self, tokenizer_file: Path, settings: ReplySettings) -> None:
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {tokenizer_file}")
        tok = Tokenizer.from_file(str(tokenizer_file))
        eos = tok.token_to_id("<|im_end|>")
        if eos is None:
            raise ValueError(f"{tokenizer_file}: no <|im_end|> token; not a T1/Qwen-style chat tokenizer")
        self.settings = settings
        self.eos_id = int(eos)
        self.vocab_size = tok.get_vocab_size()
        mix = FAST_COMMANDS if settings.commands is CommandMix.FAST else BASH_COMMANDS
        self.commands = mix
        self._calls = [np.asarray([*tok.encode(self._call_text(c)).ids, self.eos_id], dtype=np.int32) for c in mix]
        longest_call = max(len(c) for c in self._calls)
        prose = PROSE
        ids = tok.encode(prose).ids
        while len(ids) < settings.max_tokens + 1:
            prose += PROSE
            ids = tok.encode(prose).ids
        self._prose = np.asarray(ids, dtype=np.int32)
        self._spaced = np.asarray([tok.decode([i]).rstrip() != tok.decode([i]) for i in ids], dtype=bool)
        self.min_tokens = max(settings.min_tokens, longest_call)
        self.max_tokens = max(settings.max_tokens, self.min_tokens)

    def _call_text(self, command: str) -> str:
        args = json.dumps({self.settings.argument_name: command})
        return f'\n<tool_call>\n{{"name": "{self.settings.tool_name}", "arguments": {args}}}\n</tool_call>'

    def reply(self, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """(ids, command index): prose cut to a drawn length, then a tool call and EOS."""
        which = int(rng.integers(len(self._calls)))
        call = self._calls[which]
        total = int(rng.integers(self.min_tokens, self.max_tokens + 1))
        cut, least = max(0, total - len(call)), max(0, self.min_tokens - len(call))
        while cut > least and self._spaced[cut - 1]:
            cut -= 1
        while cut and self._spaced[cut - 1]:  # at the shortest: longer instead
            cut += 1
        return np.concatenate([self._prose[:cut], call]), which


class RoutingPool:
    """A fixed pool of routing rows (distinct experts per row); blocks are slices of it at random offsets."""

    def __init__(self, shape: ModelShape, rows: int = 8192, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        dt = routing_dtype(shape.num_experts)
        parts = []
        for _ in range(0, rows, 512):
            scores = rng.random((512, shape.num_layers, shape.num_experts), dtype=np.float32)
            parts.append(np.argpartition(scores, shape.top_k, axis=-1)[..., : shape.top_k].astype(dt))
        self._rows = np.concatenate(parts)[:rows]
        self.shape = shape

    def block(self, start: int, count: int, rng: np.random.Generator) -> RoutingBlock:
        pool = self._rows
        if count <= len(pool):
            offset = int(rng.integers(0, len(pool) - count + 1))
            experts = pool[offset : offset + count]
        else:
            experts = np.resize(pool, (count, *pool.shape[1:]))
        return RoutingBlock(start=start, experts=experts)


class LogprobPool:
    """Pre-drawn behaviour logprobs (log of a plausible sampling probability), sliced per turn."""

    def __init__(self, size: int = 65536, seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        self._values = np.log(rng.beta(2.0, 0.6, size=size).clip(1e-6, 1.0)).astype(np.float32)

    def take(self, count: int, rng: np.random.Generator) -> np.ndarray:
        offset = int(rng.integers(0, len(self._values) - count)) if count < len(self._values) else 0
        return np.resize(self._values[offset:], count)
