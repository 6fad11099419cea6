"""bench/copy_probe.py: which sampled tokens count as copies, and of which kind; the probe over a real model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from bench.copy_probe import INDUCTION, OTHER, copy_kinds, main
from t1.trajectory.serialization import encode_trajectory
from t1.trajectory.types import EpisodeStatus, Segment, Trajectory

#            shown: 5 6 7 (write plum to), 8 9 (out /bee)    typed: 3 6 (echo plum), 8 9 (out /bee), 6 again, 4 new
IDS = np.array([1, 5, 6, 7, 8, 9, 2, 3, 6, 8, 9, 6, 4], np.int64)
SAMPLED = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1], bool)


def test_copies_are_split_by_the_token_before_them() -> None:
    kinds = copy_kinds(IDS, SAMPLED)
    # 3 and 4 were never shown; 6 after 3 copies "plum" after another token; 8 after 6: shown after 7, not 6;
    # 9 after 8 is the induction copy; the second 6 after 9: shown after 5, typed before only after 3. Each with
    # how far back its token was last shown (6 at 2, 8 at 4, 9 at 5)
    assert kinds == {8: (OTHER, 6), 9: (OTHER, 5), 10: (INDUCTION, 5), 11: (OTHER, 9)}
    # a token typed before after the same token is the policy repeating itself, not a copy
    again = np.concatenate([IDS, [3, 6]])
    assert 14 not in copy_kinds(again, np.concatenate([SAMPLED, [True, True]]))
    assert copy_kinds(IDS, np.zeros_like(SAMPLED)) == {}


def test_the_probe_reads_a_trajectory_file_with_a_real_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    n = len(IDS)
    seg = Segment(token_ids=IDS.astype(np.int32) + 100, logprobs=np.where(SAMPLED, -1.0, np.nan).astype(np.float32),
                  loss_mask=SAMPLED, policy_versions=np.where(SAMPLED, 0, -1).astype(np.int32), routing=None)
    traj = Trajectory(id="t", task_id="task", group_id="g", attempt=0, segments=(seg, seg), reward=1.0,
                      status=EpisodeStatus.OK)
    path = tmp_path / "demos.msgpack"
    path.write_bytes(encode_trajectory(traj) * 3)
    out = tmp_path / "probe.json"
    assert main(["--weights", str(tiny_model_dir), "--trajectories", str(path), "--episodes", "2", "--stride", "1",
                 "--far-tokens", "6", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["episodes"] == 2
    assert r[INDUCTION]["tokens"] == 2 * 2 and r[OTHER]["tokens"] == 3 * 2 * 2  # per segment, two of each episode
    # 6 or more tokens back is far: the copies at 8 (6 back) and 11 (9 back); near: 9 and the induction copy
    assert (r[OTHER]["far"]["tokens"], r[OTHER]["near"]["tokens"]) == (2 * 2 * 2, 1 * 2 * 2)
    assert (r[INDUCTION]["far"]["tokens"], r[INDUCTION]["near"]["mean_p"]) == (0, r[INDUCTION]["mean_p"])
    # the one induction copy of a segment (position 10) gets the model's own probability of that token there
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(seg.token_ids[None, :n].astype(np.int64))).logits[0].float()
    expected = float(torch.softmax(logits[9], -1)[int(seg.token_ids[10])])
    assert abs(r[INDUCTION]["mean_p"] - expected) < 1e-4
    assert 0 <= r[OTHER]["share_below_half"] <= 1
    # words are decoded text (several ids may read the same): at most the 24 sampled tokens, each counted once
    assert 0 < sum(w["tokens"] for w in r["lowest_words"]) <= 6 * 2 * 2
