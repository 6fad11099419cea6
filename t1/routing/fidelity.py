"""Trainer-side logprobs of a segment's sampled tokens, with or without routing replay.

The fidelity check of TITO + R3: feed a segment's exact ids through the trainer's model in one full
forward (inputs stop before the last token, docs/design.md), optionally replaying the recorded routing,
and compare the logprobs of the loss tokens with the sampler's behaviour logprobs.
`schedule_logprobs` is the control: the same scoring along the sampler's own KV-cache schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn

from t1.routing.replay import ReplayStats, replay_routing
from t1.trajectory.types import Segment


def segment_logprobs(model: nn.Module, segment: Segment, *, replay: bool, temperature: float = 1.0,
                     grad: bool = False) -> tuple[torch.Tensor, ReplayStats | None]:
    """(logprobs [loss tokens] float32, replay stats or None) of the segment's sampled tokens.

    The sampler's logprob is that of its sampling distribution; with temperature t and no top-k/top-p
    truncation that is log_softmax(logits / t).
    """
    if segment.num_tokens < 2:
        raise ValueError("a segment needs at least 2 tokens to score")
    if replay and segment.routing is None:
        raise ValueError("replay asked for a segment without routing")
    device = next(model.parameters()).device
    ids = torch.from_numpy(segment.token_ids[:-1].astype(np.int64)).to(device)[None]
    targets = torch.from_numpy(segment.token_ids[1:].astype(np.int64)).to(device)
    pos = torch.from_numpy(np.flatnonzero(segment.loss_mask[1:])).to(device)  # loss position p -> row p-1
    if segment.loss_mask[0]:
        raise ValueError("position 0 cannot be a sampled token (nothing precedes it)")
    ctx = (replay_routing(model, np.ascontiguousarray(segment.routing[:-1])[None]) if replay  # type: ignore[index]
           else nullcontext(None))
    with torch.set_grad_enabled(grad), ctx as stats:
        logits = model(input_ids=ids).logits[0]
        logp = torch.log_softmax(logits[pos].float() / temperature, dim=-1)
        out = logp.gather(1, targets[pos][:, None])[:, 0]
    return out, stats


def schedule_logprobs(model: Any, segment: Segment, turns: Sequence[tuple[int, np.ndarray]], *,
                      prefill_chunk: int = 1024) -> torch.Tensor:
    """Logprobs [loss tokens] float32 of the segment's sampled tokens, computed as a KV-cache sampler did.

    turns: (prompt length, sampled ids) per generation, in order. Per turn the new prompt ids are
    prefilled (chunks of prefill_chunk; the cache persists across turns, as a session cache does), then
    each sampled id but the last is fed as one decode step; every call replays the recorded routing.
    With the sampler's model, dtype and kernels this reproduces its behaviour logprobs (temperature 1,
    no truncation), so it separates scoring mismatches from decode-vs-full-forward numerics.
    """
    from transformers import DynamicCache

    from t1.model.forward import cache_kwargs

    if segment.routing is None:
        raise ValueError("schedule_logprobs needs a segment with routing")
    routing = segment.routing
    ids = torch.from_numpy(segment.token_ids.astype(np.int64)).to(next(model.parameters()).device)
    cache = DynamicCache(config=model.config)
    done = 0

    def forward(end: int) -> torch.Tensor:
        nonlocal done
        with torch.inference_mode(), replay_routing(model, np.ascontiguousarray(routing[done:end])[None]):
            logits = model(input_ids=ids[None, done:end], use_cache=True, logits_to_keep=1,
                           **cache_kwargs(model, cache)).logits[0, -1]
        done = end
        return logits

    out: list[torch.Tensor] = []
    for prompt_len, sampled in turns:
        if prompt_len < done or prompt_len + len(sampled) > segment.num_tokens:
            raise ValueError(f"turn at prompt length {prompt_len} does not follow position {done} within "
                             f"{segment.num_tokens} tokens")
        logits = torch.empty(0)
        for begin in range(done, prompt_len, prefill_chunk):
            logits = forward(min(begin + prefill_chunk, prompt_len))
        for j, tok in enumerate(sampled):
            out.append(torch.log_softmax(logits.float(), dim=-1)[int(tok)])
            if j < len(sampled) - 1:
                logits = forward(done + 1)
    return torch.stack(out)
