"""The decoupled PPO surrogate, truncated importance weights, value loss, KL and diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from t1.trainer import losses


def _three_tokens() -> dict[str, torch.Tensor]:
    prox = torch.log(torch.tensor([[0.2, 0.4, 0.4]]))
    return {
        "prox": prox,
        # ratios 1.5, 0.5, 0.5 against the proximal policy
        "logp": (prox + torch.log(torch.tensor([[1.5, 0.5, 0.5]]))).requires_grad_(True),
        # proximal / behaviour = 0.5, 4 (truncated to 2), 1
        "behav": prox - torch.log(torch.tensor([[0.5, 4.0, 1.0]])),
        "adv": torch.tensor([[1.0, 1.0, -1.0]]),
        "mask": torch.tensor([[True, True, True]]),
    }


def test_ppo_loss_matches_hand_computation() -> None:
    t = _three_tokens()
    out = losses.ppo_policy_loss(t["logp"], t["prox"], t["behav"], t["adv"], t["mask"], clip_eps=0.2,
                                 clip_eps_high=None, is_cap=2.0)
    # token 1: w 0.5 * min(1.5, 1.2) = 0.6; token 2: w 2 * min(0.5, 0.8) = 1.0; token 3: w 1 * min(-0.5, -0.8)
    assert float(out.loss.detach()) == pytest.approx((-0.6 - 1.0 + 0.8) / 3, rel=1e-6)
    assert out.clip_fraction == pytest.approx(2 / 3)
    assert out.is_truncated_fraction == pytest.approx(1 / 3)
    assert out.is_weight_mean == pytest.approx((0.5 + 2.0 + 1.0) / 3, rel=1e-6)
    out.loss.backward()
    grad = t["logp"].grad[0]
    # clipped tokens carry no gradient; the unclipped one: -w * A * ratio / 3 = -2 * 0.5 / 3
    assert float(grad[0]) == 0.0 and float(grad[2]) == 0.0
    assert float(grad[1]) == pytest.approx(-1 / 3, rel=1e-6)


def test_ppo_loss_asymmetric_clip_and_denominator() -> None:
    t = _three_tokens()
    out = losses.ppo_policy_loss(t["logp"], t["prox"], t["behav"], t["adv"], t["mask"], clip_eps=0.2,
                                 clip_eps_high=0.6, is_cap=2.0, denom=6.0)
    # upper clip 1.6: token 1 keeps ratio 1.5 -> -0.75; the sum is divided by the step's 6 tokens
    assert float(out.loss.detach()) == pytest.approx((-0.75 - 1.0 + 0.8) / 6, rel=1e-6)
    assert out.clip_fraction == pytest.approx(1 / 3)


def test_masked_tokens_do_not_count() -> None:
    t = _three_tokens()
    mask = torch.tensor([[True, False, False]])
    out = losses.ppo_policy_loss(t["logp"], t["prox"], t["behav"], t["adv"], mask, 0.2, None, 2.0)
    assert float(out.loss.detach()) == pytest.approx(-0.6, rel=1e-6)


def test_truncated_is_weights() -> None:
    w = losses.truncated_is_weights(torch.log(torch.tensor([0.5, 0.9])), torch.log(torch.tensor([0.25, 0.1])), 3.0)
    torch.testing.assert_close(w, torch.tensor([2.0, 3.0]))


def test_clipped_value_loss() -> None:
    # V 1.0, V_old 0.5, R 1.2, eps 0.2: clipped V 0.7 -> 0.5 * max(0.04, 0.25)
    v = torch.tensor([[1.0, 0.6]])
    old = torch.tensor([[0.5, 0.5]])
    ret = torch.tensor([[1.2, 0.0]])
    loss = losses.value_loss(v, old, ret, torch.tensor([[True, False]]), clip_eps=0.2)
    assert float(loss) == pytest.approx(0.125)
    loss = losses.value_loss(v, old, ret, torch.tensor([[True, True]]), clip_eps=0.2)
    assert float(loss) == pytest.approx((0.125 + 0.5 * 0.36) / 2)


def test_kl_entropy_logprobs_explained_variance() -> None:
    kl = losses.kl_to_reference(torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25])))
    assert float(kl) == pytest.approx(0.5 + math.log(2) - 1, rel=1e-6)
    logits = torch.log(torch.tensor([[[0.25, 0.25, 0.5]]]))
    assert float(losses.token_entropy(logits)) == pytest.approx(-(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5)))
    assert float(losses.token_logprobs(logits, torch.tensor([[2]]))) == pytest.approx(math.log(0.5))
    r = torch.tensor([1.0, 2.0, 3.0])
    m = torch.ones(3, dtype=torch.bool)
    assert losses.explained_variance(r.clone(), r, m) == pytest.approx(1.0)
    assert losses.explained_variance(torch.zeros(3), r, m) == pytest.approx(0.0)
    assert math.isnan(losses.explained_variance(r, torch.ones(3), m))
