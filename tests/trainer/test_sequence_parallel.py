"""Ulysses sequence parallelism: a row's slices put back together are the row (pure), and at world
size 2 over gloo, SP = 2 gives the SP = 1 logprobs, entropy, loss, critic values (1e-5) and
gradients (1e-4) on packed sequences with replayed routing and checkpointed layers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sp_worker import sequences

from t1.trainer.engine import free_port
from t1.trainer.packing import pack
from t1.trainer.sequence_parallel import SpGroup, check_size, shard

WORKER = Path(__file__).with_name("sp_worker.py")


@pytest.mark.parametrize("size", [2, 3, 4])
def test_slices_of_a_row_put_back_together_are_the_row(size: int) -> None:
    batch = pack(sequences(8, 3, 2))
    t = int(batch.input_ids.shape[1])
    shards = [shard(batch, SpGroup(size, r)) for r in range(size)]
    widths = {int(s.batch.input_ids.shape[1]) for s in shards}
    assert widths == {-(-t // size)}
    ids = torch.cat([s.batch.input_ids for s in shards], dim=1)
    pos = torch.cat([s.batch.position_ids for s in shards], dim=1)
    assert torch.equal(ids[:, :t], batch.input_ids) and torch.equal(pos[:, :t], batch.position_ids)
    # padding continues the last sequence (no new start: it is nobody's context but its own)
    assert pos[0, t:].tolist() == list(
        range(int(batch.position_ids[0, -1]) + 1, int(batch.position_ids[0, -1]) + 1 + ids.shape[1] - t)
    )
    assert not torch.cat([s.batch.loss_mask for s in shards], dim=1)[:, t:].any()
    # every action once, in order, each slice's at its own positions
    c = widths.pop()
    assert torch.equal(torch.cat([s.batch.action_index + r * c for r, s in enumerate(shards)]), batch.action_index)
    assert [s.actions for s in shards] == [slice(sum(shards[0].action_counts[:r]), sum(shards[0].action_counts[:r + 1]))
                                           for r in range(size)]
    assert sum(shards[0].action_counts) == batch.num_actions
    for s in shards:
        targets = s.batch.targets.reshape(-1)[s.batch.action_index]
        assert torch.equal(targets, batch.targets.reshape(-1)[batch.action_index][s.actions])
    assert batch.routing is not None
    routing = np.concatenate([s.batch.routing for s in shards if s.batch.routing is not None], axis=1)
    assert np.array_equal(routing[:, :t], batch.routing) and (routing[:, t:] == 255).all()
    pads = [s.padding for s in shards]
    assert sum(0 if p is None else int(p.sum()) for p in pads) == ids.shape[1] - t
    assert sum(s.batch.input_ids.shape[1] for s in shards) == sum(sum(s.batch.lengths) for s in shards)


def test_one_rank_is_the_row_itself() -> None:
    batch = pack(sequences(8, 3, 2))
    sh = shard(batch, SpGroup())
    assert sh.batch is batch and sh.padding is None and sh.actions == slice(0, batch.num_actions)


@pytest.mark.parametrize(("size", "world", "heads", "kv", "message"), [
    (2, 3, 4, 2, "does not divide the world size 3"),
    (3, 3, 4, 2, "does not divide the model's 4 attention heads"),
    (4, 4, 8, 3, "3 key-value heads"),
    (0, 2, 4, 2, "must be >= 1"),
])
def test_sizes_that_cannot_split_the_model_are_refused(size: int, world: int, heads: int, kv: int,
                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_size(size, world, heads, kv)
    check_size(2, 4, 8, 2)  # divisible everywhere: accepted


def test_sp2_over_gloo_matches_sp1(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "sp.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(WORKER), str(tiny_model_dir), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["local_tokens"] * 2 > r["row_tokens"] > r["local_tokens"]  # each rank held half the row (padded)
    assert min(r["local_actions"]) > 0 and sum(r["local_actions"]) == r["actions"]
    for key in ("logp", "entropy", "loss", "critic_values"):
        assert r[key] < 1e-5, (key, r)
    for key in ("policy_grads", "critic_grads"):
        assert r[key] < 1e-4, (key, r)
    assert r["critic_values_shape"] == [1, r["row_tokens"]]
    # a rank's half with attention blind to the other half would be far off: the all-to-all did the work
    assert r["blind_logp"] > 1e-2
    # every real (token, layer) row replayed from the record, the padding not counted as a fallback
    assert r["replay"]["t1_routing_replay_coverage"] == 1.0 and r["fallback_rows"] == 0
    assert r["replayed_rows"] == r["row_tokens"] * 3
