"""Drift and re-tokenization diagnostics."""

from __future__ import annotations

import numpy as np
import pytest
from tito_families import get_family

from t1.tito.diagnostics import (
    drift_tokens,
    rate,
    retokenize_changes,
    retokenize_mismatch,
)
from t1.trajectory.types import Segment, TurnSpan


def test_drift_is_zero_for_exact_input_and_counts_each_changed_or_foreign_loss_token():
    ids = np.array([1, 2, 3, 4, 5, 6], np.int32)
    mask = np.array([0, 0, 1, 1, 0, 1], bool)
    sampled = [(2, np.array([3, 4])), (5, np.array([6]))]
    assert drift_tokens(ids, mask, sampled) == 0
    changed = ids.copy()
    changed[3] = 9
    assert drift_tokens(changed, mask, sampled) == 1
    foreign = mask.copy()
    foreign[1] = True  # a loss position the sampler did not produce
    assert drift_tokens(ids, foreign, sampled) == 1
    assert drift_tokens(ids, mask, [*sampled, (6, np.array([7, 8]))]) == 2  # sampled beyond the input
    with pytest.raises(ValueError, match="shape"):
        drift_tokens(ids, mask[:-1], sampled)


def test_retokenize_changes_zero_for_canonical_ids_and_positive_for_split_ones():
    tok = get_family("chatml").tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    dec = lambda ids: tok.decode(list(ids), skip_special_tokens=False)  # noqa: E731
    canonical = enc("echo hello world")
    assert retokenize_changes(canonical, enc, dec) == 0
    split = [i for ch in "echo hello world" for i in enc(ch)]  # same text, one token per character
    assert len(split) > len(canonical) and retokenize_changes(split, enc, dec) > 0
    seg = Segment(
        np.array([0, *split, *canonical], np.int32),
        np.zeros(1 + len(split) + len(canonical), np.float32),
        np.array([False] + [True] * (len(split) + len(canonical))),
        np.zeros(1 + len(split) + len(canonical), np.int32),
        None,
        (TurnSpan(1, 1 + len(split)), TurnSpan(1 + len(split), 1 + len(split) + len(canonical))),
    )
    changed, total = retokenize_mismatch(seg, enc, dec)
    assert total == len(split) + len(canonical) and changed == retokenize_changes(split, enc, dec)
    assert 0 < rate(changed, total) < 1 and rate(0, 0) == 0.0
    packed_ids = np.concatenate([np.zeros(3, np.int32), seg.token_ids])
    packed_mask = np.concatenate([np.zeros(3, bool), seg.loss_mask])
    sampled = [(3 + t.start, seg.token_ids[t.start:t.end]) for t in seg.turns]  # the segment's turns, packed at 3
    assert drift_tokens(packed_ids, packed_mask, sampled) == 0
    packed_ids[5] += 1
    assert drift_tokens(packed_ids, packed_mask, sampled) == 1
