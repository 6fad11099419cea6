"""Per-token logprobs and entropy of the action tokens, without a T x V logits tensor.

Legend: B rows, T positions, H hidden, V vocabulary, N action tokens, C tokens per chunk.

The policy's forward runs as usual up to its last hidden states; the output projection is then
swapped for `_chunked_head`: only the N action positions are gathered (tokens outside the loss
mask never reach the projection), and they go through projection, temperature (float32) and
log-softmax C at a time. Forward keeps only logp [N], entropy [N] and the log-normaliser [N];
backward recomputes each chunk's logits and turns them straight into the gradients of the hidden
states and of the projection weight, so peak memory is a few C x V float32 buffers whatever T is.

The swap happens inside the model's own forward call (the head module is still called), so
DeepSpeed engines, ZeRO-3 parameter gathering and routing-replay hooks see an ordinary forward.
`chunk_tokens=0` is the unchunked reference: full logits [B, T, V] and log-softmax over them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from t1.trainer import losses
from t1.trainer.attention import note_lengths
from t1.trainer.packing import PackedBatch


@dataclass(frozen=True, slots=True, eq=False)
class TokenStats:
    """float32 [N] at a batch's action tokens; differentiable when computed with grad."""

    logp_N: torch.Tensor
    entropy_N: torch.Tensor


class _ChunkedHead(torch.autograd.Function):
    """(logp [N], entropy [N]) of softmax(hidden @ W^T / temperature) at the targets, C rows at a time."""

    @staticmethod
    def forward(ctx: Any, hidden_NH: torch.Tensor, weight_VH: torch.Tensor, targets_N: torch.Tensor,
                temperature: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden_NH.shape[0]
        acc = torch.promote_types(hidden_NH.dtype, torch.float32)  # float32, or float64 in a gradcheck
        logp_N = hidden_NH.new_empty(n, dtype=acc)
        entropy_N = torch.empty_like(logp_N)
        lse_N = torch.empty_like(logp_N)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            z_CV = F.linear(hidden_NH[a:b], weight_VH).to(acc).div_(temperature)
            lse_C = torch.logsumexp(z_CV, dim=-1)
            lse_N[a:b] = lse_C
            logp_N[a:b] = z_CV.gather(-1, targets_N[a:b, None]).squeeze(-1) - lse_C
            logp_CV = z_CV.sub_(lse_C[:, None])
            entropy_N[a:b] = -torch.bmm(logp_CV.exp()[:, None, :], logp_CV[:, :, None]).reshape(-1)
            del z_CV, logp_CV  # free this chunk's C x V buffers before the next chunk allocates its own
        ctx.save_for_backward(hidden_NH, weight_VH, targets_N, lse_N, entropy_N)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logp_N, entropy_N

    @staticmethod
    def backward(ctx: Any, g_logp_N: torch.Tensor | None, g_ent_N: torch.Tensor | None) -> tuple[Any, ...]:
        hidden_NH, weight_VH, targets_N, lse_N, entropy_N = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        n = hidden_NH.shape[0]
        acc = lse_N.dtype
        g_logp_N = torch.zeros_like(lse_N) if g_logp_N is None else g_logp_N.to(acc)
        grad_h = torch.empty_like(hidden_NH) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight_VH, dtype=acc) if ctx.needs_input_grad[1] else None
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            h_CH = hidden_NH[a:b]
            logp_CV = F.linear(h_CH, weight_VH).to(acc).div_(temperature).sub_(lse_N[a:b, None])
            p_CV = logp_CV.exp()
            g_lp = g_logp_N[a:b, None]
            # d logp_t / dz = onehot_t - p;  d H / dz = -p * (log p + H)
            if g_ent_N is None:
                dz_CV = p_CV.mul_(-g_lp)
            else:  # logp_CV becomes the per-logit weight of -p in place
                dz_CV = p_CV.mul_(logp_CV.add_(entropy_N[a:b, None]).mul_(g_ent_N[a:b, None].to(acc)).add_(g_lp)).neg_()
            dz_CV.scatter_add_(-1, targets_N[a:b, None], g_lp)
            dz_CV.div_(temperature)  # z = logits / temperature
            if grad_h is not None:
                grad_h[a:b] = dz_CV.to(weight_VH.dtype) @ weight_VH
            if grad_w is not None:
                grad_w.addmm_(dz_CV.t(), h_CH.to(acc))
            del logp_CV, p_CV, dz_CV
        return grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype), None, None, None


def chunked_token_stats(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, targets_N: torch.Tensor, *,
                        temperature: float, chunk_tokens: int) -> TokenStats:
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    logp, entropy = _ChunkedHead.apply(hidden_NH, weight_VH, targets_N.long(), float(temperature), chunk_tokens)
    return TokenStats(logp, entropy)


@contextmanager
def _head_forward(head: nn.Module, forward: Callable[[torch.Tensor], Any]) -> Iterator[None]:
    """Within the block, calling `head` runs `forward` (module hooks still run around it)."""
    vars(head)["forward"] = forward  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        vars(head).pop("forward", None)


def output_head(model: Any) -> nn.Linear:
    inner = getattr(model, "module", model)  # a DeepSpeed engine wraps the module
    head = inner.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(f"chunked logprobs need a bias-free Linear output head, the model has {type(head).__name__}")
    return head


def policy_token_stats(model: Any, batch: PackedBatch, device: torch.device, *, temperature: float,
                       chunk_tokens: int) -> TokenStats:
    """Forward the packed batch through `model` (module or engine); logp and entropy at its actions."""
    index_N = batch.action_index.to(device)
    targets_N = batch.targets.reshape(-1).index_select(0, batch.action_index).to(device)
    position_ids = note_lengths(batch.position_ids.to(device), batch.row_lengths())
    inputs = dict(input_ids=batch.input_ids.to(device), position_ids=position_ids, use_cache=False)
    if chunk_tokens == 0:
        logits_BTV = model(**inputs).logits.float()
        if temperature != 1.0:
            logits_BTV = logits_BTV / temperature
        logp_T = losses.token_logprobs(logits_BTV, batch.targets.to(device)).reshape(-1)
        entropy_T = losses.token_entropy(logits_BTV).reshape(-1)
        return TokenStats(logp_T.index_select(0, index_N), entropy_T.index_select(0, index_N))
    head = output_head(model)

    def chunked(hidden_BTH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_NH = hidden_BTH.reshape(-1, hidden_BTH.shape[-1]).index_select(0, index_N)
        s = chunked_token_stats(hidden_NH, head.weight, targets_N, temperature=temperature, chunk_tokens=chunk_tokens)
        return s.logp_N, s.entropy_N

    with _head_forward(head, chunked):
        logp_N, entropy_N = model(**inputs).logits
    return TokenStats(logp_N, entropy_N)
