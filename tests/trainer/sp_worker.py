"""Worker of test_sequence_parallel.py, run by torchrun with 2 processes over gloo.

Every rank first computes the SP = 1 reference on the whole packed row (before Ulysses attention
is registered), then the same quantities with SP = 2 on its half of the row, activation
checkpointing on; rank 0 writes the largest differences to the JSON file named on the command line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from trainer_synth import routed_sequences, take_grads

from t1.trainer import engine as ds
from t1.trainer import models
from t1.trainer.learner import replay_metrics
from t1.trainer.packing import pack
from t1.trainer.sequence_parallel import enable, gather_actions, gather_row, shard, sum_over_group
from t1.trainer.token_stats import policy_token_stats

CPU = torch.device("cpu")
TEMPERATURE = 0.7


def sequences(num_experts: int, layers: int, top_k: int) -> list:
    """Three sequences of 12 + 6 + 21 = 39 input positions: odd, so the SP = 2 row is padded."""
    return routed_sequences(num_experts, layers, top_k, (13, 7, 22))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def main(model_dir: Path, out: Path) -> None:
    torch.set_num_threads(1)
    ds.init_distributed()
    policy, critic = models.load_policy(model_dir), models.load_critic(model_dir)
    torch.manual_seed(0)  # the same value head on every rank
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)  # a zero head would hide differences
    cfg = policy.config
    batch = pack(sequences(cfg.num_experts, cfg.num_hidden_layers, cfg.num_experts_per_tok))
    gen = torch.Generator().manual_seed(1)
    n = batch.num_actions
    g_lp, g_ent, g_v = (torch.randn(n, generator=gen) / n for _ in range(3))  # token means, as the losses are

    # SP = 1: the whole row on every rank
    with models.maybe_replay(policy, batch, True):
        ref = policy_token_stats(policy, batch, CPU, temperature=TEMPERATURE, chunk_tokens=4)
        ref_loss = (ref.logp_N * g_lp + ref.entropy_N * g_ent).sum()
        ref_loss.backward()
    ref_policy_grads = take_grads(policy)
    ref_v = models.critic_values(critic, batch, CPU).reshape(-1)[batch.action_index]
    (ref_v * g_v).sum().backward()
    ref_critic_grads = take_grads(critic)

    sp, _ = enable([policy, critic], 2, ds.world_size())
    sh = shard(batch, sp)
    # what this rank's half alone would give, attention blind to the other half (plain packed sdpa)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from t1.trainer.attention import packed_sdpa
    ulysses = ALL_ATTENTION_FUNCTIONS["t1_packed_sdpa"]
    ALL_ATTENTION_FUNCTIONS["t1_packed_sdpa"] = packed_sdpa
    with torch.no_grad(), models.maybe_replay(policy, sh.batch, True, sh.padding):
        blind_n = policy_token_stats(policy, sh.batch, CPU, temperature=TEMPERATURE, chunk_tokens=4).logp_N
    ALL_ATTENTION_FUNCTIONS["t1_packed_sdpa"] = ulysses
    blind = gather_actions(blind_n, sh, sp)

    # SP = 2: this rank's half, layers recomputed in backward (the all-to-alls run again there)
    models.checkpoint_layers(policy, True)
    models.checkpoint_layers(critic, True)
    with models.maybe_replay(policy, sh.batch, True, sh.padding) as stats:
        got = policy_token_stats(policy, sh.batch, CPU, temperature=TEMPERATURE, chunk_tokens=4)
        loss = (got.logp_N * g_lp[sh.actions] + got.entropy_N * g_ent[sh.actions]).sum()
        loss.backward()
    assert stats is not None
    policy_grads = {k: sum_over_group(g, sp) for k, g in take_grads(policy).items()}
    v_local = models.critic_values(critic, sh.batch, CPU)
    (v_local.reshape(-1)[sh.batch.action_index] * g_v[sh.actions]).sum().backward()
    critic_grads = {k: sum_over_group(g, sp) for k, g in take_grads(critic).items()}
    logp = gather_actions(got.logp_N, sh, sp)
    entropy = gather_actions(got.entropy_N, sh, sp)
    values = gather_row(v_local, sh, sp)
    ref_lp, ref_ent = ref.logp_N.detach(), ref.entropy_N.detach()
    result = {
        "row_tokens": int(batch.input_ids.shape[1]), "local_tokens": int(sh.batch.input_ids.shape[1]),
        "actions": n, "local_actions": [int(c) for c in sh.action_counts],
        "logp": float((logp - ref_lp).abs().max()), "entropy": float((entropy - ref_ent).abs().max()),
        "loss": abs(float(sum_over_group(loss.detach(), sp)) - float(ref_loss)),
        "policy_grads": max_diff(policy_grads, ref_policy_grads),
        "critic_values": float((values[0, batch.action_index] - ref_v.detach()).abs().max()),
        "critic_values_shape": list(values.shape),
        "critic_grads": max_diff(critic_grads, ref_critic_grads),
        "blind_logp": float((blind - ref_lp).abs().max()),
        "replay": replay_metrics([stats], sp),
        "replayed_rows": int(sum_over_group(torch.tensor(stats.replayed_rows), sp)),
        "fallback_rows": int(sum_over_group(torch.tensor(stats.fallback_rows), sp)),
    }
    if ds.rank() == 0:
        out.write_text(json.dumps(result))
    # Both ranks are done; leave without gloo's teardown, which can abort a rank whose peer closed its
    # connections first (pytorch/gloo#155: a barrier then the context's destruction), once seen in CI.
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
