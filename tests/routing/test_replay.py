"""Replay in a transformers MoE: recorded experts selected, live gate weights, fallback, padding,
packing, gradient to the router, and the same selection under activation-checkpoint recomputation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from routing_models import tiny_qwen3_moe

from t1.model.forward import enable_activation_checkpointing
from t1.routing.block import sentinel
from t1.routing.capture import capture_routing
from t1.routing.concat import concat_arrays
from t1.routing.replay import replay_routing

L, K, E = 2, 2, 8


def record(model, ids_BS: torch.Tensor) -> np.ndarray:
    with torch.no_grad(), capture_routing(model) as cap:
        model(input_ids=ids_BS)
    b, s = ids_BS.shape
    return cap.concatenated().reshape(b, s, L, K)


def random_routing(b: int, s: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(E)[:K] for _ in range(b * s * L)]).reshape(b, s, L, K).astype(np.uint8)


def test_replaying_own_record_reproduces_the_forward_exactly(qwen3_moe):
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    rec = record(qwen3_moe, ids)
    with torch.no_grad():
        ref = qwen3_moe(input_ids=ids).logits
        with replay_routing(qwen3_moe, rec) as stats:
            out = qwen3_moe(input_ids=ids).logits
    assert torch.equal(ref, out)
    assert stats.coverage == 1.0 and stats.disagreement_rate == 0.0 and stats.replayed_rows == 2 * 12 * L


def test_forced_routing_is_selected_and_disagreement_is_measured(qwen3_moe):
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))
    live = record(qwen3_moe, ids)
    forced = random_routing(1, 16, seed=2)
    with torch.no_grad(), replay_routing(qwen3_moe, forced) as stats, capture_routing(qwen3_moe) as cap:
        qwen3_moe(input_ids=ids)
    assert np.array_equal(cap.concatenated().reshape(forced.shape), forced)
    overlap = np.mean(
        [len(set(a) & set(b)) / K for a, b in zip(live.reshape(-1, K), forced.reshape(-1, K), strict=True)]
    )
    assert stats.disagreement_rate == pytest.approx(1 - overlap)


def test_gate_weights_are_the_routers_renormalised_probabilities_at_recorded_experts(qwen3_moe):
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(3))
    forced = random_routing(1, 6, seed=4)
    gate = qwen3_moe.model.layers[0].mlp.gate
    seen = {}
    gate.register_forward_hook(lambda m, a, o: seen.update(inp=a[0], out=o))
    with torch.no_grad(), replay_routing(qwen3_moe, forced):
        qwen3_moe(input_ids=ids)
    probs = torch.softmax(seen["inp"].reshape(-1, 32) @ gate.weight.T, dim=-1)
    idx = torch.from_numpy(forced[0, :, 0].astype(np.int64))
    want = probs.gather(1, idx)
    want = want / want.sum(-1, keepdim=True)
    assert torch.equal(seen["out"][2], idx)
    torch.testing.assert_close(seen["out"][1], want, rtol=1e-6, atol=1e-7)


def test_sentinel_rows_fall_back_to_the_live_router_and_are_counted(qwen3_moe):
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(5))
    live = record(qwen3_moe, ids)
    forced = random_routing(1, 10, seed=6)
    forced[0, 3:6, 1] = sentinel(forced.dtype)
    with torch.no_grad(), replay_routing(qwen3_moe, forced) as stats, capture_routing(qwen3_moe) as cap:
        qwen3_moe(input_ids=ids)
    got = cap.concatenated().reshape(forced.shape)
    assert np.array_equal(got[0, 3:6, 1], live[0, 3:6, 1])
    keep = np.ones((1, 10, L), bool)
    keep[0, 3:6, 1] = False
    assert np.array_equal(got[keep], forced[keep])
    assert stats.fallback_rows == 3 and stats.coverage == pytest.approx(17 / 20)


def test_padding_rows_use_the_live_router_and_are_not_counted(qwen3_moe):
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(7))
    rec = record(qwen3_moe, ids)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 5:] = True
    rec[1, 5:] = sentinel(rec.dtype)
    with torch.no_grad(), replay_routing(qwen3_moe, rec, padding_BS=pad) as stats:
        qwen3_moe(input_ids=ids, attention_mask=(~pad).long())
    assert stats.fallback_rows == 0 and stats.coverage == 1.0 and stats.replayed_rows == 13 * L


def test_packed_sequences_replay_each_sequences_routing():
    model = tiny_qwen3_moe(seed=1)
    a = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(8))
    b = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(9))
    ra, rb = random_routing(1, 7, 10), random_routing(1, 5, 11)
    packed = concat_arrays([ra[0], rb[0]])[None]
    pos = torch.cat([torch.arange(7), torch.arange(5)])[None]
    with torch.no_grad(), replay_routing(model, packed), capture_routing(model) as cap:
        model(input_ids=torch.cat([a, b], dim=1), position_ids=pos)
    assert np.array_equal(cap.concatenated(), packed[0])


def test_router_gets_gradient_with_replay_and_checkpointing_replays_the_same_experts():
    def grads(checkpoint: bool):
        model = tiny_qwen3_moe(seed=2).train()
        if checkpoint:
            enable_activation_checkpointing(model, use_reentrant=False)
        ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(12))
        forced = random_routing(1, 12, seed=13)
        with replay_routing(model, forced), capture_routing(model) as cap:
            logits = model(input_ids=ids).logits
            torch.log_softmax(logits, -1)[0, :-1].gather(1, ids[0, 1:, None]).sum().backward()
        assert np.array_equal(cap.concatenated().reshape(forced.shape), forced)
        if checkpoint:
            assert len(cap.backward_calls) == 1  # recomputed in backward, with the recorded experts
            assert np.array_equal(cap.backward_calls[0].reshape(forced.shape), forced)
        return [layer.mlp.gate.weight.grad.clone() for layer in model.model.layers]

    plain, ckpt = grads(False), grads(True)
    for g, h in zip(plain, ckpt, strict=True):
        assert g.abs().sum() > 0
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-7)


def test_bad_routing_is_rejected(qwen3_moe):
    ids = torch.randint(0, 128, (1, 4))
    with pytest.raises(ValueError, match="layers x top_k"), replay_routing(qwen3_moe, np.zeros((1, 4, 3, K), np.uint8)):
        pass
    with pytest.raises(ValueError, match="out of range"), replay_routing(qwen3_moe, np.full((1, 4, L, K), 9, np.uint8)):
        pass
    with pytest.raises(ValueError, match="routed"), torch.no_grad(), replay_routing(qwen3_moe, random_routing(1, 5, 0)):
        qwen3_moe(input_ids=ids)
