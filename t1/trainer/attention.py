"""Attention confined to each sequence of a packed row, for backends without a variable-length kernel.

Legend: B rows (1 when packed), Hq / Hkv query / key-value heads, T positions, D head dim.

transformers' sdpa and eager paths keep a packed row's sequences apart with a dense T x T block
mask, so attention costs (sum of lengths)^2 and the mask itself T^2 bytes. `packed_sdpa` instead
cuts the row where position ids restart and runs causal sdpa on each sequence (sum of length^2,
no mask). It is registered with transformers as the attention implementation "t1_packed_sdpa";
`use_packed_attention` switches a trainer model to it unless the model already runs a flash
kernel (those read the sequence boundaries from the position ids themselves).

The trainer's models only ever see packed rows without a 2D attention mask (t1.trainer.packing):
transformers builds no mask for this implementation, so a padding mask would be ignored.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

NAME = "t1_packed_sdpa"
# position_ids tensor -> sequence lengths: every layer (and a checkpointed layer's recomputation)
# sees the same tensor, so the boundaries are read from the device once per forward.
# (Keyed by id with a weak reference to check identity: tensors compare elementwise, not by identity.)
_LENGTHS: dict[int, tuple[weakref.ref[torch.Tensor], tuple[int, ...]]] = {}


def note_lengths(position_ids_BT: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    """Tell packed_sdpa the row's sequence lengths (known on the host), so it never reads them back."""
    key = id(position_ids_BT)
    _LENGTHS[key] = (weakref.ref(position_ids_BT, lambda _: _LENGTHS.pop(key, None)), lengths)
    return position_ids_BT


def sequence_lengths(position_ids_BT: torch.Tensor) -> tuple[int, ...]:
    """Lengths of the sequences of a packed row: a new one starts wherever the position id is 0."""
    if position_ids_BT.shape[0] != 1:
        raise ValueError(f"packed attention takes one row, got position_ids of shape {list(position_ids_BT.shape)}")
    entry = _LENGTHS.get(id(position_ids_BT))
    if entry is not None and entry[0]() is position_ids_BT:
        return entry[1]
    starts = torch.nonzero(position_ids_BT[0] == 0).reshape(-1).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = [*starts[1:], int(position_ids_BT.shape[1])]
    lengths = tuple(e - s for s, e in zip(starts, ends, strict=True))
    note_lengths(position_ids_BT, lengths)
    return lengths


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [B, Hq, T, D], k/v [B, Hkv, T, D] -> out [B, T, Hq, D]."""
    position_ids = kwargs.get("position_ids")
    if position_ids is None or query.shape[0] != 1:
        lengths: tuple[int, ...] = (int(query.shape[2]),)
    else:
        lengths = sequence_lengths(position_ids)
    gqa = key.shape[1] != query.shape[1]
    outs = []
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        outs.append(F.scaled_dot_product_attention(query[:, :, sl], key[:, :, sl], value[:, :, sl], is_causal=True,
                                                   dropout_p=dropout, scale=scaling, enable_gqa=gqa))
        start += n
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_sdpa)


def use_packed_attention(model: Any) -> None:
    """Run `model`'s attention through packed_sdpa unless it uses a flash kernel already."""
    current = str(getattr(model.config, "_attn_implementation", "") or "")
    if current.startswith("flash_attention") or current == NAME:
        return
    _register()
    model.set_attn_implementation(NAME)
