"""A tiny in-memory Qwen3-MoE for routing tests (8 experts, top-2, routers scaled to decided routing)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

torch.set_num_threads(1)


def tiny_qwen3_moe(seed: int = 0, dtype: torch.dtype = torch.float32, norm_topk_prob: bool = True):
    """A 2-layer Qwen3-MoE with 8 experts, top-2, float32 by default; eager attention for exact numerics."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        max_position_embeddings=512, norm_topk_prob=norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False, attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).to(dtype)
    # Random-init routers are near-uniform; scale them so routing is decided, as in a trained model.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return model.eval()
