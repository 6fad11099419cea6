"""TITO diagnostics: token drift in the loss region and the re-tokenization mismatch rate.

Pure functions over ids, plus the Prometheus metrics the rollout and trainer planes update:
t1_tito_drift_tokens (must stay 0), t1_tito_repaired_turns, t1_tito_template_mismatches,
t1_retokenize_mismatch_rate (what a decode-then-re-tokenize pipeline would get wrong).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import Counter

from t1.trajectory.types import Segment, Trajectory

if TYPE_CHECKING:
    from t1.tito.render import ChatRenderer

REPAIRED_TURNS = Counter("t1_tito_repaired_turns", "Turns whose end-of-turn tokens were appended by TITO repair")
TEMPLATE_MISMATCHES = Counter(
    "t1_tito_template_mismatches", "Turns where the rendered history did not match the token buffer, by cause",
    ["cause"])


def drift_tokens(trainer_ids: np.ndarray, loss_mask: np.ndarray, sampled: Sequence[tuple[int, np.ndarray]]) -> int:
    """Positions in the loss region where the trainer's input differs from what the sampler produced.

    sampled: (start position, sampled ids) per generation, as the sampler returned them. A loss
    position no generation produced counts as drift, as does a sampled id beyond the trainer's input.
    """
    trainer_ids = np.asarray(trainer_ids)
    loss_mask = np.asarray(loss_mask, bool)
    if trainer_ids.shape != loss_mask.shape:
        raise ValueError(f"trainer ids {trainer_ids.shape} and loss mask {loss_mask.shape} differ in shape")
    n = trainer_ids.shape[0]
    expected = np.full(n, -1, np.int64)
    produced = np.zeros(n, bool)
    beyond = 0
    for start, ids in sampled:
        ids = np.asarray(ids, np.int64)
        end = start + len(ids)
        beyond += max(0, end - max(start, n))
        stop = min(end, n)
        if stop > start:
            expected[start:stop] = ids[:stop - start]
            produced[start:stop] = True
    wrong = loss_mask & (~produced | (expected != trainer_ids))
    return int(wrong.sum()) + beyond


def segment_drift(segment: Segment, sampled: Sequence[tuple[int, np.ndarray]]) -> int:
    """drift_tokens for a segment used as trainer input (its ids and loss mask)."""
    return drift_tokens(segment.token_ids, segment.loss_mask, sampled)


def retokenize_changes(ids: Sequence[int], encode: Callable[[str], list[int]],
                       decode: Callable[[Sequence[int]], str]) -> int:
    """How many of `ids` a decode-then-re-tokenize round trip does not keep (by longest matching blocks)."""
    ids = list(ids)
    if not ids:
        return 0
    again = encode(decode(ids))
    if again == ids:  # the common case; the matcher below is O(n) Python work per episode
        return 0
    sm = difflib.SequenceMatcher(None, ids, again, autojunk=False)
    kept = sum(b.size for b in sm.get_matching_blocks())
    return len(ids) - kept


def retokenize_mismatch(segment: Segment, encode: Callable[[str], list[int]],
                        decode: Callable[[Sequence[int]], str]) -> tuple[int, int]:
    """(changed, sampled) over a segment's turns: each turn's sampled text re-tokenized on its own,
    as a pipeline that stores message text and re-renders it would."""
    changed = total = 0
    for t in segment.turns:
        turn_ids = segment.token_ids[t.start:t.end][segment.loss_mask[t.start:t.end]]
        changed += retokenize_changes(turn_ids.tolist(), encode, decode)
        total += len(turn_ids)
    return changed, total


def rate(changed: int, total: int) -> float:
    return 0.0 if total == 0 else changed / total


def trajectory_checks(traj: Trajectory, sampled: Sequence[tuple[int, int, np.ndarray]], renderer: ChatRenderer
                      ) -> tuple[int, int, int, int]:
    """Drift of a trajectory's segments against the sampler's record ((segment, start, ids) per generation) and
    the re-tokenization diagnostic: (drift tokens, segments with drift, re-tokenized ids changed, ids checked)."""
    drift = drifted = changed = total = 0
    # The trajectory keeps the segments with a generation (a compaction that left the context over its trigger
    # starts one that gets none): the i-th of them is the i-th segment index the record names.
    dense = {s: i for i, s in enumerate(sorted({s for s, _, _ in sampled}))}
    for i, seg in enumerate(traj.segments):
        seg_drift = segment_drift(seg, [(start, ids) for s, start, ids in sampled if dense[s] == i])
        drift, drifted = drift + seg_drift, drifted + (seg_drift > 0)
        c, t = retokenize_mismatch(seg, renderer.encode, renderer.decode)
        changed, total = changed + c, total + t
    return drift, drifted, changed, total
