"""Token sampling and the logprob that PPO needs: both from the distribution actually sampled from.

Legend: V = vocabulary, B = rows (sequences).

The sampling distribution of a row is softmax(logits / temperature) restricted to the top_k
tokens and then to the top_p nucleus, renormalised. The logprob returned for a sampled token is
its log-probability under exactly that distribution ("sampling" in ModelInfo.logprob_distribution),
which is the behaviour policy of the PPO importance ratio. Greedy decoding (temperature 0) samples
from a point mass; there the raw distribution's logprob (temperature 1, no truncation) is returned.

The rows of a decode batch are sampled together (sample_rows): one batched distribution per group
of rows with the same temperature, top_k and top_p, each row's noise drawn from its own generator
(the very draws sample_token makes for that row alone), one argmax and one copy to the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from t1.inference.types import SamplingParams

LOGPROB_DISTRIBUTION = "sampling"


def sampling_logprobs(logits_V: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities [..., V] (float32) of the distribution `params` samples from; -inf outside it.

    Leading dimensions are rows sampled with the same params (logits [V] or [B, V]).
    """
    logits_V = logits_V.float()
    if params.temperature <= 0:
        return torch.log_softmax(logits_V, dim=-1)
    scaled_V = logits_V / params.temperature
    vocab = scaled_V.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scaled_V, params.top_k).values[..., -1:]
        scaled_V = scaled_V.masked_fill(scaled_V < kth, float("-inf"))
    logp_V = torch.log_softmax(scaled_V, dim=-1)
    top_p = params.top_p if params.top_p > 0 else 1.0
    if top_p < 1.0:
        sorted_V, order_V = torch.sort(logp_V, descending=True)
        cum_V = sorted_V.exp().cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
        drop_sorted_V = (cum_V - sorted_V.exp()) >= top_p
        drop_sorted_V[..., 0] = False
        drop_V = torch.zeros_like(drop_sorted_V).scatter(-1, order_V, drop_sorted_V)
        logp_V = torch.log_softmax(logp_V.masked_fill(drop_V, float("-inf")), dim=-1)
    return logp_V


def _distribution_key(params: SamplingParams) -> tuple[float, int, float]:
    """Rows with equal keys sample from the same transform of their logits."""
    if params.temperature <= 0:
        return 0.0, 0, 1.0
    return params.temperature, params.top_k, params.top_p if params.top_p > 0 else 1.0


def sample_rows(logits_BV: torch.Tensor, params: Sequence[SamplingParams],
                generators: Sequence[torch.Generator]) -> list[tuple[int, float]]:
    """Sample one token per row of logits [B, V]; each row with its own params and generator.

    Returns (token id, logprob under the row's sampling distribution) per row. Generators must
    live on the logits' device (make_generator(seed, logits.device)): torch refuses a CPU
    generator for CUDA tensors, and copying logits to the CPU per token would cost a sync.
    """
    for gen in generators:
        if gen.device != logits_BV.device:
            raise ValueError(f"generator: on {gen.device}, the logits are on {logits_BV.device}; "
                             "make it with make_generator(seed, logits.device)")
    groups: dict[tuple[float, int, float], list[int]] = {}
    for row, p in enumerate(params):
        groups.setdefault(_distribution_key(p), []).append(row)
    logp_BV = torch.empty(logits_BV.shape, dtype=torch.float32, device=logits_BV.device)
    for rows in groups.values():
        index = rows[0] if len(rows) == 1 else torch.tensor(rows, device=logits_BV.device)
        logp_BV[index] = sampling_logprobs(logits_BV[index], params[rows[0]])
    # Exponential race (Gumbel-max): argmax p_i / E_i with E_i = -log U_i ~ Exp(1) samples i with
    # probability p_i. Each row draws its V uniforms from its own generator (uniform_ costs a fifth of
    # exponential_); the logs run once for the batch. Greedy rows race without noise: their mode wins.
    uniform_BV = torch.full_like(logp_BV, 0.5)
    greedy_B = torch.zeros(len(params), dtype=torch.bool)
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if p.temperature > 0:
            uniform_BV[row].uniform_(generator=gen)
        else:
            greedy_B[row] = True
    race_BV = logp_BV - torch.log(-torch.log(uniform_BV))
    if greedy_B.any():
        race_BV = torch.where(greedy_B.to(logp_BV.device)[:, None], logp_BV, race_BV)
    tokens_B = torch.argmax(race_BV, dim=-1)
    logprobs_B = logp_BV.gather(-1, tokens_B[:, None])[:, 0]
    return list(zip(tokens_B.tolist(), logprobs_B.tolist(), strict=True))


def sample_token(logits_V: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Sample one token id and return it with its logprob under the sampling distribution (sample_rows of one row)."""
    return sample_rows(logits_V[None], [params], [generator])[0]


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on `device` (the logits' device): seeded when the request has a seed, else from fresh entropy.

    The same seed gives the same tokens on the same device type; CPU and CUDA streams differ.
    """
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return gen
