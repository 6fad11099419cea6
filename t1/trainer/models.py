"""The trainer's models: the policy (a transformers causal LM with routing replay) and the critic
(its own transformer backbone with a scalar value head), plus their batched forwards.

Legend: T positions of a packed row (t1.trainer.packing), H hidden. The policy's logprobs are
computed by t1.trainer.token_stats; the critic projects every position to one value.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from t1.model.forward import enable_activation_checkpointing
from t1.routing.adapters import find_routers
from t1.routing.block import sentinel
from t1.routing.replay import ReplayStats, replay_routing
from t1.trainer.attention import note_lengths, use_packed_attention
from t1.trainer.packing import PackedBatch

VALUE_HEAD_FILE = "value_head.safetensors"
# Files of a model folder that are not weights; published folders copy them from the source.
SIDE_FILE_GLOBS = ("tokenizer*", "special_tokens_map.json", "generation_config.json", "chat_template*",
                   "vocab*", "merges.txt", "t1_model.json")


def load_policy(path: Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.config.use_cache = False
    use_packed_attention(model)
    return model


class Critic(nn.Module):
    """Transformer backbone + Linear(hidden, 1): a value for every input position."""

    def __init__(self, backbone: Any, hidden_size: int) -> None:
        super().__init__()
        self.backbone: Any = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        # No 2D attention mask: position ids that restart mark packed sequences (t1.trainer.packing).
        out = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False)
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
    use_packed_attention(backbone)
    critic = Critic(backbone, int(backbone.config.hidden_size)).to(dtype)
    head = path / VALUE_HEAD_FILE
    if head.exists():
        critic.value_head.load_state_dict(load_file(str(head)))
    return critic


def copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer and generation files from the source model folder, so a published folder loads alone."""
    for pattern in SIDE_FILE_GLOBS:
        for f in src.glob(pattern):
            if f.is_file() and not (dst / f.name).exists():
                shutil.copy2(f, dst / f.name)


@contextmanager
def maybe_replay(model: nn.Module, batch: PackedBatch, enabled: bool,
                 padding: torch.Tensor | None = None) -> Iterator[ReplayStats | None]:
    """Replay the batch's recorded routing inside the block when enabled.

    A batch without any record still runs under replay with every row marked missing, so its
    rows count as fallback: coverage is the same whatever the batching. `padding` (bool [1, T]):
    positions that are no sequence's (a sequence-parallel row's tail), live router, not counted.
    """
    routers = find_routers(model) if enabled else []
    if not routers:
        with nullcontext():
            yield None
        return
    routing = batch.routing
    if routing is None:
        rows = (1, int(batch.input_ids.shape[1]), len(routers), routers[0].top_k)
        routing = np.full(rows, sentinel(np.dtype(np.uint8)), dtype=np.uint8)
    with replay_routing(model, routing, padding_BS=padding) as stats:
        yield stats


def checkpoint_layers(model: Any, on: bool) -> None:
    """Recompute each decoder layer in backward (on) or keep its activations (off); cheap when unchanged."""
    inner: Any = getattr(model, "module", model)  # a DeepSpeed engine wraps the module
    inner = getattr(inner, "backbone", inner)  # the critic wraps a transformers backbone
    if bool(inner.is_gradient_checkpointing) == on:
        return
    if on:
        enable_activation_checkpointing(inner)
    else:
        (getattr(inner, "activation_checkpointing_disable", None) or inner.gradient_checkpointing_disable)()


def critic_values(critic: Any, batch: PackedBatch, device: torch.device) -> torch.Tensor:
    """float32 [1, T]: the critic's value at every position of the packed row."""
    position_ids = note_lengths(batch.position_ids.to(device), batch.row_lengths())
    return critic(batch.input_ids.to(device), position_ids).float()
