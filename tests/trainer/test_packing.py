"""Packed micro-batches: token-budget grouping, restarting positions, routing rows packed like the
ids, per-sequence arrays in and out; and the step's replay gauges mean what its metrics mean."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import prometheus_client
import pytest
import torch
from trainer_synth import segment, trainer_config, trajectory

from t1.trainer.attention import note_lengths, packed_sdpa, sequence_lengths
from t1.trainer.batch import TrainSequence, build_sequences
from t1.trainer.core import TrainerCore
from t1.trainer.packing import actions_of, micro_batches, pack, scatter_actions


def test_micro_batches_fill_the_token_budget() -> None:
    # longest first, first fit: 10 + 3 + 2 share a row of 16, 8 starts a second
    assert micro_batches([10, 3, 8, 2], 16) == [[0, 1, 3], [2]]
    assert micro_batches([40, 3], 16) == [[0], [1]]  # too long for the budget: alone
    lengths = list(range(1, 30))
    groups = micro_batches(lengths, 32)
    assert sorted(i for g in groups for i in g) == list(range(29))
    assert all(sum(lengths[i] for i in g) <= 32 or len(g) == 1 for g in groups)
    assert len(groups) == 14  # 435 tokens: 14 rows of at most 32 (13.6 is the floor)
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        micro_batches([1], 0)


def _seq(ids: list[int], sampled_from: int, routing: np.ndarray | None) -> TrainSequence:
    n = len(ids)
    mask = np.zeros(n, bool)
    mask[sampled_from:] = True
    return TrainSequence("t", "g", 0, np.array(ids, np.int32), np.where(mask, -0.5, np.nan).astype(np.float32),
                         mask, np.zeros(n, np.int32), routing, np.arange(n, dtype=np.float32))


def test_pack_lays_sequences_end_to_end_with_restarting_positions() -> None:
    routing = np.arange(5 * 2 * 1, dtype=np.uint8).reshape(5, 2, 1)
    a = _seq([10, 11, 12, 13, 14], 3, routing)
    b = _seq([20, 21, 22], 1, None)
    p = pack([a, b])
    assert p.input_ids.tolist() == [[10, 11, 12, 13, 20, 21]]
    assert p.targets.tolist() == [[11, 12, 13, 14, 21, 22]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    assert p.loss_mask.tolist() == [[False, False, True, True, True, True]]
    assert p.action_index.tolist() == [2, 3, 4, 5] and p.num_actions == 4
    assert p.lengths == (4, 2)
    assert p.routing is not None and p.routing.shape == (1, 6, 2, 1)
    np.testing.assert_array_equal(p.routing[0, :4], routing[:4])  # the last token's row is never an input
    assert (p.routing[0, 4:] == 255).all()  # b has no record: sentinel, the live router decides
    # per-sequence arrays -> action tokens -> per-sequence arrays
    torch.testing.assert_close(actions_of([a.rewards, b.rewards], p), torch.tensor([3.0, 4.0, 1.0, 2.0]))
    back = scatter_actions(np.array([3.0, 4.0, 1.0, 2.0], np.float32), p)
    np.testing.assert_array_equal(back[0], [0, 0, 0, 3, 4])
    np.testing.assert_array_equal(back[1], [0, 1, 2])
    assert pack([_seq([7], 1, None)]).input_ids.shape == (1, 1)  # nothing to train on: a placeholder


def test_packed_attention_finds_each_sequence_from_restarting_positions() -> None:
    assert sequence_lengths(torch.tensor([[0, 1, 2, 0, 1, 0]])) == (3, 2, 1)
    pos = torch.tensor([[0, 1, 0, 1]])
    assert sequence_lengths(note_lengths(pos, (2, 2))) == (2, 2)
    # per-sequence causal attention equals attention under the dense block-causal mask
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, generator=g) for _ in range(3))
    out, _ = packed_sdpa(
        torch.nn.Module(), q, k[:, :2], v[:, :2], None, position_ids=torch.tensor([[0, 1, 2, 0, 1, 0]])
    )
    seq = torch.tensor([0, 0, 0, 1, 1, 2])
    mask = (seq[:, None] == seq[None, :]) & torch.ones(6, 6, dtype=torch.bool).tril()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k[:, :2], v[:, :2], attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="one row"):
        sequence_lengths(torch.zeros(2, 3, dtype=torch.long))


def test_trainer_replay_gauge_is_the_steps_coverage(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Half the sequences carry routing; each is its own micro-batch, the last one without a record.
    The gauge must say what the step's metric says (1/2), not what the last forward saw. Activation
    checkpointing follows the row length."""
    core = TrainerCore(trainer_config(tmp_path / "work", tiny_model_dir, token_budget=16))
    layers, k = core.routing_spec.num_layers, core.routing_spec.top_k
    trajs = []
    for i in range(4):
        ids = [20 + i, 21, 22, 30 + i, 40 + i, 50 + i, 60, 61, 62, 63]
        routing = np.zeros((len(ids), layers, k), np.uint8) if i < 2 else None
        if routing is not None:
            routing[:, :, 1] = 1
            routing[-1] = 255
        trajs.append(trajectory(f"t{i}", "g", [segment(ids, 3, routing=routing)], reward=float(i % 2)))
    seqs, _ = build_sequences([trajs], 0, 4, "drop_attempt", process_rewards=False)
    prep = core.learner.prepare(seqs)
    coverage = prep.metrics["t1_routing_replay_coverage"]
    assert coverage == pytest.approx(0.5)
    core.learner.ppo_step(seqs, prep, update_policy=True)
    assert prometheus_client.REGISTRY.get_sample_value("t1_routing_replay_coverage") == pytest.approx(coverage)
    # rows of 9 tokens are short of the default 4096: layers keep their activations; at 8 they recompute
    assert not core.policy.module.is_gradient_checkpointing
    core.learner.checkpoint_tokens = 8
    core.learner.ppo_step(seqs, prep, update_policy=True)
    assert core.policy.module.is_gradient_checkpointing and core.critic.module.backbone.is_gradient_checkpointing
    core.close()


@pytest.mark.slow
def test_checkpointed_ppo_step_replays_recorded_experts_in_recomputation(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Recorded experts that the live router would not pick: a PPO step whose layers recompute in
    backward must update the policy exactly as one that keeps activations."""
    updated = []
    for always in (False, True):
        core = TrainerCore(trainer_config(tmp_path / f"work{always}", tiny_model_dir, lr=1e-3,
                                          extra={"trainer.activation_checkpointing": always}))
        layers, k = core.routing_spec.num_layers, core.routing_spec.top_k
        rng = np.random.default_rng(0)
        trajs = []
        for i in range(2):
            ids = [int(x) for x in rng.integers(16, 1000, size=12)]
            routing = np.stack([np.stack([rng.choice(core.routing_spec.num_experts, k, replace=False)
                                          for _ in range(layers)]) for _ in ids]).astype(np.uint8)
            routing[-1] = 255
            trajs.append(trajectory(f"t{i}", "g", [segment(ids, 5, routing=routing)], reward=float(i)))
        seqs, _ = build_sequences([trajs], 0, 4, "drop_attempt", process_rewards=False)
        core.learner.ppo_step(seqs, core.learner.prepare(seqs), update_policy=True)
        assert core.policy.module.is_gradient_checkpointing == always
        updated.append({n: p.detach().clone() for n, p in core.policy.module.named_parameters()})
        core.close()
    for name, p in updated[0].items():
        torch.testing.assert_close(updated[1][name], p, atol=1e-6, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
