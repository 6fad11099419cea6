"""The token view of a segment: every position's id, text, role, behaviour logprob, version, routing coverage.

Roles come from the record alone (pure functions): `loss` where the loss mask is on (tokens the
sampler produced); `repaired` for the end-of-turn ids TITO appended after a turn that stopped
without them (masked context right after a turn span, equal to the end-of-turn ids, when the
turn's own last ids are not); `template` for special tokens of the chat template in context;
`prompt` for the opening context before the first sampled token; `observation` for the rest of
the context (tool output and other deltas between turns).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from t1.trajectory.types import Segment


class TokenRole(StrEnum):
    LOSS = "loss"
    REPAIRED = "repaired"
    TEMPLATE = "template"
    PROMPT = "prompt"
    OBSERVATION = "observation"


def token_roles(seg: Segment, eot_ids: Sequence[int] = (), special_ids: Collection[int] = ()) -> list[TokenRole]:
    """The role of every position of a segment (see the module docstring)."""
    n = seg.num_tokens
    ids = seg.token_ids
    mask = np.asarray(seg.loss_mask, bool)
    roles = [TokenRole.OBSERVATION] * n
    sampled = np.flatnonzero(mask)
    first_sampled = int(sampled[0]) if sampled.size else n
    specials = set(special_ids)
    for i in range(n):
        if mask[i]:
            roles[i] = TokenRole.LOSS
        elif int(ids[i]) in specials:
            roles[i] = TokenRole.TEMPLATE
        elif i < first_sampled:
            roles[i] = TokenRole.PROMPT
    eot = [int(x) for x in eot_ids]
    k = len(eot)
    if k:
        for span in seg.turns:
            own_end = ids[max(span.start, span.end - k):span.end].tolist()
            after = ids[span.end:span.end + k].tolist()
            if own_end != eot and after == eot and not mask[span.end:span.end + k].any():
                for j in range(span.end, span.end + k):
                    roles[j] = TokenRole.REPAIRED
    return roles


def routing_coverage(routing: np.ndarray | None) -> list[float]:
    """Per position: the share of layers whose routing was recorded (the sentinel marks a missing record)."""
    if routing is None or routing.size == 0:
        return []
    sentinel = np.iinfo(routing.dtype).max
    recorded = (routing != sentinel).all(axis=2)  # [N, layers]
    return recorded.mean(axis=1).astype(float).tolist()


@dataclass(frozen=True, slots=True)
class TokenCell:
    """One position as the token view draws it."""

    pos: int
    id: int
    text: str
    role: TokenRole
    logprob: float | None
    version: int
    routing: float | None  # share of layers recorded; None without routing


def token_cells(seg: Segment, decode: Callable[[int], str], eot_ids: Sequence[int] = (),
                special_ids: Collection[int] = ()) -> list[TokenCell]:
    """Every position of a segment, in order."""
    roles = token_roles(seg, eot_ids, special_ids)
    coverage: list[float | None] = list(routing_coverage(seg.routing)) or [None] * seg.num_tokens
    lp = np.asarray(seg.logprobs, np.float64)
    logprobs = [None if math.isnan(x) else x for x in lp.tolist()]
    ids = seg.token_ids.tolist()
    return [TokenCell(pos, tid, decode(tid), role, logprob, version, routing)
            for pos, (tid, role, logprob, version, routing)
            in enumerate(zip(ids, roles, logprobs, seg.policy_versions.tolist(), coverage, strict=True))]


def cells_html(cells: Sequence[TokenCell]) -> str:
    """The token view's spans, one per position (built here, not in the template: segments run to 10^5 tokens)."""
    def span(c: TokenCell) -> str:
        lp = "" if c.logprob is None else repr(c.logprob)
        r = "" if c.routing is None else repr(c.routing)
        return (f'<span class="tok role-{c.role.value}" data-p="{c.pos}" data-id="{c.id}" data-lp="{lp}" '
                f'data-v="{c.version}" data-r="{r}">{html.escape(c.text, quote=False)}</span>')

    return "".join(span(c) for c in cells)
