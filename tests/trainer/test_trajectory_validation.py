"""Record validation: a trajectory that cannot be trained on is refused with the field named."""

from __future__ import annotations

import numpy as np
import pytest
from trainer_synth import segment, trajectory

from t1.trainer.validation import RoutingSpec, validate_trajectory
from t1.trajectory.types import EpisodeStatus, TurnSpan


def test_records_that_cannot_be_trained_on_are_named() -> None:
    bad = segment([1, 2, 3], 1)
    bad.logprobs[2] = np.nan
    with pytest.raises(ValueError, match="no behaviour logprob"):
        validate_trajectory(trajectory("t", "g", [bad], 1.0))
    with pytest.raises(ValueError, match="position 0"):
        validate_trajectory(trajectory("t", "g", [segment([1, 2], 0)], 1.0))
    with pytest.raises(ValueError, match="group_id is empty"):
        validate_trajectory(trajectory("t", "", [segment([1, 2], 1)], 1.0))


def test_routing_and_turns_that_do_not_fit_are_named() -> None:
    spec = RoutingSpec(num_layers=3, top_k=2, num_experts=8)
    ok = np.zeros((4, 3, 2), np.uint8)
    ok[-1] = 255  # the last token has no routing
    validate_trajectory(trajectory("t", "g", [segment([1, 2, 3, 4], 2, routing=ok)], 1.0), spec)
    with pytest.raises(ValueError, match="does not fit"):
        validate_trajectory(
            trajectory("t", "g", [segment([1, 2, 3, 4], 2, routing=np.zeros((4, 2, 2), np.uint8))], 1.0), spec
        )
    wrong = ok.copy()
    wrong[0, 0, 0] = 9
    with pytest.raises(ValueError, match="expert 9"):
        validate_trajectory(trajectory("t", "g", [segment([1, 2, 3, 4], 2, routing=wrong)], 1.0), spec)
    with pytest.raises(ValueError, match="no loss-mask token"):
        validate_trajectory(trajectory("t", "g", [segment([1, 2, 3, 4], 2, turns=(TurnSpan(0, 2, 1.0),))], 1.0))


def test_infra_error_records_are_accepted_whatever_they_hold() -> None:
    broken = segment([1, 2, 3], 1)
    broken.logprobs[2] = np.nan  # a crashed episode may hold anything; it only completes its group
    validate_trajectory(trajectory("t", "g", [broken], 0.0, status=EpisodeStatus.INFRA_ERROR))
