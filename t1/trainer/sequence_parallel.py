"""Ulysses sequence parallelism (DeepSpeed ALST): the ranks of a sequence-parallel group share one
packed row, each holding a contiguous 1/sp of its positions.

Legend: T positions of the full row, C = ceil(T / sp) positions per rank, N action tokens of the
full row, n those of this rank's slice.

`enable` registers DeepSpeed's `UlyssesSPAttentionHF` around the models' attention
implementation (t1_packed_sdpa or a flash kernel): around attention, all-to-alls swap the
sequence shard for a head shard, so attention sees the whole row (and its position ids, from
which packed_sdpa reads the sequence boundaries) for Hq / sp heads. Everything else of the
model (embeddings, MoE layers, the chunked head) is per token and runs on the rank's C positions.
It returns the `mpu` that `deepspeed.initialize` takes: DeepSpeed then sums gradients over the
SP group and averages them over the data-parallel groups, so each rank's loss is the sum over its
slice's action tokens divided by the step's global token count, as without SP.

`shard` cuts a packed row (t1.trainer.packing) for one rank; the row is padded to sp x C with
unmasked tokens continuing the last sequence (after every real token, so causal attention keeps
them out of every real token's context) and routing replay leaves them to the live router,
uncounted. `gather_actions`, `gather_row` and `sum_over_group` put per-rank results back together.
Ranks of one SP group are consecutive (DeepSpeed's parallel_state_sp): data-parallel rank = rank // sp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import torch

from t1.routing.block import sentinel
from t1.trainer.packing import PackedBatch


@dataclass(frozen=True, slots=True)
class SpGroup:
    """This rank's place in its sequence-parallel group (size 1: no sequence parallelism)."""

    size: int = 1
    rank: int = 0
    group: Any = None  # the torch process group of the SP ranks (None when size is 1)

    @property
    def enabled(self) -> bool:
        return self.size > 1


SOLO = SpGroup()


def _attention_shape(model: Any) -> tuple[str, int, int, int]:
    inner = getattr(model, "backbone", model)  # the critic wraps a transformers backbone
    cfg = inner.config.get_text_config()
    return (str(cfg._attn_implementation), int(cfg.num_attention_heads), int(cfg.num_key_value_heads),
            int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads))


def check_size(size: int, world: int, heads: int, kv_heads: int) -> None:
    """Raise naming what is wrong when `size` cannot split a model of these heads over `world` ranks."""
    if size < 1:
        raise ValueError(f"trainer.sequence_parallel_size must be >= 1, got {size}")
    if world % size:
        raise ValueError(f"trainer.sequence_parallel_size {size} does not divide the world size {world}")
    if heads % size:
        raise ValueError(f"trainer.sequence_parallel_size {size} does not divide the model's {heads} attention heads")
    if kv_heads % size and size % kv_heads:
        raise ValueError(f"trainer.sequence_parallel_size {size} and the model's {kv_heads} key-value heads: "
                         "one must divide the other (Ulysses replicates KV heads when sp > KV heads)")


def enable(models: Sequence[Any], size: int, world: int) -> tuple[SpGroup, Any]:
    """Register Ulysses attention for `models` (same attention shape); (this rank's group, mpu for deepspeed)."""
    if size == 1:
        return SOLO, None
    shapes = {_attention_shape(m) for m in models}
    if len(shapes) != 1:
        raise ValueError(f"sequence parallelism needs one attention shape for policy and critic, got {sorted(shapes)}")
    impl, heads, kv_heads, _ = shapes.pop()
    check_size(size, world, heads, kv_heads)
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    first = getattr(models[0], "backbone", models[0])
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        first, core_attn_implementation=impl, sequence_parallel_size=size, micro_batch_size=1,
        seq_length_is_variable=True)
    return SpGroup(size, int(mpu.get_sequence_parallel_rank()), mpu.get_sequence_parallel_group()), mpu


@dataclass(frozen=True, slots=True, eq=False)
class Shard:
    """One rank's slice of a packed row: what its model forward takes, and where its actions sit."""

    batch: PackedBatch           # positions [rank x C, (rank + 1) x C) of the padded row
    actions: slice               # this slice's actions among the full row's N (action order = position order)
    padding: torch.Tensor | None  # bool [1, C]: padding positions (None when there are none)
    row_tokens: int              # T of the full row, before padding
    action_counts: tuple[int, ...]  # n of every rank of the group


def shard(batch: PackedBatch, sp: SpGroup) -> Shard:
    """This rank's slice of `batch` (the batch itself when sp is 1)."""
    t = int(batch.input_ids.shape[1])
    if not sp.enabled:
        return Shard(batch, slice(0, batch.num_actions), None, t, (batch.num_actions,))
    c = -(-t // sp.size)
    padded = c * sp.size

    def pad(x: torch.Tensor, fill: int | bool) -> torch.Tensor:
        out = torch.full((1, padded), fill, dtype=x.dtype)
        out[:, :t] = x
        return out

    last = int(batch.position_ids[0, -1])
    positions = torch.cat([batch.position_ids[0], torch.arange(last + 1, last + 1 + padded - t)])[None]
    lo, hi = sp.rank * c, (sp.rank + 1) * c
    bounds = np.searchsorted(batch.action_index.numpy(), np.arange(sp.size + 1) * c).tolist()
    routing = None
    if batch.routing is not None:
        routing = np.full((1, padded, *batch.routing.shape[2:]), sentinel(batch.routing.dtype), batch.routing.dtype)
        routing[:, :t] = batch.routing
        routing = routing[:, lo:hi]
    padding = None
    if padded > t:
        padding = (torch.arange(padded) >= t)[None, lo:hi]
    ends = np.minimum(np.cumsum(batch.lengths), hi)
    starts = np.maximum(np.cumsum((0, *batch.lengths))[:-1], lo)
    pieces = [int(e - s) for s, e in zip(starts, ends, strict=True) if e > s]
    if padded > t and hi > t:
        pieces.append(hi - max(t, lo))  # padding as its own stretch, never a sequence start
    local = PackedBatch(
        input_ids=pad(batch.input_ids, 0)[:, lo:hi], position_ids=positions[:, lo:hi],
        targets=pad(batch.targets, 0)[:, lo:hi], loss_mask=pad(batch.loss_mask, False)[:, lo:hi],
        action_index=batch.action_index[bounds[sp.rank]:bounds[sp.rank + 1]] - lo, routing=routing,
        lengths=tuple(pieces))
    counts = tuple(int(b - a) for a, b in pairwise(bounds))
    return Shard(local, slice(bounds[sp.rank], bounds[sp.rank + 1]), padding, t, counts)


def _all_gather(x: torch.Tensor, sp: SpGroup) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(sp.size)]
    torch.distributed.all_gather(parts, x.contiguous(), group=sp.group)
    return parts


def gather_actions(values_n: torch.Tensor, sh: Shard, sp: SpGroup) -> torch.Tensor:
    """[n] per rank -> [N] of the full row, in action order (no gradient)."""
    if not sp.enabled:
        return values_n
    width = max(max(sh.action_counts), 1)
    box = values_n.new_zeros(width)
    box[:values_n.shape[0]] = values_n.detach()
    parts = _all_gather(box, sp)
    return torch.cat([p[:n] for p, n in zip(parts, sh.action_counts, strict=True)])


def gather_row(values_1C: torch.Tensor, sh: Shard, sp: SpGroup) -> torch.Tensor:
    """[1, C] per rank -> [1, T] of the full row, padding dropped (no gradient)."""
    if not sp.enabled:
        return values_1C
    return torch.cat(_all_gather(values_1C.detach(), sp), dim=1)[:, :sh.row_tokens]


def sum_over_group(x: torch.Tensor, sp: SpGroup) -> torch.Tensor:
    """The sum of `x` over the SP group's ranks (x itself when sp is 1)."""
    if not sp.enabled:
        return x
    out = x.detach().clone()
    torch.distributed.all_reduce(out, group=sp.group)
    return out
