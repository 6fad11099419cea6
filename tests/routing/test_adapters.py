"""The adapter table: Mixtral, OLMoE and DeepSeek-V3 routers replay like Qwen3-MoE's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from t1.routing.adapters import find_routers
from t1.routing.capture import capture_routing
from t1.routing.replay import replay_routing

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)


def build(family: str):
    import transformers as tf

    if family == "mixtral":
        cfg = tf.MixtralConfig(num_local_experts=8, num_experts_per_tok=2, **COMMON)
        cls = tf.MixtralForCausalLM
    elif family == "olmoe":
        cfg = tf.OlmoeConfig(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, **COMMON)
        cls = tf.OlmoeForCausalLM
    else:
        cfg = tf.DeepseekV3Config(n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                  first_k_dense_replace=0, n_shared_experts=1, moe_intermediate_size=16,
                                  kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                  v_head_dim=8, routed_scaling_factor=2.5, norm_topk_prob=True,
                                  **{**COMMON, "num_key_value_heads": 4})
        cls = tf.DeepseekV3ForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():
        for r in find_routers(model):
            r.module.weight.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("family", ["mixtral", "olmoe", "deepseek_v3"])
def test_family_replays_recorded_experts_and_reproduces_its_own_forward(family):
    model = build(family)
    routers = find_routers(model)
    assert [r.adapter.family for r in routers] == [family] * 2
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture_routing(model) as cap:
        ref = model(input_ids=ids).logits
    own = cap.concatenated()[None]
    with torch.no_grad(), replay_routing(model, own):
        torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=1e-5, atol=1e-6)
    rng = np.random.default_rng(2)
    forced = np.stack([rng.permutation(8)[:2] for _ in range(9 * 2)]).reshape(1, 9, 2, 2).astype(np.uint8)
    with replay_routing(model, forced), capture_routing(model) as cap:
        logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).sum().backward()
    assert np.array_equal(cap.concatenated()[None], forced)
    assert all(r.module.weight.grad is not None and r.module.weight.grad.abs().sum() > 0 for r in routers)


def test_dense_model_is_rejected():
    import transformers as tf

    model = tf.Qwen3ForCausalLM(tf.Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    with pytest.raises(ValueError, match="no MoE router"):
        find_routers(model)
