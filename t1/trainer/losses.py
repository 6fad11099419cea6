"""PPO losses and diagnostics as pure torch functions over token-aligned tensors.

Legend: B sequences, T positions, V vocabulary. `mask_BT` marks the action tokens that count.
Means are over masked tokens; `denom` lets a caller average over a whole step's tokens while
feeding it in micro-batches (pass the step's token count to every micro-batch).

Decoupled PPO (the behaviour policy that sampled is not the proximal policy we clip around):
  ratio     = pi_theta / pi_prox        (pi_prox: the trainer policy before this update)
  is_weight = min(pi_prox / pi_behav, C) (truncated importance weight, no gradient)
  loss      = -is_weight * min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, denom: float | None = None) -> torch.Tensor:
    total = (x * mask).sum()
    count = mask.sum().clamp(min=1) if denom is None else max(denom, 1.0)
    return total / count


def token_logprobs(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """log p(target) per position, computed in float32."""
    logp_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
    return logp_BTV.gather(-1, targets_BT.long().unsqueeze(-1)).squeeze(-1)


def token_entropy(logits_BTV: torch.Tensor) -> torch.Tensor:
    logp_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
    return -(logp_BTV.exp() * logp_BTV).sum(-1)


@dataclass(frozen=True, slots=True)
class PolicyLossOut:
    loss: torch.Tensor          # scalar, differentiable
    clip_fraction: float        # share of tokens whose ratio was clipped in the active direction
    approx_kl: float            # mean of (r - 1) - log r against the proximal policy (k3)
    is_weight_mean: float
    is_truncated_fraction: float


def truncated_is_weights(prox_logp: torch.Tensor, behav_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_prox / pi_behav, cap), without gradient."""
    return torch.exp(prox_logp - behav_logp).clamp(max=cap).detach()


def ppo_policy_loss(
    logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, advantages: torch.Tensor,
    mask: torch.Tensor, clip_eps: float, clip_eps_high: float | None, is_cap: float,
    denom: float | None = None,
) -> PolicyLossOut:
    """The decoupled clipped surrogate; all inputs [B, T], mask bool."""
    maskf = mask.float()
    high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = logp - prox_logp.detach()
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    raw_w = torch.exp(prox_logp - behav_logp).detach()
    weights = raw_w.clamp(max=is_cap)
    loss = masked_mean(-weights * surrogate, maskf, denom)
    with torch.no_grad():
        was_clipped = ((ratio * advantages) > (clipped * advantages)).float()
        safe_log_ratio = torch.where(mask, log_ratio, torch.zeros_like(log_ratio))
        k3 = torch.exp(safe_log_ratio) - 1.0 - safe_log_ratio
        return PolicyLossOut(
            loss=loss,
            clip_fraction=float(masked_mean(was_clipped, maskf)),
            approx_kl=float(masked_mean(k3, maskf)),
            is_weight_mean=float(masked_mean(torch.where(mask, weights, torch.zeros_like(weights)), maskf)),
            is_truncated_fraction=float(masked_mean((raw_w > is_cap).float(), maskf)),
        )


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
    clip_eps: float, denom: float | None = None,
) -> torch.Tensor:
    """0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2), masked mean."""
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return masked_mean(per_token, mask.float(), denom)


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref): exp(d) - d - 1 with d = ref - logp (>= 0)."""
    d = ref_logp.detach() - logp
    return torch.exp(d) - d - 1.0


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over masked tokens; nan when the returns have no variance."""
    v, r = values[mask].double(), returns[mask].double()
    if r.numel() < 2:
        return float("nan")
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / var_r)
