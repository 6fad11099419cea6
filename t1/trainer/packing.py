"""Micro-batches as packed rows: the sequences of a micro-batch laid end to end in one row, with
position ids restarting at 0 for each, so no compute or memory goes to padding.

Legend: S sequences, T packed positions (the sum of the input lengths), L MoE layers, K top_k,
N action tokens (loss-mask targets, in sequence order). Sequence s occupies [start_s, start_s +
n_s) where n_s = num_tokens_s - 1 (inputs token_ids[:-1], targets token_ids[1:]).

Attention stays inside each sequence: with position ids that restart and no 2D attention mask,
transformers builds a block-causal mask (sdpa, eager) or passes the sequence boundaries to the
variable-length kernel (flash attention). Token-choice MoE routing is per token, so routing
replay needs only the recorded rows packed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from t1.routing.block import sentinel
from t1.trainer.batch import TrainSequence


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Sequence indices grouped so each group's total length fits the budget (first fit, longest first).

    A sequence longer than the budget goes alone. Every index appears exactly once; groups keep
    the longest-first order.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for g, free in enumerate(room):
            if lengths[i] <= free:
                groups[g].append(i)
                room[g] -= lengths[i]
                break
        else:
            groups.append([i])
            room.append(token_budget - lengths[i])
    return groups


@dataclass(frozen=True, slots=True, eq=False)
class PackedBatch:
    """One packed row of model inputs and position-aligned targets."""

    input_ids: torch.Tensor       # int64 [1, T]
    position_ids: torch.Tensor    # int64 [1, T], 0 at each sequence's first input
    targets: torch.Tensor         # int64 [1, T]
    loss_mask: torch.Tensor       # bool [1, T]
    action_index: torch.Tensor    # int64 [N]: positions in the row whose target is an action
    routing: np.ndarray | None    # [1, T, L, K], sentinel where a sequence has no record
    lengths: tuple[int, ...]      # input length of each sequence

    @property
    def num_actions(self) -> int:
        return int(self.action_index.shape[0])

    def row_lengths(self) -> tuple[int, ...]:
        """Lengths of the row's sequences as attention sees them (empty ones dropped; at least one)."""
        return tuple(n for n in self.lengths if n > 0) or (int(self.input_ids.shape[1]),)


def pack(seqs: Sequence[TrainSequence]) -> PackedBatch:
    """The sequences end to end in one row (an empty batch gets one unmasked placeholder token)."""
    lengths = tuple(max(s.num_tokens - 1, 0) for s in seqs)
    t = max(sum(lengths), 1)
    ids = np.zeros(t, dtype=np.int64)
    pos = np.zeros(t, dtype=np.int64)
    targets = np.zeros(t, dtype=np.int64)
    mask = np.zeros(t, dtype=bool)
    with_routing = [s.routing for s in seqs if s.routing is not None]
    routing = None
    if with_routing:
        ref = with_routing[0]
        routing = np.full((t, *ref.shape[1:]), sentinel(ref.dtype), dtype=ref.dtype)
    start = 0
    for s, n in zip(seqs, lengths, strict=True):
        end = start + n
        ids[start:end] = s.token_ids[:-1]
        pos[start:end] = np.arange(n)
        targets[start:end] = s.token_ids[1:]
        mask[start:end] = s.loss_mask[1:]
        if routing is not None and s.routing is not None:
            routing[start:end] = s.routing[:-1]
        start = end
    return PackedBatch(
        input_ids=torch.from_numpy(ids)[None], position_ids=torch.from_numpy(pos)[None],
        targets=torch.from_numpy(targets)[None], loss_mask=torch.from_numpy(mask)[None],
        action_index=torch.from_numpy(np.flatnonzero(mask).astype(np.int64)),
        routing=None if routing is None else routing[None], lengths=lengths)


def per_position(values_T: torch.Tensor, lengths: Sequence[int]) -> list[np.ndarray]:
    """Row-aligned values [1, T] or [T] -> per-sequence arrays of length N (position 0 gets 0)."""
    arr = values_T.detach().float().reshape(-1).cpu().numpy()
    out = []
    start = 0
    for n in lengths:
        full = np.zeros(n + 1, dtype=np.float32)
        full[1:] = arr[start:start + n]
        out.append(full)
        start += n
    return out


def actions_of(arrays: Sequence[np.ndarray], batch: PackedBatch) -> torch.Tensor:
    """Per-sequence length-N position arrays -> float32 [N] at the batch's action tokens."""
    row = np.zeros(int(batch.input_ids.shape[1]), dtype=np.float32)
    start = 0
    for a, n in zip(arrays, batch.lengths, strict=True):
        row[start:start + n] = np.nan_to_num(a[1:n + 1], nan=0.0)
        start += n
    return torch.from_numpy(row[batch.action_index.numpy()])


def scatter_actions(values_N: np.ndarray, batch: PackedBatch) -> list[np.ndarray]:
    """float32 [N] at the batch's action tokens -> per-sequence length-N arrays (0 off the actions)."""
    row = np.zeros(int(batch.input_ids.shape[1]), dtype=np.float32)
    row[batch.action_index.numpy()] = values_N
    return per_position(torch.from_numpy(row), batch.lengths)
