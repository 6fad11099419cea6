"""Routing validation and concatenation across turns."""

from __future__ import annotations

import numpy as np
import pytest

from t1.routing.block import RoutingBlock, sentinel
from t1.routing.concat import concat_arrays, concat_blocks
from t1.routing.validation import RoutingError, validate_routing


def good(n: int = 5, layers: int = 2, k: int = 2) -> np.ndarray:
    return (np.arange(n * layers * k).reshape(n, layers, k) % 8).astype(np.uint8)


def test_valid_array_reports_missing_and_zero_rows():
    arr = good()
    arr[4] = sentinel(arr.dtype)
    arr[0, 0] = 0
    report = validate_routing(arr, num_layers=2, top_k=2, num_experts=8, num_tokens=5)
    assert report.rows == 10 and report.missing_rows == 2 and report.all_zero_rows == 1
    assert report.coverage == pytest.approx(0.8)


@pytest.mark.parametrize(("arr", "kwargs", "message"), [
    (good().astype(np.int32), {}, "uint8 or uint16"),
    (good()[0], {}, "tokens, layers, top_k"),
    (good(), {"num_layers": 3}, "2 layers, expected 3"),
    (good(), {"top_k": 4}, "2 top_k, expected 4"),
    (good(), {"num_experts": 4}, "out of range for 4 experts"),
    (np.array([[[3, 3]]], np.uint8), {}, "repeats an expert"),
])
def test_hard_faults_name_what_is_wrong(arr, kwargs, message):
    with pytest.raises(RoutingError, match=message):
        validate_routing(arr, **kwargs)


def test_uint16_sentinel_rows_are_not_range_checked():
    arr = np.full((3, 1, 2), sentinel(np.dtype("<u2")), np.uint16)
    arr[0, 0] = [300, 2]
    assert validate_routing(arr, num_experts=301).missing_rows == 2


def test_blocks_concatenate_over_positions_with_sentinel_gaps_and_later_blocks_winning():
    a = RoutingBlock(0, good(4))
    b = RoutingBlock(6, good(3) + 1)
    c = RoutingBlock(3, np.full((2, 2, 2), 7, np.uint8))  # re-processed position 3 (cache evicted)
    out, overlap = concat_blocks([a, b, c], 10)
    assert out is not None and out.shape == (10, 2, 2) and overlap == 1
    assert np.array_equal(out[:3], good(4)[:3]) and (out[3:5] == 7).all()
    assert (out[5] == 255).all() and np.array_equal(out[6:9], good(3) + 1) and (out[9] == 255).all()
    assert concat_blocks([], 4) == (None, 0)


def test_concat_rejects_inconsistent_blocks():
    with pytest.raises(RoutingError, match="outside"):
        concat_blocks([RoutingBlock(3, good(4))], 5)
    with pytest.raises(RoutingError, match="first had"):
        concat_blocks([RoutingBlock(0, good(2)), RoutingBlock(2, good(2, layers=3))], 5)
    with pytest.raises(RoutingError, match="first has"):
        concat_arrays([good(2), good(2).astype(np.uint16)])
    assert concat_arrays([good(2), good(3)]).shape == (5, 2, 2)
