"""Token sampling and the logprob that PPO needs: both from the distribution actually sampled from.

Legend: V = vocabulary, B = rows (sequences).

The sampling distribution of a row is softmax(logits / temperature) restricted to the top_k
tokens and then to the top_p nucleus, renormalised. The logprob returned for a sampled token is
its log-probability under exactly that distribution ("sampling" in ModelInfo.logprob_distribution),
which is the behaviour policy of the PPO importance ratio. Greedy decoding (temperature 0) samples
from a point mass; there the raw distribution's logprob (temperature 1, no truncation) is returned.
"""

from __future__ import annotations

import torch

from t1.inference.types import SamplingParams

LOGPROB_DISTRIBUTION = "sampling"


def sampling_logprobs(logits_V: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities [V] (float32) of the distribution `params` samples from; -inf outside it."""
    logits_V = logits_V.float()
    if params.temperature <= 0:
        return torch.log_softmax(logits_V, dim=-1)
    scaled_V = logits_V / params.temperature
    vocab = scaled_V.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scaled_V, params.top_k).values[-1]
        scaled_V = scaled_V.masked_fill(scaled_V < kth, float("-inf"))
    logp_V = torch.log_softmax(scaled_V, dim=-1)
    top_p = params.top_p if params.top_p > 0 else 1.0
    if top_p < 1.0:
        sorted_V, order_V = torch.sort(logp_V, descending=True)
        cum_V = sorted_V.exp().cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
        drop_sorted_V = (cum_V - sorted_V.exp()) >= top_p
        drop_sorted_V[0] = False
        drop_V = torch.zeros_like(drop_sorted_V).scatter(0, order_V, drop_sorted_V)
        logp_V = torch.log_softmax(logp_V.masked_fill(drop_V, float("-inf")), dim=-1)
    return logp_V


def sample_token(logits_V: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Sample one token id and return it with its logprob under the sampling distribution.

    The generator must live on the logits' device (make_generator(seed, logits_V.device)): torch
    refuses a CPU generator for CUDA tensors, and copying logits to the CPU per token would cost a sync.
    """
    if generator.device != logits_V.device:
        raise ValueError(f"generator: on {generator.device}, the logits are on {logits_V.device}; "
                         "make it with make_generator(seed, logits.device)")
    logp_V = sampling_logprobs(logits_V, params)
    if params.temperature <= 0:
        token = int(torch.argmax(logp_V))
    else:
        # Exponential race (Gumbel-max): argmax p_i / E_i with E_i ~ Exp(1) samples i with probability p_i.
        noise_V = torch.empty_like(logp_V).exponential_(generator=generator)
        token = int(torch.argmax(logp_V - noise_V.log()))
    return token, float(logp_V[token])


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
