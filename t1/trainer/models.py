"""The trainer's models: the policy (a transformers causal LM with routing replay) and the critic
(its own transformer backbone with a scalar value head), plus their batched forwards.

Legend: B sequences, T positions (inputs = token_ids[:-1]), V vocabulary, L MoE layers, K top_k.
Batches are right-padded: with causal attention and token-choice routing, padding after a
sequence changes nothing at its real positions.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from t1.routing.block import sentinel
from t1.routing.replay import ReplayStats, replay_routing
from t1.trainer.batch import TrainSequence

VALUE_HEAD_FILE = "value_head.safetensors"
# Files of a model folder that are not weights; published folders copy them from the source.
SIDE_FILE_GLOBS = ("tokenizer*", "special_tokens_map.json", "generation_config.json", "chat_template*",
                   "vocab*", "merges.txt", "t1_model.json")


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_policy(path: Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.config.use_cache = False
    return model


class Critic(nn.Module):
    """Transformer backbone + Linear(hidden, 1): a value for every input position."""

    def __init__(self, backbone: Any, hidden_size: int) -> None:
        super().__init__()
        self.backbone: Any = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden_BTH = out.last_hidden_state
        return self.value_head(hidden_BTH.to(self.value_head.weight.dtype)).squeeze(-1)


def load_critic(path: Path, dtype: torch.dtype = torch.float32) -> Critic:
    """From a policy folder (backbone weights, zero value head) or a saved critic folder (with head)."""
    from safetensors.torch import load_file
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the causal LM's lm_head is expected to be left out
    try:
        backbone = AutoModel.from_pretrained(str(path), dtype=dtype)
    finally:
        hf_logging.set_verbosity(level)
    backbone.config.use_cache = False
    critic = Critic(backbone, int(backbone.config.hidden_size)).to(dtype)
    head = path / VALUE_HEAD_FILE
    if head.exists():
        critic.value_head.load_state_dict(load_file(str(head)))
    return critic


def save_critic(critic: Critic, out_dir: Path) -> None:
    from safetensors.torch import save_file

    critic.backbone.save_pretrained(str(out_dir), safe_serialization=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in critic.value_head.state_dict().items()},
              str(out_dir / VALUE_HEAD_FILE))


def copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer and generation files from the source model folder, so a published folder loads alone."""
    for pattern in SIDE_FILE_GLOBS:
        for f in src.glob(pattern):
            if f.is_file() and not (dst / f.name).exists():
                shutil.copy2(f, dst / f.name)


@dataclass(frozen=True, slots=True, eq=False)
class PaddedBatch:
    """Right-padded model inputs and position-aligned targets for a list of sequences.

    Target position j of row b is token j+1 of sequence b; every per-token array here is [B, T]
    with T = longest sequence - 1.
    """

    input_ids: torch.Tensor      # int64 [B, T]
    attention_mask: torch.Tensor  # int64 [B, T]
    targets: torch.Tensor        # int64 [B, T]
    loss_mask: torch.Tensor      # bool [B, T]
    routing: np.ndarray | None   # [B, T, L, K], sentinel where missing or padding
    lengths: tuple[int, ...]     # real input lengths


def pad_batch(seqs: Sequence[TrainSequence]) -> PaddedBatch:
    lengths = tuple(max(s.num_tokens - 1, 0) for s in seqs)
    t = max(max(lengths), 1)
    b = len(seqs)
    ids = np.zeros((b, t), dtype=np.int64)
    targets = np.zeros((b, t), dtype=np.int64)
    attn = np.zeros((b, t), dtype=np.int64)
    mask = np.zeros((b, t), dtype=bool)
    with_routing = [s.routing for s in seqs if s.routing is not None]
    routing = None
    if with_routing:
        ref = with_routing[0]
        routing = np.full((b, t, *ref.shape[1:]), sentinel(ref.dtype), dtype=ref.dtype)
    for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
        ids[i, :n] = s.token_ids[:-1]
        targets[i, :n] = s.token_ids[1:]
        attn[i, :n] = 1
        mask[i, :n] = s.loss_mask[1:]
        if routing is not None and s.routing is not None:
            routing[i, :n] = s.routing[:-1]
    return PaddedBatch(torch.from_numpy(ids), torch.from_numpy(attn), torch.from_numpy(targets),
                       torch.from_numpy(mask), routing, lengths)


def per_position(values_BT: torch.Tensor, lengths: Sequence[int]) -> list[np.ndarray]:
    """[B, T] target-aligned values -> per-sequence arrays of length N (position 0 gets 0)."""
    out = []
    arr = values_BT.detach().float().cpu().numpy()
    for i, n in enumerate(lengths):
        full = np.zeros(n + 1, dtype=np.float32)
        full[1:] = arr[i, :n]
        out.append(full)
    return out


def to_target_aligned(arrays: Sequence[np.ndarray], shape: tuple[int, int]) -> torch.Tensor:
    """Per-sequence length-N arrays -> [B, T] target-aligned float32 (drops position 0, pads 0)."""
    out = np.zeros(shape, dtype=np.float32)
    for i, a in enumerate(arrays):
        n = min(a.shape[0] - 1, shape[1])
        out[i, :n] = np.nan_to_num(a[1:n + 1], nan=0.0)
    return torch.from_numpy(out)


@contextmanager
def maybe_replay(model: nn.Module, batch: PaddedBatch, enabled: bool) -> Iterator[ReplayStats | None]:
    """Replay the batch's recorded routing inside the block when enabled and recorded."""
    if not enabled or batch.routing is None:
        with nullcontext():
            yield None
        return
    padding = batch.attention_mask == 0
    with replay_routing(model, batch.routing, padding_BS=padding) as stats:
        yield stats


def policy_logits(model: nn.Module, batch: PaddedBatch, device: torch.device) -> torch.Tensor:
    out = model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
                use_cache=False)
    return out.logits
