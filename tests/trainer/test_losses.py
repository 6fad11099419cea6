"""The decoupled PPO surrogate, truncated importance weights, value loss, KL and diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from t1.trainer import losses

COEFS = losses.Coefficients(clip_eps=0.2, clip_eps_high=None, is_cap=2.0, entropy_coef=0.0, kl_coef=0.0,
                            value_clip_eps=0.2, value_coef=0.5)


def _three_tokens(**extra: torch.Tensor) -> losses.PolicyInputs:
    prox = torch.log(torch.tensor([0.2, 0.4, 0.4]))
    return losses.PolicyInputs(
        prox_logp_N=prox,
        # ratios 1.5, 0.5, 0.5 against the proximal policy
        logp_N=(prox + torch.log(torch.tensor([1.5, 0.5, 0.5]))).requires_grad_(True),
        # proximal / behaviour = 0.5, 4 (truncated to 2), 1
        behav_logp_N=prox - torch.log(torch.tensor([0.5, 4.0, 1.0])),
        advantages_N=torch.tensor([1.0, 1.0, -1.0]),
        entropy_N=extra.get("entropy_N", torch.tensor([0.5, 1.0, 1.5])),
        ref_logp_N=extra.get("ref_logp_N"),
    )


def _metric(out: losses.ObjectiveOut, name: str) -> float:
    i = losses.METRICS.index(name)
    return float(out.sums_M[i] / out.counts_M[i])


def test_ppo_loss_matches_hand_computation() -> None:
    p = _three_tokens()
    out = losses.ppo_objective(p, None, coefs=COEFS, denom=3.0)
    assert out.policy_loss is not None and out.value_loss is None
    # token 1: w 0.5 * min(1.5, 1.2) = 0.6; token 2: w 2 * min(0.5, 0.8) = 1.0; token 3: w 1 * min(-0.5, -0.8)
    assert float(out.policy_loss.detach()) == pytest.approx((-0.6 - 1.0 + 0.8) / 3, rel=1e-6)
    assert _metric(out, "policy_loss") == pytest.approx((-0.6 - 1.0 + 0.8) / 3, rel=1e-6)
    assert _metric(out, "clip_fraction") == pytest.approx(2 / 3)
    assert _metric(out, "is_truncated_fraction") == pytest.approx(1 / 3)
    assert _metric(out, "is_weight_mean") == pytest.approx((0.5 + 2.0 + 1.0) / 3, rel=1e-6)
    assert _metric(out, "entropy") == pytest.approx(1.0)
    # k3 = r - 1 - log r: (0.5 - log 1.5) + 2 * (-0.5 - log 0.5)
    k3 = (0.5 - math.log(1.5)) + 2 * (-0.5 - math.log(0.5))
    assert _metric(out, "approx_kl") == pytest.approx(k3 / 3, rel=1e-6)
    assert float(out.counts_M[losses.METRICS.index("kl_ref")]) == 0.0  # no reference: no KL metric
    out.policy_loss.backward()
    grad = p.logp_N.grad
    assert grad is not None
    # clipped tokens carry no gradient; the unclipped one: -w * A * ratio / 3 = -2 * 0.5 / 3
    assert float(grad[0]) == 0.0 and float(grad[2]) == 0.0
    assert float(grad[1]) == pytest.approx(-1 / 3, rel=1e-6)


def test_ppo_loss_asymmetric_clip_and_denominator() -> None:
    coefs = losses.Coefficients(**{**_fields(COEFS), "clip_eps_high": 0.6})
    out = losses.ppo_objective(_three_tokens(), None, coefs=coefs, denom=6.0)
    # upper clip 1.6: token 1 keeps ratio 1.5 -> -0.75; the sum is divided by the step's 6 tokens
    assert out.policy_loss is not None
    assert float(out.policy_loss.detach()) == pytest.approx((-0.75 - 1.0 + 0.8) / 6, rel=1e-6)
    assert _metric(out, "clip_fraction") == pytest.approx(1 / 3)


def _fields(c: losses.Coefficients) -> dict[str, float | None]:
    return {k: getattr(c, k) for k in c.__dataclass_fields__}


def test_entropy_bonus_and_kl_penalty_join_the_policy_loss() -> None:
    # reference probabilities 0.3, 0.3, 0.2 against the current 0.3, 0.2, 0.2: d = ref - logp
    ref = torch.log(torch.tensor([0.3, 0.3, 0.2]))
    p = _three_tokens(ref_logp_N=ref)
    coefs = losses.Coefficients(**{**_fields(COEFS), "entropy_coef": 0.1, "kl_coef": 0.5})
    out = losses.ppo_objective(p, None, coefs=coefs, denom=3.0)
    kl = [math.exp(d) - d - 1 for d in (0.0, math.log(1.5), 0.0)]
    surrogate = -0.6 - 1.0 + 0.8
    expected = (surrogate - 0.1 * (0.5 + 1.0 + 1.5) + 0.5 * sum(kl)) / 3
    assert out.policy_loss is not None
    assert float(out.policy_loss.detach()) == pytest.approx(expected, rel=1e-6)
    assert _metric(out, "kl_ref") == pytest.approx(sum(kl) / 3, rel=1e-6)
    assert _metric(out, "policy_loss") == pytest.approx(surrogate / 3, rel=1e-6)  # the surrogate alone
    entropy = torch.tensor([0.5, 1.0, 1.5], requires_grad=True)
    p = _three_tokens(ref_logp_N=ref, entropy_N=entropy)
    loss = losses.ppo_objective(p, None, coefs=coefs, denom=3.0).policy_loss
    assert loss is not None
    loss.backward()
    assert entropy.grad is not None
    torch.testing.assert_close(entropy.grad, torch.full((3,), -0.1 / 3))
    # token 2 (d = log 1.5): the KL term adds 0.5 * (1 - exp(d)) / 3 = -0.25 / 3 to the surrogate's -1/3
    assert p.logp_N.grad is not None
    assert float(p.logp_N.grad[1]) == pytest.approx(-1 / 3 - 0.25 / 3, rel=1e-6)


def test_truncated_is_weights() -> None:
    w = losses.truncated_is_weights(torch.log(torch.tensor([0.5, 0.9])), torch.log(torch.tensor([0.25, 0.1])), 3.0)
    torch.testing.assert_close(w, torch.tensor([2.0, 3.0]))


def test_clipped_value_loss() -> None:
    # V 1.0, V_old 0.5, R 1.2, eps 0.2: clipped V 0.7 -> 0.5 * max(0.04, 0.25) = 0.125
    # V 0.6, V_old 0.5, R 0: 0.5 * max(0.36, 0.25) = 0.18
    v = losses.ValueInputs(values_N=torch.tensor([1.0, 0.6]), old_values_N=torch.tensor([0.5, 0.5]),
                           returns_N=torch.tensor([1.2, 0.0]))
    out = losses.ppo_objective(None, v, coefs=COEFS, denom=4.0)
    assert out.policy_loss is None and out.value_loss is not None
    assert float(out.value_loss) == pytest.approx(0.5 * (0.125 + 0.18) / 4)  # value_coef 0.5, step of 4 tokens
    assert _metric(out, "value_loss") == pytest.approx((0.125 + 0.18) / 2)
    assert float(out.counts_M.sum()) == 2.0  # only the value metric counts
    with pytest.raises(ValueError, match="policy inputs, value inputs or both"):
        losses.ppo_objective(None, None, coefs=COEFS, denom=1.0)


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
