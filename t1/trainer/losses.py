"""The PPO actor-critic objective and its diagnostics as pure torch functions over action tokens.

Legend: N action tokens (the loss-mask tokens of a micro-batch, flattened in sequence order),
V vocabulary. Every per-token tensor is [N]; a token outside the loss mask never appears.
`denom` is the step's action-token count, so micro-batch losses sum to the step's mean.

Decoupled PPO (the behaviour policy that sampled is not the proximal policy we clip around):
  ratio     = pi_theta / pi_prox        (pi_prox: the trainer policy before this update)
  is_weight = min(pi_prox / pi_behav, C) (truncated importance weight, no gradient)
  surrogate = -is_weight * min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)
  policy    = surrogate - entropy_coef * H + kl_coef * k3(pi_theta || pi_ref)
  value     = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)

`ppo_objective` returns the two losses (policy and critic live on separate engines) and the
micro-batch's metric sums as one device tensor; the learner adds those up and reads them once
per step, so a micro-batch costs no device-to-host sync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def token_logprobs(logits_NV: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
    """log p(target) per token, computed in float32 (any leading shape)."""
    logp_NV = torch.log_softmax(logits_NV.float(), dim=-1)
    return logp_NV.gather(-1, targets_N.long().unsqueeze(-1)).squeeze(-1)


def token_entropy(logits_NV: torch.Tensor) -> torch.Tensor:
    logp_NV = torch.log_softmax(logits_NV.float(), dim=-1)
    return -(logp_NV.exp() * logp_NV).sum(-1)


def truncated_is_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_prox / pi_behav, cap), without gradient."""
    return torch.exp(prox_logp - behav_logp).clamp(max=cap).detach()


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref): exp(d) - d - 1 with d = ref - logp (>= 0)."""
    d = ref_logp.detach() - logp
    return torch.exp(d) - d - 1.0


@dataclass(frozen=True, slots=True, eq=False)
class PolicyInputs:
    """The policy side of one micro-batch: float32 [N] over its action tokens."""

    logp_N: torch.Tensor           # current policy, differentiable
    prox_logp_N: torch.Tensor      # pre-update policy
    behav_logp_N: torch.Tensor     # the sampler's
    advantages_N: torch.Tensor
    entropy_N: torch.Tensor        # current policy, differentiable
    ref_logp_N: torch.Tensor | None = None  # frozen reference; None: no KL term


@dataclass(frozen=True, slots=True, eq=False)
class ValueInputs:
    """The critic side of one micro-batch: float32 [N] over its action tokens."""

    values_N: torch.Tensor         # differentiable
    old_values_N: torch.Tensor
    returns_N: torch.Tensor


@dataclass(frozen=True, slots=True, kw_only=True)
class Coefficients:
    """The objective's hyper-parameters (RlConfig's names)."""

    clip_eps: float
    clip_eps_high: float | None
    is_cap: float
    entropy_coef: float
    kl_coef: float
    value_clip_eps: float
    value_coef: float


# Positions of the metric sums in ObjectiveOut.sums_M (each a sum over the micro-batch's tokens).
METRICS = ("policy_loss", "clip_fraction", "approx_kl", "is_weight_mean", "is_truncated_fraction", "entropy",
           "kl_ref", "value_loss")


@dataclass(frozen=True, slots=True, eq=False)
class ObjectiveOut:
    policy_loss: torch.Tensor | None   # scalar to backpropagate through the policy (None: no policy side)
    value_loss: torch.Tensor | None    # scalar to backpropagate through the critic, value_coef applied
    sums_M: torch.Tensor               # float32 [len(METRICS)], no gradient: per-token sums of the metrics
    counts_M: torch.Tensor             # float32 [len(METRICS)] on the host: tokens behind each sum (0: absent)


def ppo_objective(policy: PolicyInputs | None, value: ValueInputs | None, *, coefs: Coefficients,
                  denom: float) -> ObjectiveOut:
    """The whole PPO actor-critic objective of one micro-batch, averaged over the step's `denom` tokens."""
    if policy is not None:
        dev = policy.logp_N.device
    elif value is not None:
        dev = value.values_N.device
    else:
        raise ValueError("ppo_objective needs policy inputs, value inputs or both")
    sums = torch.zeros(len(METRICS), dtype=torch.float32, device=dev)
    counts = torch.zeros(len(METRICS), dtype=torch.float32)
    scale = 1.0 / max(denom, 1.0)
    policy_loss = value_loss = None
    if policy is not None:
        per_token, stats = _policy_terms(policy, coefs)
        policy_loss = per_token.sum() * scale
        sums[:len(stats)] = stats
        counts[:len(stats)] = float(policy.logp_N.shape[0])
        if policy.ref_logp_N is None:
            counts[METRICS.index("kl_ref")] = 0.0
    if value is not None:
        per_token_v = _value_terms(value, coefs.value_clip_eps)
        value_loss = coefs.value_coef * per_token_v.sum() * scale
        sums[METRICS.index("value_loss")] = per_token_v.detach().sum().to(dev)
        counts[METRICS.index("value_loss")] = float(value.values_N.shape[0])
    return ObjectiveOut(policy_loss, value_loss, sums, counts)


def _policy_terms(p: PolicyInputs, c: Coefficients) -> tuple[torch.Tensor, torch.Tensor]:
    """(differentiable per-token policy loss [N], metric sums [M] without gradient)."""
    high = c.clip_eps if c.clip_eps_high is None else c.clip_eps_high
    log_ratio = p.logp_N - p.prox_logp_N.detach()
    ratio = torch.exp(log_ratio)
    adv = p.advantages_N
    clipped = ratio.clamp(1.0 - c.clip_eps, 1.0 + high)
    weights = truncated_is_weights(p.prox_logp_N, p.behav_logp_N, c.is_cap)
    surrogate = -weights * torch.minimum(ratio * adv, clipped * adv)
    per_token = surrogate
    if c.entropy_coef > 0:
        per_token = per_token - c.entropy_coef * p.entropy_N
    kl = None
    if p.ref_logp_N is not None:
        kl = kl_to_reference(p.logp_N, p.ref_logp_N)
        if c.kl_coef > 0:
            per_token = per_token + c.kl_coef * kl
    with torch.no_grad():
        k3 = ratio - 1.0 - log_ratio
        stats = torch.stack([
            surrogate.sum(),
            ((ratio * adv) > (clipped * adv)).float().sum(),
            k3.sum(),
            weights.sum(),
            ((p.prox_logp_N - p.behav_logp_N) > math.log(c.is_cap)).float().sum(),
            p.entropy_N.sum(),
            kl.sum() if kl is not None else surrogate.new_zeros(()),
        ]).float()
    return per_token, stats


def _value_terms(v: ValueInputs, clip_eps: float) -> torch.Tensor:
    clipped = v.old_values_N + (v.values_N - v.old_values_N).clamp(-clip_eps, clip_eps)
    return 0.5 * torch.maximum((v.values_N - v.returns_N) ** 2, (clipped - v.returns_N) ** 2)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over masked tokens; nan when the returns have no variance."""
    v, r = values[mask].double(), returns[mask].double()
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
