"""Trainer-side logprobs of a segment's sampled tokens, with or without routing replay.

The fidelity check of TITO + R3: feed a segment's exact ids through the trainer's model in one full
forward (inputs stop before the last token, DESIGN.md), optionally replaying the recorded routing,
and compare the logprobs of the loss tokens with the sampler's behaviour logprobs.
"""

from __future__ import annotations

from contextlib import nullcontext

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
