"""Reward placement, GAE and advantage normalisation against hand-computed values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from trainer_synth import segment, trajectory

from t1.trainer.advantages import episode_gae, gae, group_turn_advantages, normalize_advantages, place_rewards
from t1.trainer.batch import build_sequences
from t1.trajectory.types import Segment, TurnSpan


def test_gae_matches_hand_computation() -> None:
    # gamma 0.9, lambda 0.8: delta2 = 1 - 0.4 = 0.6; delta1 = 0.9*0.4 - 0.2 = 0.16;
    # delta0 = 0.9*0.2 - 0.5 = -0.32; A1 = 0.16 + 0.72*0.6 = 0.592; A0 = -0.32 + 0.72*0.592 = 0.10624
    adv, ret = gae(np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.2, 0.4]), gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, [0.10624, 0.592, 0.6], rtol=1e-6)
    np.testing.assert_allclose(ret, [0.60624, 0.792, 1.0], rtol=1e-6)


def test_gae_lambda_one_gamma_one_is_return_minus_value() -> None:
    adv, ret = gae(np.array([1.0, 0.0, 2.0]), np.array([0.3, -1.0, 0.7]), gamma=1.0, lam=1.0)
    np.testing.assert_allclose(ret, [3.0, 2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(adv, [2.7, 3.0, 1.3], rtol=1e-6)


def test_gae_does_not_bootstrap_past_the_episode_end() -> None:
    # A huge value on the last token must not leak into a "next" value: the last delta is r - V.
    adv, _ = gae(np.array([0.0, 1.0]), np.array([0.0, 100.0]), gamma=1.0, lam=1.0)
    assert adv[1] == pytest.approx(-99.0)


def test_episode_gae_skips_observation_tokens_and_chains_segments() -> None:
    seg0 = np.array([False, True, True, False, True])   # actions at 1, 2, 4 (3 is an observation)
    seg1 = np.array([False, False, True, True])          # actions at 2, 3; bootstraps from seg0's end
    rewards = [np.zeros(5, np.float32), np.array([0, 0, 0, 1.0], np.float32)]
    values = [np.full(5, 0.25, np.float32), np.full(4, 0.25, np.float32)]
    advs, rets = episode_gae([seg0, seg1], rewards, values, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(advs[0], [0, 0.75, 0.75, 0, 0.75])
    np.testing.assert_allclose(advs[1], [0, 0, 0.75, 0.75])
    np.testing.assert_allclose(rets[0][seg0], 1.0)
    # gamma < 1 discounts per action token, not per position: 5 actions -> gamma^4 at the first.
    advs, rets = episode_gae([seg0, seg1], rewards, [np.zeros(5), np.zeros(4)], gamma=0.5, lam=1.0)
    np.testing.assert_allclose(rets[0][seg0], [0.0625, 0.125, 0.25])


def test_count_reward_sits_on_the_last_action_token() -> None:
    masks = [np.array([0, 1, 1, 0], bool), np.array([0, 1, 1, 0, 0], bool)]
    r = place_rewards(masks, [(), ()], episode_reward=3.0, process_rewards=False)
    np.testing.assert_array_equal(r[0], [0, 0, 0, 0])
    np.testing.assert_array_equal(r[1], [0, 0, 3, 0, 0])


def test_process_rewards_sit_on_the_turns_that_earned_them() -> None:
    masks = [np.array([0, 1, 1, 0, 1], bool), np.array([0, 0, 1, 1], bool)]
    turns = [(TurnSpan(1, 3, 1.0), TurnSpan(4, 5, 0.0)), (TurnSpan(2, 4, 1.0),)]
    r = place_rewards(masks, turns, episode_reward=3.0, process_rewards=True)
    # turn rewards at each turn's last action; the rest of the episode reward (3 - 2) at the end
    np.testing.assert_array_equal(r[0], [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(r[1], [0, 0, 0, 2])
    assert sum(float(x.sum()) for x in r) == pytest.approx(3.0)
    # process rewards off: turn rewards are ignored, the episode reward is at the end
    r = place_rewards(masks, turns, episode_reward=3.0, process_rewards=False)
    np.testing.assert_array_equal(r[1], [0, 0, 0, 3])


def test_reward_on_a_turn_without_action_tokens_is_an_error() -> None:
    with pytest.raises(ValueError, match="no action token"):
        place_rewards([np.array([0, 0, 1], bool)], [(TurnSpan(0, 2, 1.0),)], 1.0, process_rewards=True)
    with pytest.raises(ValueError, match="outside segment"):
        place_rewards([np.array([0, 1], bool)], [(TurnSpan(0, 5, 1.0),)], 1.0, process_rewards=True)


def test_advantage_normalisation_modes() -> None:
    masks = [np.array([True, True]), np.array([True, False]), np.array([True, True])]
    advs = [np.array([1.0, 3.0]), np.array([5.0, 99.0]), np.array([2.0, 2.0])]
    groups = ["a", "a", "b"]
    none = normalize_advantages(advs, masks, groups, "none")
    np.testing.assert_array_equal(none[1], [5.0, 99.0])
    glob = normalize_advantages(advs, masks, groups, "global")
    vals = np.array([1, 3, 5, 2, 2.0])
    np.testing.assert_allclose(glob[0], (np.array([1, 3]) - vals.mean()) / vals.std(), rtol=1e-5)
    assert glob[1][1] == 0.0  # masked-out positions get no advantage
    grp = normalize_advantages(advs, masks, groups, "group")
    a = np.array([1, 3, 5.0])
    np.testing.assert_allclose(grp[0], (np.array([1, 3]) - a.mean()) / a.std(), rtol=1e-5)
    np.testing.assert_array_equal(grp[2], [0.0, 0.0])  # no spread: centred, not scaled
    cen = normalize_advantages(advs, masks, groups, "group_centered")
    centred = np.array([1 - 3, 3 - 3, 5 - 3, 0, 0.0])  # group a's mean is 3, group b's 2
    np.testing.assert_allclose(cen[0], np.array([-2, 0]) / centred.std(), rtol=1e-5)
    np.testing.assert_allclose(cen[1], [2 / centred.std(), 0.0], rtol=1e-5)
    np.testing.assert_array_equal(cen[2], [0.0, 0.0])
    small = normalize_advantages([np.array([1.0, 3.0]), np.array([2.0, 2.1])], masks[::2], ["a", "b"], "group_centered")
    assert abs(small[1]).max() < 0.1 < abs(small[0]).max()  # a group of near-equal attempts stays near 0


@pytest.mark.parametrize("mode", ["batch", "group", "group_centered"])
def test_a_trajectory_in_four_segments_weighs_as_one(mode: str) -> None:
    """Credit across compaction: one trajectory cut into 4 segments gets the advantages and returns it gets as one
    segment, action token for action token (GAE bootstraps each segment's last action from the next segment's
    first, never from 0), beside another trajectory of its group; the loss normalisation counts action tokens,
    so the number of segments a trajectory has does not change its weight."""
    rng = np.random.default_rng(3)
    n_actions = 12
    rewards = np.zeros(n_actions, np.float32)
    rewards[[3, 7, 11]] = [1.0, 0.5, 2.0]  # process rewards at three turns' last actions
    values = rng.normal(size=n_actions).astype(np.float32)
    cuts = [0, 2, 5, 9, 12]  # 4 segments of 2, 3, 4 and 3 actions; each opens with 2 prompt tokens

    def laid_out(parts: list[tuple[int, int]]) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        masks, rs, vs = [], [], []
        for a, b in parts:
            mask = np.array([False, False] + [True] * (b - a))
            masks.append(mask)
            rs.append(np.concatenate([[0, 0], rewards[a:b]]).astype(np.float32))
            vs.append(np.concatenate([[9, 9], values[a:b]]).astype(np.float32))  # prompt values are never read
        return masks, rs, vs

    whole = laid_out([(0, n_actions)])
    split = laid_out(list(itertools.pairwise(cuts)))
    other = laid_out([(0, 5)])
    other[1][0][-1] = 3.0
    for gamma, lam in ((1.0, 1.0), (0.9, 0.8)):
        a1, r1 = episode_gae(*whole, gamma=gamma, lam=lam)
        a4, r4 = episode_gae(*split, gamma=gamma, lam=lam)
        np.testing.assert_allclose(np.concatenate([a[m] for a, m in zip(a4, split[0], strict=True)]),
                                   a1[0][whole[0][0]], rtol=1e-6)
        np.testing.assert_allclose(np.concatenate([r[m] for r, m in zip(r4, split[0], strict=True)]),
                                   r1[0][whole[0][0]], rtol=1e-6)
        ao, _ = episode_gae(*other, gamma=gamma, lam=lam)
        n1 = normalize_advantages([*a1, *ao], [*whole[0], *other[0]], ["g"] * 2, mode)  # type: ignore[arg-type]
        n4 = normalize_advantages([*a4, *ao], [*split[0], *other[0]], ["g"] * 5, mode)  # type: ignore[arg-type]
        np.testing.assert_allclose(np.concatenate([a[m] for a, m in zip(n4[:4], split[0], strict=True)]),
                                   n1[0][whole[0][0]], rtol=1e-5)
        np.testing.assert_allclose(n4[4], n1[1], rtol=1e-5)  # the other trajectory's weight is unchanged too
    # the step's denominator (t1/trainer/learner.py: action tokens after position 0) is the same either way
    assert sum(int(m[1:].sum()) for m in split[0]) == sum(int(m[1:].sum()) for m in whole[0]) == n_actions


def test_the_group_turn_baseline_compares_turn_k_with_turn_k_across_segments() -> None:
    """Three episodes of one group with process rewards, by hand (gamma 1): e1's turns earn 1, 1, 0 (returns-to-go
    at their starts 2, 1, 0), e2's 1, 2 (3, 2), e3's one turn 0 (0). Each turn's baseline is the mean of the other
    episodes' returns-to-go at that turn: e1 turn 0: 2 - (3 + 0) / 2 = 0.5; turn 1: 1 - 2 = -1; turn 2: none
    reached it, 0. e2: 3 - (2 + 0) / 2 = 2, 2 - 1 = 1. e3: 0 - (2 + 3) / 2 = -2.5. A constant baseline would
    instead give e1's turns 2 - b, 1 - b, 0 - b: later is lower whatever the turn did. e1 cut into two segments
    (turn 2 in the second) gets the same advantages: turn ids run on across segments."""
    def seg(prompt: int, turns: list[tuple[int, float]]) -> Segment:
        spans, pos = [], prompt
        for length, reward in turns:
            spans.append(TurnSpan(pos, pos + length, reward))
            pos += length + 2  # each turn is followed by 2 observation tokens
        return segment(list(range(pos)), prompt, turns=tuple(spans))

    def advantages(e1: list[Segment]) -> dict[str, list[float]]:
        trajs = [trajectory("e1", "g", e1, reward=2.0), trajectory("e2", "g", [seg(2, [(2, 1.0), (1, 2.0)])], 3.0),
                 trajectory("e3", "g", [seg(2, [(2, 0.0)])], 0.0)]
        seqs, _ = build_sequences([trajs], current_version=0, max_lag=4, infra_policy="drop_group",
                                  process_rewards=True)
        # the segment builder's mask covers observation tokens too (they follow the first sampled one): keep turns
        masks = [s.loss_mask & (s.turn_ids >= 0) for s in seqs]
        advs = group_turn_advantages(masks, [s.rewards for s in seqs], [s.turn_ids for s in seqs],
                                     [s.trajectory_id for s in seqs], [s.segment for s in seqs],
                                     [s.group_id for s in seqs], gamma=1.0)
        out: dict[str, list[float]] = {}
        for s, a, m in zip(seqs, advs, masks, strict=True):
            out.setdefault(s.trajectory_id, []).extend(a[m].tolist())
        return out

    whole = advantages([seg(2, [(2, 1.0), (1, 1.0), (2, 0.0)])])
    assert whole == {"e1": [0.5, 0.5, -1.0, 0.0, 0.0], "e2": [2.0, 2.0, 1.0], "e3": [-2.5, -2.5]}
    split = advantages([seg(2, [(2, 1.0), (1, 1.0)]), seg(3, [(2, 0.0)])])
    assert split == whole
