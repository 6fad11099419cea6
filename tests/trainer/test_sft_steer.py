"""Steered SFT: the trainer stops at the client's allowance, SFT ends on the client's word (durably), the SFT
learning rate applies to SFT steps only, minibatches cycle through shuffled epochs; the plateau rule."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from trainer_synth import segment, trainer_config, trajectory

from t1.config.loader import ConfigError
from t1.config.trainer import WarmStartConfig
from t1.coordinator.run.sft_steer import best_round, kept_round, plateaued, pooled
from t1.trainer.core import Stage, TrainerCore
from t1.trainer.models import load_policy
from t1.trainer.sft import sft_batch, sft_lr_at
from t1.trajectory.serialization import encode_trajectory


def _demos(path: Path, n: int = 3) -> Path:
    with path.open("wb") as f:
        for i in range(n):
            f.write(encode_trajectory(trajectory(f"demo{i}", "demo", [segment([11, 12, 13, 500 + i, 501, 502], 3)],
                                                 reward=1.0)))
    return path


def test_plateau_rule() -> None:
    assert not plateaued([0.0, 0.0, 0.0, 0.0], 2)        # never rose: not a plateau, SFT goes on
    assert not plateaued([0.1, 0.3, 0.5], 2)
    assert not plateaued([0.1, 0.3, 0.2, 0.4], 2)        # a new best within the window
    assert plateaued([0.1, 0.4, 0.3, 0.4], 2)            # ties are not a rise
    assert not plateaued([0.2, 0.1], 2)                  # too few points to judge
    # With a minimum gain, a rise inside the eval's noise is no new best (two learning runs' curves):
    assert plateaued([0.6, 0.65, 0.675, 0.575], 2, 0.05)  # 0.65 beat 0.6 by 2 of 40; 0.675 did not beat it
    assert plateaued([0.5, 0.45, 0.6, 0.6, 0.625], 2, 0.05)
    assert not plateaued([0.5, 0.45, 0.6, 0.6, 0.625], 2)
    assert not plateaued([0.5, 0.45, 0.6, 0.65, 0.6], 2, 0.05)


def test_pooled_rates_judge_a_round_with_the_one_before() -> None:
    assert pooled([0.2, 0.4, 0.3], 1) == [0.2, 0.4, 0.3]
    assert pooled([0.2, 0.4, 0.3], 2) == pytest.approx([0.2, 0.3, 0.35])
    # Two runs of one seed and config (40 attempts per eval). The first stopped at 750 on raw rates and kept
    # step 450's lucky 0.65 (held-out warm start 0.46, PPO's lift +0.08); pooled, SFT goes on:
    short = [0.225, 0.35, 0.65, 0.475, 0.6]
    assert plateaued(short, 2, 0.05) and kept_round(short) == 2
    assert not plateaued(pooled(short, 2), 2, 0.05)
    # the second ran to 1,050 and kept 900; pooled, it keeps 900 still and goes on to the cap
    long = [0.05, 0.225, 0.3, 0.575, 0.675, 0.7, 0.55]
    assert plateaued(long, 2, 0.05) and kept_round(long) == 5
    assert not plateaued(pooled(long, 2), 2, 0.05) and kept_round(pooled(long, 2)) == 5


def test_the_kept_round_is_the_latest_the_eval_cannot_tell_from_the_best() -> None:
    assert kept_round([0.2, 0.6, 0.5, 0.6]) == 3                     # ties: the latest
    assert kept_round([0.2, 0.6, 0.5, 0.58]) == 1                    # without a tolerance the top alone
    assert kept_round([0.2, 0.6, 0.5, 0.58], 0.05) == 3              # 0.58 is within the noise of 0.6
    assert kept_round([0.2, 0.6, 0.5, 0.54], 0.05) == 1              # 0.54 is not
    # A seed-0 run's pooled curve (40 attempts a round): it kept 900 at 0.69; 1,200's 0.65 is within 0.05
    run = [0.15, 0.24, 0.47, 0.62, 0.65, 0.69, 0.68, 0.65]
    assert kept_round(run) == 5 and kept_round(run, 0.05) == 7
    for rates in ([0.1, 0.5, 0.45, 0.46], [0.3, 0.35, 0.5, 0.52, 0.49], run):  # never before the last new best
        assert kept_round(rates, 0.05) >= best_round(rates, 0.05)


def test_sft_lr_decays_along_a_cosine_to_the_cap() -> None:
    ws = WarmStartConfig(sft_steps=1000, sft_lr=3e-3, sft_lr_final=3e-4, demos_path=Path("d.msgpack"))
    assert sft_lr_at(ws, 0) == pytest.approx(3e-3)
    assert sft_lr_at(ws, 500) == pytest.approx(1.65e-3)
    assert sft_lr_at(ws, 1000) == pytest.approx(3e-4) and sft_lr_at(ws, 1500) == pytest.approx(3e-4)
    lrs = [sft_lr_at(ws, k) for k in range(0, 1001, 50)]
    assert all(a > b for a, b in itertools.pairwise(lrs)), lrs  # type: ignore[operator]
    assert sft_lr_at(WarmStartConfig(sft_lr=3e-3), 700) == 3e-3 and sft_lr_at(WarmStartConfig(), 700) is None
    with pytest.raises(ValueError, match="sft_lr_final needs sft_lr"):
        WarmStartConfig(sft_lr_final=1e-4)
    with pytest.raises(ValueError, match="at most it"):
        WarmStartConfig(sft_lr=1e-4, sft_lr_final=1e-3)


def test_sft_batches_cover_each_epoch_once() -> None:
    demos = list(range(10))
    first = [x for step in range(5) for x in sft_batch(demos, 2, step, seed=3)]  # type: ignore[arg-type]
    assert sorted(first) == demos
    assert sft_batch(demos, 4, 7, 3) == sft_batch(demos, 4, 7, 3)  # type: ignore[arg-type]
    assert sft_batch(demos, None, 0, 3) is demos  # type: ignore[arg-type]


def test_steered_sft_waits_and_ends_durably(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-6, extra={
        "trainer.warm_start.sft_steps": 50, "trainer.warm_start.demos_path": str(_demos(tmp_path / "d.msgpack")),
        "trainer.warm_start.sft_eval_every": 2, "trainer.warm_start.sft_validation_set": "val",
        "trainer.warm_start.sft_lr": 1e-2, "trainer.warm_start.sft_batch": 2,
        "tasks.sets": {"val": {"path": str(tmp_path / "val")}},
        "trainer.warm_start.critic_warmup_steps": 1})
    core = TrainerCore(cfg)
    assert core.stage() == Stage.SFT and core.sft_waiting()  # nothing allowed yet
    core.allow_sft(2)
    nll, published = [], []
    while not core.sft_waiting():
        out = core.step(None)
        nll.append(out.state.last_metrics["sft_nll"])
        published.append(None if out.published is None else out.published.version)
    assert len(nll) == 2 and core.state.sft_steps == 2
    assert published == [None, 2], "only the round's last step publishes: the validation eval waits for it"
    # the SFT lr (1e-2), not PPO's 1e-6, moved the policy; the optimizer's own lr is back afterwards
    assert nll[1] < nll[0] - 0.05, nll
    assert core.policy.optimizer.param_groups[0]["lr"] == 1e-6
    core.allow_sft(1)  # never lowers an allowance
    assert core.sft_allowed == 2
    core.end_sft()
    assert core.stage() == Stage.CRITIC_WARMUP and core.state.policy_version == 2
    core.close()
    again = TrainerCore(cfg)  # a restart keeps SFT ended: the warm-up is next
    assert again.state.sft_ended and again.stage() == Stage.CRITIC_WARMUP
    again.close()


def test_best_and_kept_rounds() -> None:
    assert best_round([0.3, 0.5, 0.4]) == 1
    assert best_round([0.6, 0.625, 0.65], 0.05) == 2       # 0.65 beat 0.6 by the minimum gain
    assert best_round([0.6, 0.625, 0.6], 0.05) == 0        # 0.625 is inside the noise: the plateau counts from 0.6
    # the warm start: the highest rate, the latest of equals (three learning runs' curves)
    assert kept_round([0.0, 0.325, 0.375, 0.65, 0.525, 0.30]) == 3  # the over-fit run keeps its peak
    assert kept_round([0.075, 0.45, 0.55, 0.55, 0.575]) == 4         # a rise inside the noise still counts here
    assert kept_round([0.0, 0.33, 0.38, 0.625, 0.625, 0.65]) == 5
    assert kept_round([0.5, 0.5]) == 1
    for rates in ([0.1, 0.4, 0.3, 0.42], [0.6, 0.65, 0.675, 0.575], [0.5, 0.45, 0.6, 0.6, 0.625]):
        assert plateaued(rates, 2, 0.05) and kept_round(rates) >= len(rates) - 3, "inside the published window"


def _flat(core: TrainerCore) -> torch.Tensor:
    return torch.cat([t.flatten().float() for t in core.policy.module.state_dict().values()])


def test_end_sft_keeps_an_earlier_rounds_weights(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-6, extra={
        "trainer.warm_start.sft_steps": 50, "trainer.warm_start.demos_path": str(_demos(tmp_path / "d.msgpack")),
        "trainer.warm_start.sft_eval_every": 2, "trainer.warm_start.sft_validation_set": "val",
        "trainer.warm_start.sft_lr": 1e-2, "trainer.warm_start.sft_batch": 2, "trainer.keep_versions": 3,
        "tasks.sets": {"val": {"path": str(tmp_path / "val")}}, "trainer.warm_start.critic_warmup_steps": 1})
    core = TrainerCore(cfg)
    rounds = {}
    for allow in (2, 4, 6):
        core.allow_sft(allow)
        while not core.sft_waiting():
            core.step(None)
        rounds[allow] = _flat(core).clone()
    assert not torch.equal(rounds[2], rounds[6]), "SFT moved the policy between rounds"
    with pytest.raises(ValueError, match="beyond the 6 SFT steps"):
        core.end_sft(keep_step=8)
    published = core.end_sft(keep_step=2)
    assert published is not None and published.version == 7, "the restored weights are a new version"
    assert torch.equal(_flat(core), rounds[2]), "the policy is round 1's again"
    assert core.state.sft_kept_step == 2 and core.state.sft_steps == 6 and core.stage() == Stage.CRITIC_WARMUP
    served = load_policy(published.path).state_dict()
    assert torch.equal(torch.cat([t.flatten().float() for t in served.values()]), rounds[2])
    # the optimizer's master copy follows: a step from here starts at round 1's weights, not round 3's
    master = core.policy.optimizer.single_partition_of_fp32_groups[0]
    assert torch.allclose(master, torch.cat([p.detach().flatten() for p in core.policy.module.parameters()
                                             if p.requires_grad]))
    core.close()
    again = TrainerCore(cfg)  # a restart resumes the kept weights, SFT ended
    assert again.state.sft_kept_step == 2 and again.stage() == Stage.CRITIC_WARMUP
    assert torch.equal(_flat(again), rounds[2])
    again.close()


def test_a_round_no_longer_published_is_refused_by_name(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = trainer_config(tmp_path / "work", tiny_model_dir, lr=1e-6, extra={
        "trainer.warm_start.sft_steps": 50, "trainer.warm_start.demos_path": str(_demos(tmp_path / "d.msgpack")),
        "trainer.warm_start.sft_eval_every": 1, "trainer.warm_start.sft_validation_set": "val",
        "trainer.warm_start.sft_patience": 1, "trainer.keep_versions": 2,
        "tasks.sets": {"val": {"path": str(tmp_path / "val")}}})
    core = TrainerCore(cfg)
    for allow in (1, 2, 3):
        core.allow_sft(allow)
        core.step(None)
    with pytest.raises(ValueError, match=r"SFT step 1 are no longer published \(have: v2 \(step 2\), v3 \(step 3\)\)"):
        core.end_sft(keep_step=1)
    assert core.stage() == Stage.SFT, "nothing changed"
    core.close()


def test_keep_versions_must_cover_the_patience_window(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"keep_versions \(2\) must exceed warm_start.sft_patience \(2\)"):
        trainer_config(tmp_path / "work", tiny_model_dir, extra={
            "trainer.warm_start.sft_steps": 5, "trainer.warm_start.demos_path": str(tmp_path / "d.msgpack"),
            "trainer.warm_start.sft_eval_every": 1, "trainer.warm_start.sft_validation_set": "val",
            "trainer.keep_versions": 2, "tasks.sets": {"val": {"path": str(tmp_path / "val")}}})
