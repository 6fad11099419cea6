"""Checks of a generate request against the model; each error names the request field that is wrong."""

from __future__ import annotations

import math

import numpy as np

from t1.inference.types import GenerateRequest
from t1.rpc.errors import RequestError


def validate_request(request: GenerateRequest, vocab_size: int, max_context: int) -> None:
    """Raise RequestError naming the field when the request cannot be served as asked."""
    ids = request.prompt_ids
    if ids.ndim != 1:
        raise RequestError(f"prompt_ids: must be one-dimensional, got shape {list(ids.shape)}")
    if ids.size == 0:
        raise RequestError("prompt_ids: must not be empty")
    if not np.issubdtype(ids.dtype, np.integer):
        raise RequestError(f"prompt_ids: must be integer ids, got {ids.dtype}")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        pos = int(bad[0])
        raise RequestError(f"prompt_ids: id {int(ids[pos])} at position {pos} is outside the vocabulary [0, "
                           f"{vocab_size})")
    s = request.sampling
    if not math.isfinite(s.temperature) or s.temperature < 0:
        raise RequestError(f"sampling.temperature: must be a finite number >= 0, got {s.temperature}")
    if not math.isfinite(s.top_p) or not 0 <= s.top_p <= 1:
        raise RequestError(f"sampling.top_p: must be in [0, 1] (0 means 1), got {s.top_p}")
    if s.top_k < 0:
        raise RequestError(f"sampling.top_k: must be >= 0 (0 disables), got {s.top_k}")
    if s.max_tokens < 1:
        raise RequestError(f"sampling.max_tokens: must be >= 1, got {s.max_tokens}")
    if ids.size + s.max_tokens > max_context:
        raise RequestError(
            f"sampling.max_tokens: prompt of {ids.size} tokens plus max_tokens {s.max_tokens} exceeds "
            f"the context of {max_context} tokens"
        )
    for stop in s.stop_token_ids:
        if not 0 <= stop < vocab_size:
            raise RequestError(f"sampling.stop_token_ids: id {stop} is outside the vocabulary [0, {vocab_size})")
