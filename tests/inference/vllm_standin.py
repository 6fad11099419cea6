"""A stand-in for vLLM's AsyncLLM that follows its documented output structures (vLLM 0.32).

RequestOutput / CompletionOutput / Logprob carry vLLM's field names; `routed_experts` is set on
the finished output only, with rows for positions routed_experts_prompt_start .. prompt+gen-2.
A `defect` hook corrupts the routing the way real engines have been seen to. With `kv_blocks` it keeps
a paged KV cache's books and calls `stat_loggers` the way vLLM's logger manager does: each factory
once with the config (`cache_config.num_gpu_blocks`, `block_size`), then `record(SchedulerStats)` after
every step with `kv_cache_usage`, the fraction of the blocks (less the null block) running requests hold.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import Any

import numpy as np


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    routed_experts_prompt_start: int = 0


def TokensPrompt(prompt_token_ids: list[int]) -> dict:  # vLLM's TypedDict name
    return {"prompt_token_ids": prompt_token_ids}


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: np.ndarray | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0


class StandInEngine:
    """Deterministic tokens and routing from the seed; a block-granular prefix cache like vLLM's."""

    def __init__(self, vocab: int, layers: int, experts: int, top_k: int, eos: int, block: int = 16,
                 delay_s: float = 0.0, kv_blocks: int = 0, stat_loggers: Sequence[Callable[..., Any]] = ()) -> None:
        self.vocab, self.layers, self.experts, self.top_k, self.eos = vocab, layers, experts, top_k, eos
        self.block, self.delay_s = block, delay_s
        self.defect: Callable[[np.ndarray], np.ndarray | None] = lambda a: a
        self.params: list[SamplingParams] = []
        self.aborted: list[str] = []
        self.rpcs: list[tuple[str, dict]] = []
        self.prefix_resets = 0
        self.weights = 0
        self._seen: list[list[int]] = []
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=kv_blocks, block_size=block))
        self._loggers = [factory(self.vllm_config, 0) for factory in stat_loggers]
        self._running: dict[str, int] = {}  # request -> positions it holds

    def _step(self, request_id: str, positions: int | None) -> None:
        """A scheduler step's stats: finished requests' blocks are free before they are made, as in vLLM."""
        if positions is None:
            self._running.pop(request_id, None)
        else:
            self._running[request_id] = positions
        blocks = sum(math.ceil(n / self.block) for n in self._running.values())
        usable = self.vllm_config.cache_config.num_gpu_blocks - 1
        for logger in self._loggers:
            logger.record(SchedulerStats(len(self._running), 0, blocks / usable if usable > 0 else 0.0), None,
                          mm_cache_stats=None, engine_idx=0)

    def routing_of(self, ids: list[int]) -> np.ndarray:
        """[len(ids), layers, top_k]: distinct experts per row, a function of the token and the weights."""
        rows = np.empty((len(ids), self.layers, self.top_k), np.uint8)
        for i, tok in enumerate(ids):
            rng = np.random.default_rng([tok, i, self.weights])
            for layer in range(self.layers):
                rows[i, layer] = rng.permutation(self.experts)[: self.top_k]
        return rows

    def _cached(self, prompt: list[int]) -> int:
        best = 0
        for seen in self._seen:
            n = 0
            while n < min(len(seen), len(prompt) - 1) and seen[n] == prompt[n]:
                n += 1
            best = max(best, n // self.block * self.block)
        return best

    async def generate(self, prompt: dict, params: SamplingParams, request_id: str):
        self.params.append(params)
        ids = list(prompt["prompt_token_ids"])
        cached = self._cached(ids)
        rng = np.random.default_rng([params.seed or 0, len(ids), self.weights])
        out: list[int] = []
        try:
            while True:
                await asyncio.sleep(self.delay_s)
                tok = int(rng.integers(9, self.vocab)) if len(out) < 3 or rng.random() > 0.1 else self.eos
                out.append(tok)
                stop = tok == self.eos or tok in params.stop_token_ids
                length = len(out) >= (params.max_tokens or 16)
                finished = stop or length
                routed = None
                if finished:
                    full = self.routing_of(ids + out[:-1])
                    routed = self.defect(full[params.routed_experts_prompt_start:])
                    self._seen.append(ids + out[:-1])
                self._step(request_id, None if finished else len(ids) + len(out))
                comp = CompletionOutput(0, "", [tok], None, [{tok: Logprob(-0.5 - 0.01 * len(out), 1)}], routed,
                                        ("stop" if stop else "length") if finished else None)
                yield RequestOutput(request_id, ids, [comp], finished, cached)
                if finished:
                    return
        finally:
            self._step(request_id, None)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._step(request_id, None)  # an aborted request's blocks are freed

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict[str, Any] | None = None) -> list:
        self.rpcs.append((method, kwargs or {}))
        if method == "reload_weights":
            self.weights += 1
        return [None]

    async def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        self._seen.clear()
        return True

    def shutdown(self) -> None:
        pass
